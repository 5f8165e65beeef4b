//! The daemon: where the parts join into running pipelines.
//!
//! [`prepare`] turns the configuration into pipelines ready to run;
//! `supervisor` runs each under a supervisor that pauses, resumes and
//! stops it; [`pipeline`] wires one pipeline — source, transforms, sink —
//! and moves its checkpoint; `feedback` decides what may be checkpointed
//! and told to PostgreSQL; `commit` writes it to the state file;
//! `hotswap` keeps the module versions a pipeline runs and adopts a new
//! one between transactions.
//!
//! The parts it joins know nothing of each other: the source sees the
//! feedback coordinator only through [`crate::source::Positions`], the
//! state file stores what it is given, and sinks and modules see batches.

pub(crate) mod canary;
pub(crate) mod commit;
pub(crate) mod feedback;
pub(crate) mod hotswap;
pub(crate) mod leader;
pub(crate) mod pace;
pub(crate) mod pipeline;
pub(crate) mod prepare;
pub(crate) mod snapshot;
pub(crate) mod supervisor;
pub(crate) mod transforms;
pub(crate) mod visibility;

pub use feedback::Feedback;
pub(crate) use prepare::{Prepared, StartError, engine, prepare, prepare_with};
pub(crate) use supervisor::{PipelineControl, PipelineState, Report, Supervisors};
