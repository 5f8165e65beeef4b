//! `datum new`: scaffolds a transform crate that builds, tests and passes its
//! own golden fixture as written.
//!
//! Owns the templates (`host/templates/new/`, embedded in the binary), the
//! checks on the crate name, the target directory and the SDK path, and the
//! writing of the files. It never overwrites anything: the directory must be
//! new or empty, each file is created with `create_new`, and on failure the
//! files already written are removed again.
//!
//! It does not own the fixture format (`json`, `golden`) nor the command line
//! (`main.rs`). The templates' fixtures are what the template modules really
//! answer, written by `datum test --bless`; the tests below read them with
//! the fixture reader, and `tests/tests/it/scaffold.rs` builds every kind and
//! runs `datum test` on it.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The kinds of transform, one per SDK attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `#[filter]`: keep or drop each change.
    Filter,
    /// `#[map]`: replace each change (or drop it).
    Map,
    /// `#[flat_map]`: turn each change into any number of changes.
    FlatMap,
    /// `#[transform]`: see the whole batch at once.
    Transform,
}

impl Kind {
    /// Every kind.
    #[cfg(test)]
    pub(crate) const ALL: [Kind; 4] = [Kind::Filter, Kind::Map, Kind::FlatMap, Kind::Transform];

    /// The SDK attribute: `filter`, `map`, `flat_map` or `transform`.
    pub(crate) fn attribute(self) -> &'static str {
        match self {
            Kind::Filter => "filter",
            Kind::Map => "map",
            Kind::FlatMap => "flat_map",
            Kind::Transform => "transform",
        }
    }

    fn template(self) -> KindTemplate {
        match self {
            Kind::Filter => KindTemplate {
                lib_rs: include_str!("../../templates/new/filter.rs"),
                input: include_str!("../../templates/new/filter.input.json"),
                expected: include_str!("../../templates/new/filter.expected.json"),
                behaviour: "it keeps every change except the rows of tables named \
                            `audit_log`, in any schema, and truncates of nothing but such \
                            tables (a truncate that names other tables too passes whole; \
                            logical messages always pass).",
            },
            Kind::Map => KindTemplate {
                lib_rs: include_str!("../../templates/new/map.rs"),
                input: include_str!("../../templates/new/map.input.json"),
                expected: include_str!("../../templates/new/map.expected.json"),
                behaviour: "it trims the whitespace around every text value of each \
                            change's new row.",
            },
            Kind::FlatMap => KindTemplate {
                lib_rs: include_str!("../../templates/new/flat_map.rs"),
                input: include_str!("../../templates/new/flat_map.input.json"),
                expected: include_str!("../../templates/new/flat_map.expected.json"),
                behaviour: "it sends every insert on twice, the second time with its \
                            `route` set to `audit`; every other change passes once.",
            },
            Kind::Transform => KindTemplate {
                lib_rs: include_str!("../../templates/new/transform.rs"),
                input: include_str!("../../templates/new/transform.input.json"),
                expected: include_str!("../../templates/new/transform.expected.json"),
                behaviour: "it passes every change on, and ends each batch with a \
                            logical message (prefix `row_counts`) that counts the \
                            batch's row changes per table.",
            },
        }
    }
}

/// What differs between the kinds.
struct KindTemplate {
    lib_rs: &'static str,
    input: &'static str,
    expected: &'static str,
    /// One sentence for the README, after "As generated, ".
    behaviour: &'static str,
}

const CARGO_TOML: &str = include_str!("../../templates/new/Cargo.toml.tmpl");
const README: &str = include_str!("../../templates/new/README.md.tmpl");
const GITIGNORE: &str = include_str!("../../templates/new/gitignore");

/// The SDK of the source tree this binary was built from; used when it still
/// exists and no `--sdk` is given.
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");

/// The command that builds the module, as printed and in the README.
pub(crate) const BUILD_COMMAND: &str = "cargo build --release --target wasm32-wasip1";

