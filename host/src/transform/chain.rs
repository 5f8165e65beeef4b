//! A pipeline's modules, run in order on each batch.
//!
//! Owns passing one module's output to the next, stopping early when a
//! module's output is empty, and keeping the result as references into the
//! source batch wherever modules kept changes unchanged.

use datum_guest::Txn;

use super::TransformError;
use super::encode::{ChangeRef, Item, decode_output, encode_input};
use super::module::{CallMeta, Instance, Module};
use crate::event::Batch;

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

fn resolve<'a>(item: &'a Item, source: &'a Batch) -> ChangeRef<'a> {
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
}

impl Chain {
    /// A chain of `modules`, run in order.
    pub fn new(modules: &[Module]) -> Chain {
        Chain {
            instances: modules.iter().map(Module::instance).collect(),
            last_fuel: vec![None; modules.len()],
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

    fn run_on(&mut self, source: &Batch, mut items: Vec<Item>) -> Result<Vec<Item>, ChainError> {
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
            let input = encode_input(&source.txn, items.iter().map(|item| resolve(item, source)))
                .map_err(&fail)?;
            let (output, stats) = instance.call(&input, meta).map_err(&fail)?;
            *fuel = stats.fuel;
            items = decode_output(&output, &items, source).map_err(&fail)?;
        }
        Ok(items)
    }
}
