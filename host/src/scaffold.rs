//! `datum new`: scaffolds a transform crate. (Being written.)

use std::fmt;
use std::path::PathBuf;

/// The kinds of transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `#[filter]`.
    Filter,
    /// `#[map]`.
    Map,
    /// `#[flat_map]`.
    FlatMap,
    /// `#[transform]`.
    Transform,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct Options {
    /// Crate name.
    pub name: String,
    /// Kind.
    pub kind: Kind,
    /// Directory to create.
    pub dir: PathBuf,
    /// SDK path.
    pub sdk: Option<PathBuf>,
}

/// What was created.
#[derive(Debug, Clone)]
pub struct Created {
    /// The crate's directory.
    pub dir: PathBuf,
    /// Files written.
    pub files: Vec<PathBuf>,
}

impl fmt::Display for Created {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "created {}", self.dir.display())
    }
}

/// Why scaffolding failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ScaffoldError(String);

/// Creates the crate.
pub fn create(options: &Options) -> Result<Created, ScaffoldError> {
    Err(ScaffoldError(format!("not written yet: {}", options.name)))
}