/// What to create.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The crate's name: letters, digits, `-` and `_`.
    pub name: String,
    /// The kind of transform.
    pub kind: Kind,
    /// The directory to create (or an empty one to fill).
    pub dir: PathBuf,
    /// The `guest-sdk` directory of a Datum checkout; the one this binary was
    /// built from when `None` (and no `sdk_git`).
    pub sdk: Option<PathBuf>,
    /// A git repository holding the SDK (a Datum repository), instead of a
    /// path: the crate then builds anywhere.
    pub sdk_git: Option<String>,
    /// The commit, tag or branch of `sdk_git` (its default branch if none).
    pub sdk_rev: Option<String>,
}

/// Where the crate's `datum-guest` dependency comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sdk {
    /// A directory (absolute).
    Path(PathBuf),
    /// A git repository, at a revision or its default branch.
    Git { url: String, rev: Option<String> },
}

impl Sdk {
    /// The dependency's lines in Cargo.toml, with a comment that says what
    /// it is.
    fn dependency(&self) -> String {
        let quoted = |text: &str| toml::Value::String(text.to_owned()).to_string();
        match self {
            Sdk::Path(path) => format!(
                "# Datum's guest SDK is not published on crates.io: this is a path into a\n\
                 # Datum checkout (`datum new --sdk-git URL` makes a git dependency\n\
                 # instead, which builds anywhere). Use the SDK of the `datum` you run.\n\
                 datum-guest = {{ path = {} }}",
                quoted(&path.to_string_lossy())
            ),
            Sdk::Git { url, rev } => format!(
                "# Datum's guest SDK is not published on crates.io: cargo fetches it from\n\
                 # this git repository{}. Use the SDK of the `datum` you run.\n\
                 datum-guest = {{ git = {}{} }}",
                if rev.is_some() {
                    " at this revision"
                } else {
                    "'s default branch"
                },
                quoted(url),
                rev.as_ref()
                    .map(|rev| format!(", rev = {}", quoted(rev)))
                    .unwrap_or_default()
            ),
        }
    }
}

impl fmt::Display for Sdk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sdk::Path(path) => write!(f, "at {}", path.display()),
            Sdk::Git {
                url,
                rev: Some(rev),
            } => write!(f, "from git {url} at {rev}"),
            Sdk::Git { url, rev: None } => write!(f, "from git {url}"),
        }
    }
}

/// What became of `git init` in the new crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Git {
    /// A repository was initialised.
    Initialised,
    /// The directory is inside a repository already (and not ignored by
    /// it), as `cargo new` leaves it.
    Inside,
    /// git is not installed, or failed: the message says which.
    Skipped(String),
}

/// What was created.
#[derive(Debug, Clone)]
pub(crate) struct Created {
    /// The crate's directory, as given.
    pub dir: PathBuf,
    /// The files written, each `dir` joined with its relative path.
    pub files: Vec<PathBuf>,
    /// The kind of transform.
    pub kind: Kind,
    /// The library's name: the crate's with `-` turned into `_`, and the
    /// module's file name (`target/wasm32-wasip1/release/LIB.wasm`).
    pub lib_name: String,
    /// The SDK the crate depends on.
    pub sdk: Sdk,
    /// What `git init` did.
    pub git: Git,
}

impl Created {
    /// Where the build command writes the module, relative to the crate.
    pub(crate) fn wasm_path(&self) -> String {
        format!("target/wasm32-wasip1/release/{}.wasm", self.lib_name)
    }

    /// The `datum test` command to run in the crate's directory.
    pub(crate) fn test_command(&self) -> String {
        format!("datum test {} fixtures", self.wasm_path())
    }
}

