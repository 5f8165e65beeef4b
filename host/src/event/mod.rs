//! The event model: what flows through a pipeline, and its forms for people.
//!
//! A [`Batch`] is one transaction (or one ordered chunk of a large one): its
//! [`Change`]s, with rows as typed values aligned to a shared [`Relation`].
//! Positions are [`Lsn`]s; a pipeline's position is an [`Offset`]. Values
//! arrive in PostgreSQL's text format and become typed (`values`); they
//! have a text form (`text`) and a JSON form ([`json`]), and JSON is
//! printed for people with its key order kept (`ordered`).
//!
//! Everything else imports this room; it imports none of them.

pub(crate) mod batch;
pub(crate) mod json;
pub(crate) mod lsn;
pub(crate) mod offset;
pub(crate) mod ordered;
pub(crate) mod text;
pub(crate) mod values;

pub use batch::{Batch, Change, Column, Relation, ReplicaIdentity};
pub(crate) use batch::{BatchLimits, OldRow};
pub use lsn::Lsn;
pub use offset::Offset;
pub(crate) use values::TypeKind;
