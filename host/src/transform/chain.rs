//! A pipeline's modules, run in order on each batch.
//!
//! Owns passing one module's output to the next, stopping early when a
//! module's output is empty, and keeping the result as references into the
//! source batch wherever modules kept changes unchanged.

use datum_guest::Txn;

use super::TransformError;
use super::encode::{ChangeRef, Heads, Item, decode_output, encode_input_with};
use super::module::{CallMeta, Instance, Module};
use crate::event::{Batch, Change};

/// A batch after the chain: the source batch, and what the modules made of
/// it, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Transformed {
    /// The batch as the source produced it.
    pub source: Batch,
    /// The output: source changes by index, or changes a module made.
    pub items: Vec<Item>,
}

impl Transformed {
    /// A batch no module touched.
    pub fn untouched(source: Batch) -> Transformed {
        let items = (0..source.changes.len()).map(Item::Source).collect();
        Transformed { source, items }
    }

    /// The transaction.
    pub fn txn(&self) -> &Txn {
        &self.source.txn
    }

    /// The output changes, borrowed.
    pub fn changes(&self) -> impl ExactSizeIterator<Item = ChangeRef<'_>> + Clone {
        self.items.iter().map(|item| resolve(item, &self.source))
    }

    /// Number of output changes.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the modules dropped every change.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The change `item` stands for in a batch made from `source`.
pub(crate) fn resolve<'a>(item: &'a Item, source: &'a Batch) -> ChangeRef<'a> {
    match item {
        Item::Source(i) => ChangeRef::Source(&source.changes[*i]),
        Item::Wire(change) => ChangeRef::Wire(change),
    }
}

/// A failure in one module of the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("module `{module}` (sha256 {sha256}): {error}")]
pub struct ChainError {
    /// The module's name.
    pub module: String,
    /// Its SHA-256.
    pub sha256: String,
    /// What went wrong.
    pub error: TransformError,
}

/// The modules of a pipeline, each with its instance.
#[derive(Debug, Default)]
pub struct Chain {
    instances: Vec<Instance>,
    /// Fuel used by the last batch, per module, when metered.
    last_fuel: Vec<Option<u64>>,
    /// The tables' encoded heads, kept from batch to batch.
    heads: Heads,
}

impl Chain {
    /// A chain of `modules`, run in order.
    pub fn new(modules: &[Module]) -> Chain {
        Chain {
            instances: modules.iter().map(Module::instance).collect(),
            last_fuel: vec![None; modules.len()],
            heads: Heads::default(),
        }
    }

    /// The modules, in order.
    pub fn modules(&self) -> impl Iterator<Item = &Module> {
        self.instances.iter().map(Instance::module)
    }

    /// Fuel each module used on the last batch (when the engine meters it).
    pub fn last_fuel(&self) -> &[Option<u64>] {
        &self.last_fuel
    }

    /// Runs the batch through every module. An empty output ends the chain
    /// early. Runs on the calling thread: call it off the async executor.
    pub fn run(&mut self, source: Batch) -> Result<Transformed, ChainError> {
        let items = self.run_ref(&source)?;
        Ok(Transformed { source, items })
    }

    /// Like [`Chain::run`], leaving the batch with the caller (who may need
    /// it after a failure, to set it aside).
    pub fn run_ref(&mut self, source: &Batch) -> Result<Vec<Item>, ChainError> {
        self.run_on(
            source,
            (0..source.changes.len()).map(Item::Source).collect(),
        )
    }

    /// Runs a batch whose changes are already items: source changes by
    /// index, or changes in the event model's shape that the host's
    /// representation cannot hold (a snapshot row, a route set upstream),
    /// as golden tests give them.
    pub fn run_items(&mut self, input: Transformed) -> Result<Transformed, ChainError> {
        let Transformed { source, items } = input;
        let items = self.run_on(&source, items)?;
        Ok(Transformed { source, items })
    }

    /// Runs `items` (changes of `source`, or changes a module made) through
    /// the modules, leaving the batch with the caller.
    pub(crate) fn run_on(
        &mut self,
        source: &Batch,
        mut items: Vec<Item>,
    ) -> Result<Vec<Item>, ChainError> {
        let meta = CallMeta {
            commit_time: source.txn.commit_time,
            commit_lsn: source.txn.commit_lsn,
            chunk: source.txn.chunk,
        };
        for fuel in &mut self.last_fuel {
            *fuel = None;
        }
        for (instance, fuel) in self.instances.iter_mut().zip(&mut self.last_fuel) {
            if items.is_empty() {
                break;
            }
            let module = instance.module().clone();
            let fail = |error| ChainError {
                module: module.name().to_owned(),
                sha256: module.sha256().to_owned(),
                error,
            };
            if !module.sees_schema_changes() && items.iter().any(|i| is_schema(i, source)) {
                items = call_around_schema_changes(
                    instance,
                    &mut self.heads,
                    meta,
                    source,
                    &items,
                    fuel,
                )
                .map_err(&fail)?;
                continue;
            }
            let (output, used) =
                call(instance, &mut self.heads, meta, source, &items).map_err(&fail)?;
            *fuel = used;
            items = output;
        }
        Ok(items)
    }
}