impl fmt::Display for Created {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "created {} (a #[{}] transform)",
            self.dir.display(),
            self.kind.attribute()
        )?;
        for file in &self.files {
            let relative = file.strip_prefix(&self.dir).unwrap_or(file);
            writeln!(f, "  {}", relative.display())?;
        }
        writeln!(f, "with the guest SDK {}", self.sdk)?;
        match &self.git {
            Git::Initialised => writeln!(f, "initialised a git repository (with a .gitignore)")?,
            Git::Inside => writeln!(f, "inside a git repository already: no new one made")?,
            Git::Skipped(why) => writeln!(f, "no git repository made: {why}")?,
        }
        writeln!(f)?;
        writeln!(f, "next steps:")?;
        writeln!(f, "  cd {}", shell_quote(&self.dir.to_string_lossy()))?;
        writeln!(f, "  cargo test")?;
        writeln!(f, "  {BUILD_COMMAND}")?;
        writeln!(f, "  {}", self.test_command())
    }
}

/// Why scaffolding failed; the message says what to do instead.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ScaffoldError(Reason);

#[derive(Debug, thiserror::Error)]
enum Reason {
    #[error(
        "`{name}` is not a valid crate name: {why}; use ASCII letters, digits, `-` and `_`, \
         starting with a letter or `_` (like `my-filter`)"
    )]
    BadName { name: String, why: String },
    #[error(
        "{} already exists and is not empty; give a new directory with --path, or move its \
         files away (datum new never overwrites files)",
        .0.display()
    )]
    NotEmpty(PathBuf),
    #[error(
        "{} already exists and is not a directory; give another directory with --path",
        .0.display()
    )]
    NotADirectory(PathBuf),
    #[error(
        "--sdk {}: {why}; pass the guest-sdk directory of a Datum checkout",
        path.display()
    )]
    BadSdk { path: PathBuf, why: String },
    #[error(
        "pass --sdk PATH to the guest-sdk directory of a Datum checkout, or --sdk-git URL of \
         a Datum repository (the SDK is not published on crates.io)"
    )]
    NoSdk,
    #[error("--sdk-rev needs --sdk-git: a path dependency has no revision")]
    RevWithoutGit,
    #[error(
        "the SDK path {} is not valid UTF-8, which Cargo.toml needs; pass --sdk with \
         another checkout",
        .0.display()
    )]
    NonUtf8Sdk(PathBuf),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Reason + '_ {
    move |source| Reason::Io {
        path: path.to_owned(),
        source,
    }
}

/// `datum new`: scaffolds the crate and says what to do next.
pub(crate) fn command(options: Options) -> Result<super::Outcome, super::CommandError> {
    let created = create(&options)?;
    super::say(&created.to_string());
    Ok(super::Outcome::Success)
}

/// Creates the crate: checks the name, the directory and the SDK, then
/// writes `Cargo.toml`, `.gitignore`, `README.md`, `src/lib.rs` and one
/// fixture case. Nothing is written unless every check passes.
pub(crate) fn create(options: &Options) -> Result<Created, ScaffoldError> {
    create_inner(options).map_err(ScaffoldError)
}

