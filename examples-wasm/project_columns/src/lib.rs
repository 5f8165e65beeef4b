//! `project_columns`: drops columns, or keeps only some, for every table or
//! per table, in `columns`, `new` and `old` alike.
//!
//! A table's own entry (`[tables."schema.table"]`) replaces the top-level
//! rule for that table. Under `keep`, the replica identity's columns are kept
//! too, so the sink can still apply updates and deletes; under `drop`, a key
//! column goes only if listed. Truncates and messages pass unchanged.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use datum_guest::{Change, Config, Context, Error, Result, init, map};
use serde::Deserialize;

/// Which columns to keep.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Keep only these columns (and the key).
    #[serde(default)]
    pub keep: Option<Vec<String>>,
    /// Drop these columns.
    #[serde(default)]
    pub drop: Option<Vec<String>>,
}

impl Rule {
    fn check(&self, whose: &str) -> Result<()> {
        match (&self.keep, &self.drop) {
            (Some(_), Some(_)) => Err(Error::new(format!(
                "{whose} sets both `keep` and `drop`: choose one"
            ))),
            (None, None) => Err(Error::new(format!(
                "{whose} sets neither `keep` nor `drop`"
            ))),
            _ => Ok(()),
        }
    }

    fn is_empty(&self) -> bool {
        self.keep.is_none() && self.drop.is_none()
    }

    /// Applies the rule to a change.
    fn apply(&self, change: &mut Change) {
        if let Some(keep) = &self.keep {
            let keys: Vec<String> = change
                .columns
                .iter()
                .filter(|c| c.key)
                .map(|c| c.name.clone())
                .collect();
            change.retain_columns(|name| keep.iter().chain(&keys).any(|k| k == name));
        } else if let Some(drop) = &self.drop {
            change.retain_columns(|name| !drop.iter().any(|d| d == name));
        }
    }
}

/// The module's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Keep only these columns in every table without an entry.
    #[serde(default)]
    pub keep: Option<Vec<String>>,
    /// Drop these columns in every table without an entry.
    #[serde(default)]
    pub drop: Option<Vec<String>>,
    /// Per-table rules, keyed by `schema.table`.
    #[serde(default)]
    pub tables: BTreeMap<String, Rule>,
}

impl Settings {
    /// Reads and checks the configuration.
    pub fn from_config(config: &Config) -> Result<Settings> {
        let settings: Settings = config.parse()?;
        let global = settings.global();
        if !global.is_empty() {
            global.check("the top level")?;
        } else if settings.tables.is_empty() {
            return Err(Error::new(
                "nothing to project: set `keep`, `drop` or `tables`",
            ));
        }
        for (table, rule) in &settings.tables {
            if !table.contains('.') {
                return Err(Error::new(format!(
                    "tables key `{table}` is not `schema.table`"
                )));
            }
            rule.check(&format!("table `{table}`"))?;
        }
        Ok(settings)
    }

    fn global(&self) -> Rule {
        Rule {
            keep: self.keep.clone(),
            drop: self.drop.clone(),
        }
    }

    /// Projects a change's columns.
    pub fn project(&self, mut change: Change) -> Result<Change> {
        if !change.is_row_change() {
            return Ok(change);
        }
        match self.tables.get(&change.qualified_table()) {
            Some(rule) => rule.apply(&mut change),
            None => self.global().apply(&mut change),
        }
        Ok(change)
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Reads the configuration once per instance.
#[init]
pub fn configure(config: Config) -> Result<()> {
    let settings = Settings::from_config(&config)?;
    SETTINGS
        .set(settings)
        .map_err(|_| Error::new("project_columns is configured twice"))
}

/// Projects each change's columns.
#[map]
pub fn project_columns(change: Change) -> Result<Change> {
    SETTINGS
        .get()
        .context("project_columns is not configured")?
        .project(change)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Output, Row, Txn, row, testing};

    use super::*;

    fn settings(toml: &str) -> Settings {
        Settings::from_config(&Config::from_toml(toml)).expect("valid settings")
    }

    fn user() -> Change {
        Change::update("public", "users")
            .column("id", "int4", true)
            .column("email", "text", false)
            .column("password_hash", "text", false)
            .column("name", "text", false)
            .new_row(row! { "id" => 1, "email" => "a@b", "password_hash" => "x", "name" => "Ada" })
            .old_row(
                row! { "id" => 1, "email" => "old@b", "password_hash" => "y", "name" => "Ada" },
            )
    }

    fn names(change: &Change) -> (Vec<&str>, Vec<&str>, Vec<&str>) {
        (
            change.columns.iter().map(|c| c.name.as_str()).collect(),
            change
                .new
                .as_ref()
                .map(|r| r.names().collect())
                .unwrap_or_default(),
            change
                .old
                .as_ref()
                .map(|r| r.names().collect())
                .unwrap_or_default(),
        )
    }

    #[test]
    fn drop_everywhere() {
        let s = settings("drop = [\"password_hash\"]");
        let out = s.project(user()).expect("project");
        let expected = vec!["id", "email", "name"];
        assert_eq!(names(&out), (expected.clone(), expected.clone(), expected));
    }

    #[test]
    fn keep_only_keeps_the_key_too() {
        let s = settings("keep = [\"email\"]");
        let out = s.project(user()).expect("project");
        let expected = vec!["id", "email"];
        assert_eq!(names(&out), (expected.clone(), expected.clone(), expected));
    }

    #[test]
    fn a_table_entry_replaces_the_global_rule() {
        let s =
            settings("drop = [\"password_hash\"]\n[tables.\"public.users\"]\nkeep = [\"name\"]");
        let out = s.project(user()).expect("project");
        assert_eq!(names(&out).0, ["id", "name"]);
        let other = Change::insert("public", "orders")
            .column("password_hash", "text", false)
            .column("total", "int4", false)
            .new_row(row! { "password_hash" => "z", "total" => 3 });
        assert_eq!(names(&s.project(other).expect("project")).1, ["total"]);
    }

    #[test]
    fn untouched_changes_are_answered_by_index() {
        let s = settings("[tables.\"public.users\"]\ndrop = [\"password_hash\"]");
        let batch = Batch::new(
            Txn::committed(1, 1),
            vec![
                Change::insert("public", "orders").new_row(row! { "id" => 1 }),
                user(),
                Change::truncate_tables([("public", "users")]),
            ],
        );
        let answer = testing::run_map(|c: Change| s.project(c), &batch).expect("runs");
        assert!(matches!(answer.outputs[0], Output::Keep(0)));
        assert!(matches!(answer.outputs[1], Output::Change(_)));
        assert!(matches!(answer.outputs[2], Output::Keep(2)));
        assert_eq!(answer.changes()[1].new.as_ref().map(Row::len), Some(3));
    }

    #[test]
    fn configuration_mistakes_are_named() {
        let err = |toml: &str| {
            Settings::from_config(&Config::from_toml(toml))
                .unwrap_err()
                .message()
                .to_owned()
        };
        assert_eq!(
            err(""),
            "nothing to project: set `keep`, `drop` or `tables`"
        );
        assert_eq!(
            err("keep = [\"a\"]\ndrop = [\"b\"]"),
            "the top level sets both `keep` and `drop`: choose one"
        );
        assert_eq!(
            err("[tables.\"a.b\"]"),
            "table `a.b` sets neither `keep` nor `drop`"
        );
        assert_eq!(
            err("[tables.users]\nkeep = []"),
            "tables key `users` is not `schema.table`"
        );
        assert!(err("[tables.\"a.b\"]\nkeeps = []").contains("unknown field `keeps`"));
    }
}