/// One call of `instance` on `items`.
fn call(
    instance: &mut Instance,
    heads: &mut Heads,
    meta: CallMeta,
    source: &Batch,
    items: &[Item],
) -> Result<(Vec<Item>, Option<u64>), TransformError> {
    let input = encode_input_with(
        &source.txn,
        items.iter().map(|item| resolve(item, source)),
        heads,
    )?;
    let (output, stats) = instance.call(&input, meta)?;
    Ok((decode_output(output, items, source)?, stats.fuel))
}

fn is_schema(item: &Item, source: &Batch) -> bool {
    match item {
        Item::Source(i) => matches!(source.changes.get(*i), Some(Change::Schema { .. })),
        Item::Wire(change) => change.op == datum_guest::Op::Schema,
    }
}

/// For a module that does not understand `schema` changes: the changes
/// between them go through it in separate calls (with the same `txn`), and
/// each schema change keeps its place between their outputs, so it still
/// comes before the first row of the new shape.
fn call_around_schema_changes(
    instance: &mut Instance,
    heads: &mut Heads,
    meta: CallMeta,
    source: &Batch,
    items: &[Item],
    fuel: &mut Option<u64>,
) -> Result<Vec<Item>, TransformError> {
    let mut out = Vec::with_capacity(items.len());
    let mut used: Option<u64> = None;
    for run in items.split_inclusive(|item| is_schema(item, source)) {
        let (rows, schema) = match run.split_last() {
            Some((last, rows)) if is_schema(last, source) => (rows, Some(last)),
            _ => (run, None),
        };
        if !rows.is_empty() {
            let (output, fuel) = call(instance, heads, meta, source, rows)?;
            out.extend(output);
            if let Some(fuel) = fuel {
                used = Some(used.unwrap_or(0) + fuel);
            }
        }
        out.extend(schema.cloned());
    }
    *fuel = used;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datum_guest::{Txn, Value};

    use super::*;
    use crate::event::{Column, Relation, ReplicaIdentity};
    use crate::transform::Limits;
    use crate::transform::engine::{Engine, EngineOptions};

    /// A module that answers every call with "keep change 0"; `MARKER` is
    /// replaced by its `datum_schema_changes` export, or by nothing.
    const KEEP_FIRST: &str = r#"(module
  (memory (export "memory") 1)
  (data (i32.const 1024) "\81\a7changes\91\00")
  (func (export "datum_abi_v1"))
  MARKER
  (func (export "datum_alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "datum_dealloc") (param i32 i32))
  (func (export "datum_transform") (param i32 i32) (result i64)
    (i64.const 4398046511115)))"#;

    fn keep_first(marker: bool) -> Module {
        let engine = Engine::new(EngineOptions::default()).expect("engine");
        let wat = KEEP_FIRST.replace(
            "MARKER",
            if marker {
                r#"(func (export "datum_schema_changes"))"#
            } else {
                ""
            },
        );
        Module::new(
            &engine,
            "keep_first",
            wat.as_bytes(),
            Limits::default(),
            vec![],
        )
        .expect("loads")
    }

    fn relation(columns: &[&str]) -> Arc<Relation> {
        Arc::new(Relation {
            oid: 1,
            schema: "public".into(),
            table: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: columns
                .iter()
                .map(|c| Column::new(c, "int4", *c == "id"))
                .collect(),
        })
    }

    #[test]
    fn a_module_without_the_schema_marker_is_called_around_schema_changes() {
        let (old, new) = (relation(&["id"]), relation(&["id", "note"]));
        let batch = Batch {
            txn: Txn::committed(7, 100),
            changes: vec![
                Change::Insert {
                    relation: old.clone(),
                    new: vec![Value::Int(1)],
                },
                Change::Schema {
                    relation: new.clone(),
                    before: old,
                    ddl: Vec::new(),
                },
                Change::Insert {
                    relation: new,
                    new: vec![Value::Int(2), Value::Null],
                },
            ],
            bytes: 0,
        };
        // Without the marker: [row 0], the schema change, [row 2]; each run
        // answers "keep the first", so everything stays, in order.
        let mut legacy = Chain::new(&[keep_first(false)]);
        let items = legacy.run_ref(&batch).expect("runs");
        assert_eq!(items, [Item::Source(0), Item::Source(1), Item::Source(2)]);
        // With it, the module sees all three and keeps the first.
        let mut aware = Chain::new(&[keep_first(true)]);
        assert!(aware.modules().all(Module::sees_schema_changes));
        assert_eq!(aware.run_ref(&batch).expect("runs"), [Item::Source(0)]);
    }
}