fn create_inner(options: &Options) -> Result<Created, Reason> {
    check_name(&options.name)?;
    let lib_name = options.name.replace('-', "_");
    let dir_exists = check_dir(&options.dir)?;
    let sdk = match (&options.sdk_git, &options.sdk_rev) {
        (Some(url), rev) => Sdk::Git {
            url: url.clone(),
            rev: rev.clone(),
        },
        (None, Some(_)) => return Err(Reason::RevWithoutGit),
        (None, None) => {
            let path = find_sdk(options.sdk.as_deref())?;
            if path.to_str().is_none() {
                return Err(Reason::NonUtf8Sdk(path));
            }
            Sdk::Path(path)
        }
    };
    let template = options.kind.template();
    let checkout = match &sdk {
        Sdk::Path(path) => path.parent(),
        Sdk::Git { .. } => None,
    };
    let fixtures_doc = checkout
        .map(|checkout| checkout.join("docs/fixtures.md"))
        .filter(|doc| doc.exists())
        .map(|doc| format!(" (in the checkout the SDK comes from: `{}`)", doc.display()))
        .unwrap_or_default();
    let render = |text: &str| {
        let out = text
            .replace("{{name}}", &options.name)
            .replace("{{lib}}", &lib_name)
            .replace("{{attribute}}", options.kind.attribute())
            .replace("{{behaviour}}", template.behaviour)
            .replace("{{fixtures_doc}}", &fixtures_doc)
            .replace("{{sdk_dependency}}", &sdk.dependency());
        debug_assert!(!out.contains("{{"), "a placeholder is left in {out}");
        out
    };
    let files: [(&str, String); 6] = [
        ("Cargo.toml", render(CARGO_TOML)),
        (".gitignore", GITIGNORE.to_owned()),
        ("README.md", render(README)),
        ("src/lib.rs", template.lib_rs.to_owned()),
        ("fixtures/example.input.json", template.input.to_owned()),
        (
            "fixtures/example.expected.json",
            template.expected.to_owned(),
        ),
    ];

    let mut writer = Writer {
        dir: &options.dir,
        created_dirs: Vec::new(),
        files: Vec::new(),
    };
    if !dir_exists {
        std::fs::create_dir_all(&options.dir).map_err(io(&options.dir))?;
        writer.created_dirs.push(options.dir.clone());
    }
    let written = files
        .iter()
        .try_for_each(|(relative, contents)| writer.write(relative, contents));
    if let Err(err) = written {
        writer.undo();
        return Err(err);
    }
    Ok(Created {
        dir: options.dir.clone(),
        files: writer.files,
        kind: options.kind,
        lib_name,
        sdk,
        git: git_init(&options.dir),
    })
}

/// `git init` in `dir`, as `cargo new` does: not when `dir` is inside a
/// repository that does not ignore it (the crate is then part of that
/// project), and never failing the scaffold (the files are written).
fn git_init(dir: &Path) -> Git {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .output()
    };
    match git(&["rev-parse", "--is-inside-work-tree"]) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Git::Skipped("git is not installed (run `git init` later)".into());
        }
        Err(err) => return Git::Skipped(format!("running git: {err}")),
        Ok(out) if out.status.success() => {
            // Inside a work tree: a new repository only where that one
            // ignores the directory (a build or scratch directory).
            let ignored = git(&["check-ignore", "-q", "."]).is_ok_and(|o| o.status.success());
            if !ignored {
                return Git::Inside;
            }
        }
        Ok(_) => {}
    }
    match git(&["init", "-q"]) {
        Ok(out) if out.status.success() => Git::Initialised,
        Ok(out) => Git::Skipped(format!(
            "`git init` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(err) => Git::Skipped(format!("running git: {err}")),
    }
}

/// Writes files under `dir`, remembering what it made so a failure can take
/// exactly that away again.
struct Writer<'a> {
    dir: &'a Path,
    created_dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

impl Writer<'_> {
    fn write(&mut self, relative: &str, contents: &str) -> Result<(), Reason> {
        let path = self.dir.join(relative);
        if let Some(parent) = path.parent()
            && !parent.exists()
        {
            std::fs::create_dir(parent).map_err(io(parent))?;
            self.created_dirs.push(parent.to_owned());
        }
        // `create_new`: a file that appeared since the directory was checked
        // is an error, never overwritten.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        self.files.push(path.clone());
        file.write_all(contents.as_bytes()).map_err(io(&path))
    }

    fn undo(&mut self) {
        for file in self.files.drain(..).rev() {
            let _ = std::fs::remove_file(file);
        }
        // Innermost first; `remove_dir` leaves a directory someone else put
        // files in.
        for dir in self.created_dirs.drain(..).rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Rust's keywords (2024 edition, reserved ones included): a library cannot
/// be named after one.
const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "static", "struct", "super", "trait", "true", "try", "type", "typeof",
    "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Library names that would clash with the standard library's crates or
/// with the SDK the crate depends on.
const TAKEN: &[&str] = &[
    "alloc",
    "core",
    "proc_macro",
    "std",
    "test",
    "datum_guest",
    "datum_guest_macros",
];

fn check_name(name: &str) -> Result<(), Reason> {
    let bad = |why: String| {
        Err(Reason::BadName {
            name: name.to_owned(),
            why,
        })
    };
    let lib = name.replace('-', "_");
    let Some(first) = name.chars().next() else {
        return bad("it is empty".into());
    };
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return bad(format!("{c:?} is not allowed in it"));
    }
    if first.is_ascii_digit() {
        return bad("it starts with a digit".into());
    }
    if first == '-' {
        return bad("it starts with `-`".into());
    }
    if !name.chars().any(|c| c.is_ascii_alphanumeric()) {
        return bad("it has no letter or digit".into());
    }
    if KEYWORDS.contains(&lib.as_str()) || lib == "Self" {
        return bad(format!("`{lib}` is a Rust keyword"));
    }
    if TAKEN.contains(&lib.as_str()) {
        return bad(format!(
            "a crate `{lib}` exists already, which it would clash with"
        ));
    }
    Ok(())
}

/// Whether the directory exists (and is empty); an error when it cannot be
/// used.
fn check_dir(dir: &Path) -> Result<bool, Reason> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
            match entries.next() {
                None => Ok(true),
                Some(_) => Err(Reason::NotEmpty(dir.to_owned())),
            }
        }
        Ok(_) => Err(Reason::NotADirectory(dir.to_owned())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(io(dir)(err)),
    }
}

