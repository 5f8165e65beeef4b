//! `route_by_table`: sets each change's `route`, and optionally renames its
//! table, from a map keyed by `schema.table`.
//!
//! A change's table is looked up as `schema.table`, then `schema.*`; a
//! change found in neither gets `default` (if set) and keeps any route it
//! had otherwise. A truncate is looked up by its first table and each of its
//! tables is renamed by its own entry; a logical message (no table) gets
//! `default`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use datum_guest::{Change, Config, Context, Error, Result, init, map};
use serde::Deserialize;

/// Where one table's changes go.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Target {
    /// Just a route: `"public.users" = "users_topic"`.
    Route(String),
    /// A route with a new name for the table:
    /// `"public.users" = { route = "crm", table = "customers" }`.
    Full {
        /// The route.
        route: Option<String>,
        /// The new schema, if renamed.
        schema: Option<String>,
        /// The new table name, if renamed.
        table: Option<String>,
    },
}

/// The module's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `schema.table` or `schema.*` → target.
    #[serde(default)]
    pub routes: BTreeMap<String, Target>,
    /// The route of changes no entry matches.
    #[serde(default)]
    pub default: Option<String>,
}

impl Settings {
    /// Reads and checks the configuration.
    pub fn from_config(config: &Config) -> Result<Settings> {
        let settings: Settings = config.parse()?;
        for (key, target) in &settings.routes {
            if !key.contains('.') {
                return Err(Error::new(format!(
                    "routes key `{key}` is not `schema.table` or `schema.*`"
                )));
            }
            if let Target::Full {
                route: None,
                schema: None,
                table: None,
            } = target
            {
                return Err(Error::new(format!("routes entry `{key}` sets nothing")));
            }
        }
        if settings.routes.is_empty() && settings.default.is_none() {
            return Err(Error::new("neither `routes` nor `default` is set"));
        }
        Ok(settings)
    }

    fn lookup(&self, schema: &str, table: &str) -> Option<&Target> {
        self.routes
            .get(&format!("{schema}.{table}"))
            .or_else(|| self.routes.get(&format!("{schema}.*")))
    }

    /// Routes (and renames) a change.
    pub fn route(&self, mut change: Change) -> Result<Change> {
        match self.lookup(&change.schema, &change.table).cloned() {
            Some(Target::Route(route)) => change.route = Some(route),
            Some(Target::Full {
                route,
                schema,
                table,
            }) => {
                if let Some(route) = route.or_else(|| self.default.clone()) {
                    change.route = Some(route);
                }
                if let Some(schema) = schema {
                    change.schema = schema;
                }
                if let Some(table) = table {
                    change.table = table;
                }
            }
            None => {
                if let Some(default) = &self.default {
                    change.route = Some(default.clone());
                }
            }
        }
        if let Some(truncate) = change.truncate.as_mut() {
            for name in &mut truncate.tables {
                if let Some(Target::Full { schema, table, .. }) =
                    self.lookup(&name.schema, &name.table)
                {
                    if let Some(schema) = schema {
                        name.schema.clone_from(schema);
                    }
                    if let Some(table) = table {
                        name.table.clone_from(table);
                    }
                }
            }
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
        .map_err(|_| Error::new("route_by_table is configured twice"))
}

/// Sets the route of each change.
#[map]
pub fn route_by_table(change: Change) -> Result<Change> {
    SETTINGS
        .get()
        .context("route_by_table is not configured")?
        .route(change)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Output, Txn, row, testing};

    use super::*;

    fn settings() -> Settings {
        Settings::from_config(&Config::from_toml(
            r#"
            default = "everything_else"
            [routes]
            "public.users" = "crm"
            "public.orders" = { route = "sales", table = "orders_v2" }
            "audit.*" = { schema = "archive" }
            "#,
        ))
        .expect("valid settings")
    }

    #[test]
    fn exact_then_wildcard_then_default() {
        let s = settings();
        let users = s.route(Change::insert("public", "users")).expect("route");
        assert_eq!(users.route.as_deref(), Some("crm"));
        let orders = s.route(Change::insert("public", "orders")).expect("route");
        assert_eq!(
            (orders.route.as_deref(), orders.table.as_str()),
            (Some("sales"), "orders_v2")
        );
        let audit = s.route(Change::delete("audit", "log")).expect("route");
        assert_eq!(
            (audit.route.as_deref(), audit.schema.as_str()),
            (Some("everything_else"), "archive")
        );
        let other = s.route(Change::insert("public", "x")).expect("route");
        assert_eq!(other.route.as_deref(), Some("everything_else"));
        let message = s
            .route(Change::logical_message("p", b"x".to_vec(), false))
            .expect("route");
        assert_eq!(message.route.as_deref(), Some("everything_else"));
    }

    #[test]
    fn truncates_rename_each_table() {
        let s = settings();
        let t = s
            .route(Change::truncate_tables([
                ("public", "orders"),
                ("public", "users"),
                ("audit", "log"),
            ]))
            .expect("route");
        assert_eq!(t.route.as_deref(), Some("sales"));
        let names: Vec<String> = t
            .truncate
            .expect("truncate")
            .tables
            .iter()
            .map(|n| format!("{}.{}", n.schema, n.table))
            .collect();
        assert_eq!(names, ["public.orders_v2", "public.users", "archive.log"]);
    }

    #[test]
    fn without_a_default_unmatched_changes_are_kept_by_index() {
        let s = Settings::from_config(&Config::from_toml("[routes]\n\"public.users\" = \"crm\""))
            .expect("valid");
        let batch = Batch::new(
            Txn::committed(1, 1),
            vec![
                Change::insert("public", "orders").new_row(row! { "id" => 1 }),
                Change::insert("public", "users").new_row(row! { "id" => 2 }),
            ],
        );
        let answer = testing::run_map(|c: Change| s.route(c), &batch).expect("runs");
        assert!(matches!(answer.outputs[0], Output::Keep(0)));
        assert_eq!(answer.changes()[1].route.as_deref(), Some("crm"));
    }

    #[test]
    fn configuration_mistakes_are_named() {
        let err = |toml: &str| {
            Settings::from_config(&Config::from_toml(toml))
                .unwrap_err()
                .message()
                .to_owned()
        };
        assert_eq!(err(""), "neither `routes` nor `default` is set");
        assert_eq!(
            err("[routes]\nusers = \"x\""),
            "routes key `users` is not `schema.table` or `schema.*`"
        );
        assert_eq!(err("[routes.\"a.b\"]"), "routes entry `a.b` sets nothing");
        assert!(err("defaults = \"x\"").contains("unknown field `defaults`"));
    }
}