/// The SDK directory to depend on, absolute.
fn find_sdk(given: Option<&Path>) -> Result<PathBuf, Reason> {
    match given {
        Some(path) => check_sdk(path).map_err(|why| Reason::BadSdk {
            path: path.to_owned(),
            why,
        }),
        // The source tree may be gone (a copied binary) or moved: then the
        // user must say where an SDK is.
        None => check_sdk(Path::new(BUILT_SDK)).map_err(|_| Reason::NoSdk),
    }
}

/// `path` canonicalized if it is the `datum-guest` package's directory (or
/// its `Cargo.toml`); else why not.
fn check_sdk(path: &Path) -> Result<PathBuf, String> {
    let dir = if path.file_name().is_some_and(|f| f == "Cargo.toml") && path.is_file() {
        path.parent().unwrap_or(Path::new("."))
    } else {
        path
    };
    if !dir.exists() {
        return Err("it does not exist".into());
    }
    let manifest = dir.join("Cargo.toml");
    let text = match std::fs::read_to_string(&manifest) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err("it has no Cargo.toml".into());
        }
        Err(err) => return Err(format!("reading {}: {err}", manifest.display())),
    };
    let doc: toml::Table = text
        .parse()
        .map_err(|err| format!("{} does not parse: {err}", manifest.display()))?;
    match doc
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
    {
        Some("datum-guest") => {}
        Some(other) => {
            return Err(format!(
                "its Cargo.toml is package `{other}`, not `datum-guest`"
            ));
        }
        None => return Err("its Cargo.toml has no package name".into()),
    }
    std::fs::canonicalize(dir).map_err(|err| format!("resolving it: {err}"))
}

/// `text` as one shell word: as it is when that is safe, else single-quoted.
fn shell_quote(text: &str) -> Cow<'_, str> {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./+:@%=,".contains(c));
    if plain {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("'{}'", text.replace('\'', r"'\''")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::json;
    use crate::golden::Expected;
    use crate::golden::fixture::ReadBatch;

    fn scratch(what: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("datum-scaffold-unit-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn options(dir: &Path, kind: Kind) -> Options {
        Options {
            name: "my-filter".into(),
            kind,
            dir: dir.to_owned(),
            sdk: None,
            sdk_git: None,
            sdk_rev: None,
        }
    }

    fn message(result: Result<Created, ScaffoldError>) -> String {
        result.expect_err("an error").to_string()
    }

    #[test]
    fn names_follow_cargo_rules() {
        for good in ["my-filter", "a", "_private", "snake_case9", "Mixed-Case"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let why = |name: &str| check_name(name).expect_err(name).to_string();
        assert!(why("").contains("it is empty"));
        assert!(why("9lives").contains("starts with a digit"));
        assert!(why("-x").contains("starts with `-`"));
        assert!(why("my filter").contains("' ' is not allowed"));
        assert!(why("../up").contains("'.' is not allowed"));
        assert!(why("café").contains("'é' is not allowed"));
        assert!(why("__").contains("no letter or digit"));
        assert!(why("fn").contains("keyword"));
        assert!(why("std").contains("clash"));
        assert!(why("datum-guest").contains("clash"));
        assert!(
            why("1x").contains("use ASCII letters, digits, `-` and `_`"),
            "the message says what is allowed"
        );
    }

    #[test]
    fn every_template_fixture_reads_as_a_fixture() {
        for kind in Kind::ALL {
            let t = kind.template();
            let input: ReadBatch =
                json::read(t.input).unwrap_or_else(|e| panic!("{kind:?} input: {e}"));
            assert!(!input.changes.is_empty());
            let expected: Expected =
                json::read(t.expected).unwrap_or_else(|e| panic!("{kind:?} expected: {e}"));
            assert!(matches!(expected, Expected::Changes(_)), "{kind:?}");
            assert!(
                t.lib_rs.contains(&format!("#[{}]", kind.attribute())),
                "{kind:?} uses its attribute"
            );
        }
    }

    #[test]
    fn creates_a_crate_that_names_its_sdk_and_says_what_next() {
        let dir = scratch("create");
        let created = create(&options(&dir, Kind::FlatMap)).expect("created");
        assert_eq!(created.lib_name, "my_filter");
        assert_eq!(created.files.len(), 6);
        assert!(created.files.iter().all(|f| f.is_file()));

        let manifest: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml"))
            .expect("Cargo.toml")
            .parse()
            .expect("Cargo.toml parses");
        assert_eq!(manifest["package"]["name"].as_str(), Some("my-filter"));
        assert_eq!(manifest["package"]["edition"].as_str(), Some("2024"));
        assert!(
            manifest["workspace"]
                .as_table()
                .is_some_and(|t| t.is_empty())
        );
        let sdk = manifest["dependencies"]["datum-guest"]["path"]
            .as_str()
            .expect("a path dependency");
        assert!(Path::new(sdk).is_absolute() && Path::new(sdk).join("Cargo.toml").exists());
        let deps = manifest["dependencies"].as_table().expect("dependencies");
        assert_eq!(deps.len(), 1, "only the SDK: {deps:?}");

        let readme = std::fs::read_to_string(dir.join("README.md")).expect("README");
        assert!(readme.contains("# my-filter"));
        assert!(readme.contains("#[flat_map]"));
        assert!(readme.contains("datum test target/wasm32-wasip1/release/my_filter.wasm fixtures"));
        assert!(readme.contains(BUILD_COMMAND));

        let printed = created.to_string();
        assert!(printed.starts_with(&format!("created {}", dir.display())));
        assert!(printed.contains("  src/lib.rs\n"));
        assert!(printed.contains(&format!("  {BUILD_COMMAND}\n")));
        assert!(printed.contains("  cargo test\n"));
        assert!(
            printed.contains("  datum test target/wasm32-wasip1/release/my_filter.wasm fixtures\n")
        );

        // A second time, the directory is not empty: refused, nothing touched.
        let before = std::fs::read_to_string(dir.join("src/lib.rs")).expect("lib.rs");
        let err = message(create(&options(&dir, Kind::Map)));
        assert!(err.contains("already exists and is not empty"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("src/lib.rs")).expect("lib.rs"),
            before
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn an_empty_directory_is_filled_and_a_file_is_refused() {
        let dir = scratch("empty");
        std::fs::create_dir_all(&dir).expect("mkdir");
        create(&options(&dir, Kind::Map)).expect("an empty directory is fine");
        let file = dir.join("Cargo.toml");
        let err = message(create(&options(&file, Kind::Map)));
        assert!(err.contains("is not a directory"), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_bad_sdk_is_named_and_nothing_is_written() {
        let dir = scratch("sdk");
        let mut opts = options(&dir, Kind::Filter);
        opts.sdk = Some(dir.join("nowhere"));
        let err = message(create(&opts));
        assert!(err.contains("nowhere: it does not exist"), "{err}");
        assert!(err.contains("pass the guest-sdk directory of a Datum checkout"));
        assert!(!dir.exists(), "nothing is created when a check fails");

        // The host's own directory is a package, but not the SDK.
        opts.sdk = Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let err = message(create(&opts));
        assert!(err.contains("package `datum`, not `datum-guest`"), "{err}");

        // The SDK's Cargo.toml is accepted for its directory.
        opts.sdk = Some(Path::new(BUILT_SDK).join("Cargo.toml"));
        let created = create(&opts).expect("created");
        assert_eq!(
            created.sdk,
            Sdk::Path(std::fs::canonicalize(BUILT_SDK).expect("sdk"))
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Whether git runs here (the git tests say so when it does not).
    fn have_git() -> bool {
        std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    #[test]
    fn a_new_crate_gets_its_own_repository_unless_inside_one() {
        if !have_git() {
            eprintln!("git is not installed: skipping");
            return;
        }
        let dir = scratch("git-init");
        let created = create(&options(&dir, Kind::Filter)).expect("created");
        assert_eq!(created.git, Git::Initialised);
        assert!(dir.join(".git").is_dir());
        assert!(created.to_string().contains("initialised a git repository"));
        // Inside that repository, a second crate is part of it.
        let inner = dir.join("inner");
        let created = create(&options(&inner, Kind::Map)).expect("created");
        assert_eq!(created.git, Git::Inside);
        assert!(!inner.join(".git").exists());
        // ... unless the repository ignores the directory.
        std::fs::write(dir.join(".gitignore"), "/target\n/scratch\n").expect("ignore");
        let ignored = dir.join("scratch/crate");
        let created = create(&options(&ignored, Kind::Map)).expect("created");
        assert_eq!(created.git, Git::Initialised);
        assert!(ignored.join(".git").is_dir());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_git_sdk_becomes_a_git_dependency_at_its_revision() {
        let dir = scratch("git-sdk");
        let mut opts = options(&dir, Kind::Filter);
        opts.sdk_rev = Some("v0.1.0".into());
        let err = message(create(&opts));
        assert!(err.contains("--sdk-rev needs --sdk-git"), "{err}");
        assert!(!dir.exists());

        opts.sdk_git = Some("https://example.com/datum.git".into());
        let created = create(&opts).expect("created");
        let manifest: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml"))
            .expect("Cargo.toml")
            .parse()
            .expect("Cargo.toml parses");
        let sdk = &manifest["dependencies"]["datum-guest"];
        assert_eq!(sdk["git"].as_str(), Some("https://example.com/datum.git"));
        assert_eq!(sdk["rev"].as_str(), Some("v0.1.0"));
        assert!(sdk.get("path").is_none(), "{sdk:?}");
        let printed = created.to_string();
        assert!(
            printed.contains("with the guest SDK from git https://example.com/datum.git at v0.1.0"),
            "{printed}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn the_printed_directory_is_one_shell_word() {
        assert_eq!(shell_quote("my-filter"), "my-filter");
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
