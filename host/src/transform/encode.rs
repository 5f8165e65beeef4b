//! Batches into the ABI's MessagePack, and result envelopes back out.
//!
//! Owns the host side of `docs/abi.md`: serialising a source batch straight
//! from the host's representation (rows aligned with a shared relation, no
//! per-row copies of names), serialising the output of one module as the
//! input of the next, and resolving a result envelope — kept input indexes
//! and new changes — against the input it answers.

use std::collections::HashMap;
use std::sync::Arc;

use datum_guest::wire::{self, Change as WireChange, Column as WireColumn, GuestError, Output};
use datum_guest::{Op, Txn, Value};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserializer, Serialize, Serializer};

use super::TransformError;
use super::sandbox::guest_text;
use crate::event::batch::PerTable;
use crate::event::{Batch, Change, Column, OldRow, Relation};

/// One change of a transformed batch: a source change passed through
/// unchanged (by index, never copied), or a change a module made.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `source.changes[i]`.
    Source(usize),
    /// A module's change.
    Wire(Box<WireChange>),
}

/// A change of a transformed batch, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum ChangeRef<'a> {
    /// A source change.
    Source(&'a Change),
    /// A module's change.
    Wire(&'a WireChange),
}

impl ChangeRef<'_> {
    /// The change in the event model's shape.
    pub fn to_wire(&self) -> WireChange {
        match self {
            ChangeRef::Source(change) => to_wire(change),
            ChangeRef::Wire(change) => (*change).clone(),
        }
    }
}

impl Serialize for ChangeRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ChangeRef::Source(change) => HostChange(change).serialize(serializer),
            ChangeRef::Wire(change) => change.serialize(serializer),
        }
    }
}

/// Encodes the input envelope `{txn, changes}` for a call.
///
/// The bytes are those `rmp-serde` writes for the wire types
/// (`datum_guest::wire::Batch`), written directly: a source change's
/// `schema`, `table` and `columns` and its column names are encoded once
/// per table (`Head`) and copied into every change of that table, and the
/// common values are written without serde. Any other change goes through
/// `rmp-serde` as before.
pub fn encode_input<'a>(
    txn: &Txn,
    changes: impl ExactSizeIterator<Item = ChangeRef<'a>> + Clone,
) -> Result<Vec<u8>, TransformError> {
    encode_input_with(txn, changes, &mut Heads::default())
}

/// [`encode_input`], with the tables' heads kept in `heads` from call to
/// call: a stream of 1-row transactions would otherwise encode its table's
/// head again for every change.
pub(crate) fn encode_input_with<'a>(
    txn: &Txn,
    changes: impl ExactSizeIterator<Item = ChangeRef<'a>> + Clone,
    heads: &mut Heads,
) -> Result<Vec<u8>, TransformError> {
    heads.trim();
    let mut out = Vec::with_capacity(64 + changes.len().saturating_mul(96));
    write_input(&mut out, txn, changes, heads)
        .map_err(|e| TransformError::InvalidOutput(format!("encoding the batch: {e}")))?;
    Ok(out)
}

/// Why a batch could not be encoded (writing into memory does not fail;
/// a value `rmp-serde` refuses, or more than 2³² changes, could).
type EncodeError = Box<dyn std::error::Error + Send + Sync>;

fn write_input<'a>(
    out: &mut Vec<u8>,
    txn: &Txn,
    changes: impl ExactSizeIterator<Item = ChangeRef<'a>>,
    heads: &mut Heads,
) -> Result<(), EncodeError> {
    rmp::encode::write_map_len(out, 2)?;
    rmp::encode::write_str(out, "txn")?;
    write_txn(out, txn)?;
    rmp::encode::write_str(out, "changes")?;
    rmp::encode::write_array_len(out, u32::try_from(changes.len())?)?;
    for change in changes {
        match change {
            ChangeRef::Source(change) => write_source(out, change, heads)?,
            ChangeRef::Wire(change) => wire::encode_change_into(out, change)?,
        }
    }
    Ok(())
}

/// What `rmp-serde` writes for `txn` (a map of its fields by name, each
/// number in its shortest form), without serde: for 1-row transactions it
/// is a fair part of each call.
fn write_txn(out: &mut Vec<u8>, txn: &Txn) -> Result<(), EncodeError> {
    rmp::encode::write_map_len(out, 6)?;
    rmp::encode::write_str(out, "xid")?;
    rmp::encode::write_uint(out, u64::from(txn.xid))?;
    rmp::encode::write_str(out, "commit_lsn")?;
    rmp::encode::write_uint(out, txn.commit_lsn)?;
    rmp::encode::write_str(out, "end_lsn")?;
    rmp::encode::write_uint(out, txn.end_lsn)?;
    rmp::encode::write_str(out, "commit_time")?;
    rmp::encode::write_sint(out, txn.commit_time)?;
    rmp::encode::write_str(out, "chunk")?;
    rmp::encode::write_uint(out, u64::from(txn.chunk))?;
    rmp::encode::write_str(out, "last")?;
    rmp::encode::write_bool(out, txn.last)?;
    Ok(())
}

/// A table's part of its changes, encoded once: the `schema`, `table` and
/// `columns` entries, and each column's name.
struct Head {
    entries: Vec<u8>,
    /// Each column's encoded name, as a range of `names`.
    name_at: Vec<std::ops::Range<usize>>,
    names: Vec<u8>,
}

/// The heads of the tables met lately. Within a call every table's head
/// is kept; between calls the list starts over once it holds `HEADS_KEPT`
/// or more. A relation that changed is a new one (a new entry).
#[derive(Default)]
pub(crate) struct Heads(PerTable<Arc<Relation>, Head>);

impl std::fmt::Debug for Heads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heads")
            .field("tables", &self.0.len())
            .finish()
    }
}

/// Tables whose heads are kept from one call to the next.
const HEADS_KEPT: usize = 64;

impl Heads {
    /// Forgets every head once there are `HEADS_KEPT` of them.
    fn trim(&mut self) {
        if self.0.len() >= HEADS_KEPT {
            self.0.clear();
        }
    }

    fn get(&mut self, relation: &Arc<Relation>) -> Result<&Head, EncodeError> {
        self.0
            .get_or_try_insert_with(relation, || Head::of(relation))
    }
}

impl Head {
    fn of(relation: &Relation) -> Result<Head, EncodeError> {
        let mut entries = Vec::new();
        rmp::encode::write_str(&mut entries, "schema")?;
        rmp::encode::write_str(&mut entries, &relation.schema)?;
        rmp::encode::write_str(&mut entries, "table")?;
        rmp::encode::write_str(&mut entries, &relation.table)?;
        rmp::encode::write_str(&mut entries, "columns")?;
        rmp_serde::encode::write_named(&mut entries, &Columns(&relation.columns))?;
        let mut names = Vec::new();
        let mut name_at = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let start = names.len();
            rmp::encode::write_str(&mut names, &column.name)?;
            name_at.push(start..names.len());
        }
        Ok(Head {
            entries,
            name_at,
            names,
        })
    }
}

/// A source change, keys in the order `HostChange` writes them.
fn write_source(out: &mut Vec<u8>, change: &Change, heads: &mut Heads) -> Result<(), EncodeError> {
    let (op, relation, new, old) = match change {
        Change::Insert { relation, new } => ("insert", relation, Some(new), None),
        Change::Snapshot { relation, new } => ("snapshot", relation, Some(new), None),
        Change::Update { relation, old, new } => ("update", relation, Some(new), old.as_ref()),
        Change::Delete { relation, old } => ("delete", relation, None, Some(old)),
        Change::Truncate { .. } | Change::Message { .. } | Change::Schema { .. } => {
            // Rare: through the wire types.
            rmp_serde::encode::write_named(out, &to_wire(change))?;
            return Ok(());
        }
    };
    let head = heads.get(relation)?;
    let len = 4 + u32::from(new.is_some()) + u32::from(old.is_some());
    rmp::encode::write_map_len(out, len)?;
    rmp::encode::write_str(out, "op")?;
    rmp::encode::write_str(out, op)?;
    out.extend_from_slice(&head.entries);
    if let Some(new) = new {
        rmp::encode::write_str(out, "new")?;
        write_row(out, head, &relation.columns, new, false)?;
    }
    if let Some(old) = old {
        rmp::encode::write_str(out, "old")?;
        write_row(out, head, &relation.columns, &old.values, old.key_only)?;
    }
    Ok(())
}

/// A row as a map of column name to value (only the key's columns when
/// `key_only`).
fn write_row(
    out: &mut Vec<u8>,
    head: &Head,
    columns: &[Column],
    values: &[Value],
    key_only: bool,
) -> Result<(), EncodeError> {
    let written = |column: &Column| !key_only || column.key;
    let len = columns
        .iter()
        .zip(values)
        .filter(|(c, _)| written(c))
        .count();
    rmp::encode::write_map_len(out, u32::try_from(len)?)?;
    for ((column, value), at) in columns.iter().zip(values).zip(&head.name_at) {
        if !written(column) {
            continue;
        }
        out.extend_from_slice(head.names.get(at.clone()).unwrap_or_default());
        write_value(out, value)?;
    }
    Ok(())
}

/// A value as `rmp-serde` writes it; the common kinds without serde.
fn write_value(out: &mut Vec<u8>, value: &Value) -> Result<(), EncodeError> {
    match value {
        Value::Null => rmp::encode::write_nil(out)?,
        Value::Bool(b) => rmp::encode::write_bool(out, *b)?,
        Value::Int(i) => {
            rmp::encode::write_sint(out, *i)?;
        }
        Value::Float(f) => rmp::encode::write_f64(out, *f)?,
        Value::Text(t) => rmp::encode::write_str(out, t)?,
        Value::Numeric(n) => write_tagged(out, "numeric", n)?,
        Value::Json(j) => write_tagged(out, "json", j)?,
        other => rmp_serde::encode::write_named(out, other)?,
    }
    Ok(())
}

/// A tagged value, as `Value`'s serializer writes it: a map of one entry,
/// the tag to the text.
fn write_tagged(out: &mut Vec<u8>, tag: &str, text: &str) -> Result<(), EncodeError> {
    rmp::encode::write_map_len(out, 1)?;
    rmp::encode::write_str(out, tag)?;
    rmp::encode::write_str(out, text)?;
    Ok(())
}

/// What a result envelope says, read strictly (`docs/abi.md`, "The output").
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// `{"changes": [...]}`.
    Changes(Vec<Output>),
    /// `{"error": {...}}`.
    Error(GuestError),
    /// A map with neither key: `datum_init`'s `{}`.
    Neither,
}

/// Reads a result envelope: one MessagePack map with `changes` or `error`
/// (not both; other keys are ignored, as readers ignore fields they do not
/// know), and nothing after it. An element of `changes` that is neither an
/// index nor a change map is reported with its position and why.
pub(crate) fn decode_envelope(bytes: Vec<u8>, most: usize) -> Result<Answer, String> {
    // The shape every module answers with when it works, read directly
    // (rows keep the bytes, and values decode when read); anything else
    // (errors, and more than `most` changes, included) goes the strict way
    // below, which says what is wrong.
    let bytes = match wire::decode_changes_envelope_at_most(bytes, most) {
        Ok(changes) => return Ok(Answer::Changes(changes)),
        Err(bytes) => bytes,
    };
    let bytes = bytes.as_slice();
    let mut reader = std::io::Cursor::new(bytes);
    let mut de = rmp_serde::Deserializer::new(&mut reader);
    let envelope = RawEnvelope::read(&mut de, most).map_err(|e| match e {
        rmp_serde::decode::Error::Syntax(why) => why,
        other => format!("not valid MessagePack: {other}"),
    })?;
    let rest = bytes.len() as u64 - reader.position().min(bytes.len() as u64);
    if rest > 0 {
        return Err(format!(
            "{rest} byte{} after the envelope",
            if rest == 1 { "" } else { "s" }
        ));
    }
    match envelope {
        RawEnvelope {
            changes: Some(_),
            error: Some(_),
        } => Err("the envelope has both `changes` and `error`".into()),
        RawEnvelope {
            changes: Some(changes),
            error: None,
        } => Ok(Answer::Changes(changes)),
        RawEnvelope {
            changes: None,
            error: Some(error),
        } => Ok(Answer::Error(error)),
        RawEnvelope {
            changes: None,
            error: None,
        } => Ok(Answer::Neither),
    }
}

struct RawEnvelope {
    changes: Option<Vec<Output>>,
    error: Option<GuestError>,
}

impl RawEnvelope {
    /// Reads an envelope of at most `most` changes.
    fn read<'de, D: Deserializer<'de>>(
        deserializer: D,
        most: usize,
    ) -> Result<RawEnvelope, D::Error> {
        struct EnvelopeVisitor {
            most: usize,
        }
        impl<'de> Visitor<'de> for EnvelopeVisitor {
            type Value = RawEnvelope;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map with `changes` or `error`")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEnvelope, A::Error> {
                let mut envelope = RawEnvelope {
                    changes: None,
                    error: None,
                };
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match &*key {
                        "changes" if envelope.changes.is_some() => {
                            return Err(de::Error::custom("`changes` appears twice"));
                        }
                        "changes" => {
                            envelope.changes =
                                Some(map.next_value_seed(Outputs { most: self.most })?);
                        }
                        "error" if envelope.error.is_some() => {
                            return Err(de::Error::custom("`error` appears twice"));
                        }
                        "error" => {
                            envelope.error = Some(map.next_value::<GuestError>().map_err(|e| {
                                de::Error::custom(format!("`error` is not an error: {e}"))
                            })?);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(envelope)
            }
        }
        deserializer.deserialize_map(EnvelopeVisitor { most })
    }
}

/// `changes`, each element read on its own so that a bad one is reported
/// with its position and its cause; at most `most` of them.
struct Outputs {
    most: usize,
}

impl<'de> DeserializeSeed<'de> for Outputs {
    type Value = Vec<Output>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Output>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Outputs {
    type Value = Vec<Output>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of change indexes and change maps")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Output>, A::Error> {
        let mut outputs = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        loop {
            let position = outputs.len();
            if position == self.most && seq.next_element::<IgnoredAny>()?.is_some() {
                return Err(de::Error::custom(format!(
                    "more than {} changes: a result holds at most {MAX_KEPT_PER_INPUT} per \
                     change of the batch, or {MIN_MOST_CHANGES} (each decoded change costs \
                     the host far more memory than its bytes)",
                    self.most
                )));
            }
            match seq.next_element::<Output>() {
                Ok(Some(output)) => outputs.push(output),
                Ok(None) => return Ok(outputs),
                Err(e) => {
                    return Err(de::Error::custom(format!("output change {position}: {e}")));
                }
            }
        }
    }
}

/// The part of a change its op cannot go without (`docs/abi.md`, "A
/// change"), so that a sink never receives an insert with no row.
fn check_change(change: &WireChange) -> Result<(), String> {
    let (needs, present) = match change.op {
        Op::Insert | Op::Update | Op::Snapshot => ("new", change.new.is_some()),
        Op::Delete => ("old", change.old.is_some()),
        Op::Truncate => ("truncate", change.truncate.is_some()),
        Op::Message => ("message", change.message.is_some()),
        Op::Schema => ("schema_change", change.schema_change.is_some()),
    };
    if present {
        Ok(())
    } else {
        Err(format!("{:?} change without `{needs}`", change.op).to_lowercase())
    }
}

/// Resolves a result envelope against the `input` items it answers.
pub(crate) fn decode_output(
    bytes: Vec<u8>,
    input: &[Item],
    source: &Batch,
) -> Result<Vec<Item>, TransformError> {
    // Bounded by the source batch, not this module's input: along a chain
    // each module could otherwise make 16 times what the previous one did.
    let most = most_changes(source.changes.len());
    let outputs = match decode_envelope(bytes, most) {
        Err(why) => {
            return Err(TransformError::InvalidOutput(format!(
                "the result envelope is invalid: {}",
                guest_text(&why)
            )));
        }
        Ok(Answer::Error(error)) => {
            return Err(TransformError::Guest {
                message: guest_text(&error.message),
                index: error.index,
            });
        }
        Ok(Answer::Changes(changes)) => changes,
        Ok(Answer::Neither) => {
            return Err(TransformError::InvalidOutput(
                "the result envelope has neither `changes` nor `error`".into(),
            ));
        }
    };
    // A kept change costs the module one byte and the host a whole input
    // change downstream (rendered by the sink, encoded for the next
    // module): keeping is bounded by the input, so a module cannot turn a
    // small answer into millions of rows.
    let most_kept = input.len().saturating_mul(MAX_KEPT_PER_INPUT);
    let kept = outputs
        .iter()
        .filter(|o| matches!(o, Output::Keep(_)))
        .count();
    if kept > most_kept {
        return Err(TransformError::InvalidOutput(format!(
            "the result keeps {kept} changes of a batch of {}: at most {MAX_KEPT_PER_INPUT} \
             times as many as it has",
            input.len()
        )));
    }
    let mut known = HashMap::new();
    outputs
        .into_iter()
        .enumerate()
        .map(|(position, output)| match output {
            Output::Keep(index) => input.get(index as usize).cloned().ok_or_else(|| {
                TransformError::InvalidOutput(format!(
                    "output change {position} keeps change {index}, but the batch has {} changes",
                    input.len()
                ))
            }),
            Output::Change(mut change) => {
                check_change(&change).map_err(|why| {
                    TransformError::InvalidOutput(format!("output change {position}: {why}"))
                })?;
                if change.columns.is_empty() {
                    change.columns = infer_columns(&change, input, source, &mut known).into();
                }
                Ok(Item::Wire(change))
            }
        })
        .collect()
}

/// How many times over a module's answer may keep its input's changes,
/// and hold changes in all for each change of the source batch (unless
/// that is under `MIN_MOST_CHANGES`).
const MAX_KEPT_PER_INPUT: usize = 16;

/// How many changes any answer may hold (a module that turns one row into
/// many has room), whatever the size of its batch.
pub(crate) const MIN_MOST_CHANGES: usize = 65_536;

/// How many changes an answer may hold, any module of the chain, for a
/// source batch of `source` changes.
fn most_changes(source: usize) -> usize {
    source
        .saturating_mul(MAX_KEPT_PER_INPUT)
        .max(MIN_MOST_CHANGES)
}

/// The input's columns of each table, found once per answer.
type KnownColumns = HashMap<(String, String), Option<Arc<[WireColumn]>>>;

/// Columns for a module's change that gave none: the input's columns of the
/// same table, restricted to and ordered as the keys of its row. `known`
/// keeps each table's, so that an answer of many changes does not search
/// the input for every one.
fn infer_columns(
    change: &WireChange,
    input: &[Item],
    source: &Batch,
    known: &mut KnownColumns,
) -> Vec<WireColumn> {
    let Some(row) = change.new.as_ref().or(change.old.as_ref()) else {
        return Vec::new();
    };
    let table = (change.schema.clone(), change.table.clone());
    let known = known
        .entry(table)
        .or_insert_with(|| input_columns(change, input, source).map(Into::into))
        .clone();
    let by_name: HashMap<&str, &WireColumn> = known
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    row.names()
        .map(|name| {
            by_name
                .get(name)
                .map(|c| (*c).clone())
                .unwrap_or_else(|| WireColumn {
                    name: name.to_owned(),
                    type_name: "unknown".into(),
                    key: false,
                })
        })
        .collect()
}

/// The columns of `change`'s table in the first input change of it.
fn input_columns(change: &WireChange, input: &[Item], source: &Batch) -> Option<Vec<WireColumn>> {
    input.iter().find_map(|item| match item {
        Item::Source(i) => source.changes.get(*i).and_then(|c| match c {
            Change::Insert { relation, .. }
            | Change::Snapshot { relation, .. }
            | Change::Update { relation, .. }
            | Change::Delete { relation, .. }
                if relation.schema == change.schema && relation.table == change.table =>
            {
                Some(relation.columns.iter().map(wire_column).collect())
            }
            _ => None,
        }),
        Item::Wire(c) if c.schema == change.schema && c.table == change.table => {
            Some(c.columns.to_vec())
        }
        Item::Wire(_) => None,
    })
}

fn wire_column(column: &Column) -> WireColumn {
    WireColumn {
        name: column.name.clone(),
        type_name: column.type_name.clone(),
        key: column.key,
    }
}

fn wire_row(relation: &Relation, values: &[Value], key_only: bool) -> wire::Row {
    wire::Row::from_fields(
        relation
            .columns
            .iter()
            .zip(values)
            .filter(|(c, _)| !key_only || c.key)
            .map(|(c, v)| (c.name.clone(), v.clone()))
            .collect(),
    )
}

/// A source change in the event model's shape (names copied per row: for
/// sinks and tests, not the transform hot path).
pub fn to_wire(change: &Change) -> WireChange {
    use datum_guest::Op;
    let row_change = |op, relation: &Arc<Relation>| {
        let mut c = WireChange::new(op, relation.schema.clone(), relation.table.clone());
        c.columns = relation.columns.iter().map(wire_column).collect();
        c
    };
    match change {
        Change::Insert { relation, new } => {
            let mut c = row_change(Op::Insert, relation);
            c.new = Some(wire_row(relation, new, false));
            c
        }
        Change::Snapshot { relation, new } => {
            let mut c = row_change(Op::Snapshot, relation);
            c.new = Some(wire_row(relation, new, false));
            c
        }
        Change::Update { relation, old, new } => {
            let mut c = row_change(Op::Update, relation);
            c.new = Some(wire_row(relation, new, false));
            c.old = old
                .as_ref()
                .map(|o| wire_row(relation, &o.values, o.key_only));
            c
        }
        Change::Delete { relation, old } => {
            let mut c = row_change(Op::Delete, relation);
            c.old = Some(wire_row(relation, &old.values, old.key_only));
            c
        }
        Change::Truncate {
            relations,
            cascade,
            restart_identity,
        } => {
            let first = relations.first();
            let mut c = WireChange::new(
                Op::Truncate,
                first.map(|r| r.schema.clone()).unwrap_or_default(),
                first.map(|r| r.table.clone()).unwrap_or_default(),
            );
            c.truncate = Some(wire::Truncate {
                tables: relations
                    .iter()
                    .map(|r| wire::TableName {
                        schema: r.schema.clone(),
                        table: r.table.clone(),
                    })
                    .collect(),
                cascade: *cascade,
                restart_identity: *restart_identity,
            });
            c
        }
        Change::Schema {
            relation,
            before,
            ddl,
        } => {
            let mut c = row_change(Op::Schema, relation);
            c.schema_change = Some(wire::SchemaChange {
                before: shape(before),
                after: shape(relation),
                ddl: ddl.clone(),
            });
            c
        }
        Change::Message {
            transactional,
            prefix,
            content,
            ..
        } => {
            let mut c = WireChange::new(Op::Message, "", "");
            c.message = Some(wire::LogicalMessage {
                prefix: prefix.clone(),
                content: content.clone(),
                transactional: *transactional,
            });
            c
        }
    }
}

/// A relation's shape as a `schema` change describes it.
pub(crate) fn shape(relation: &Relation) -> wire::TableShape {
    wire::TableShape {
        schema: relation.schema.clone(),
        table: relation.table.clone(),
        columns: relation
            .columns
            .iter()
            .map(|c| wire::ShapeColumn {
                name: c.name.clone(),
                type_name: c.type_name.clone(),
                sql_type: c.sql_type(),
                key: c.key,
            })
            .collect(),
        replica_identity: relation.replica_identity.name().to_owned(),
    }
}

/// Serialises a host change in the wire shape without copying it.
struct HostChange<'a>(&'a Change);

struct Columns<'a>(&'a [Column]);

impl Serialize for Columns<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Col<'a> {
            name: &'a str,
            #[serde(rename = "type")]
            type_name: &'a str,
            key: bool,
        }
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for c in self.0 {
            seq.serialize_element(&Col {
                name: &c.name,
                type_name: &c.type_name,
                key: c.key,
            })?;
        }
        seq.end()
    }
}

struct RowRef<'a> {
    columns: &'a [Column],
    values: &'a [Value],
    key_only: bool,
}

impl Serialize for RowRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = if self.key_only {
            self.columns.iter().filter(|c| c.key).count()
        } else {
            self.columns.len().min(self.values.len())
        };
        let mut map = serializer.serialize_map(Some(len))?;
        for (column, value) in self.columns.iter().zip(self.values) {
            if !self.key_only || column.key {
                map.serialize_entry(&column.name, value)?;
            }
        }
        map.end()
    }
}

fn old_ref<'a>(relation: &'a Relation, old: &'a OldRow) -> RowRef<'a> {
    RowRef {
        columns: &relation.columns,
        values: &old.values,
        key_only: old.key_only,
    }
}

impl Serialize for HostChange<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // MessagePack wants a map's length up front.
        let len = match self.0 {
            Change::Update { old: Some(_), .. } => 6,
            Change::Insert { .. }
            | Change::Snapshot { .. }
            | Change::Update { .. }
            | Change::Delete { .. } => 5,
            Change::Truncate { .. } | Change::Message { .. } | Change::Schema { .. } => {
                // Rare: not worth a borrowed form.
                return to_wire(self.0).serialize(serializer);
            }
        };
        let mut map = serializer.serialize_map(Some(len))?;
        match self.0 {
            Change::Insert { relation, new } | Change::Snapshot { relation, new } => {
                let op = match self.0 {
                    Change::Snapshot { .. } => "snapshot",
                    _ => "insert",
                };
                map.serialize_entry("op", op)?;
                map.serialize_entry("schema", &relation.schema)?;
                map.serialize_entry("table", &relation.table)?;
                map.serialize_entry("columns", &Columns(&relation.columns))?;
                map.serialize_entry(
                    "new",
                    &RowRef {
                        columns: &relation.columns,
                        values: new,
                        key_only: false,
                    },
                )?;
            }
            Change::Update { relation, old, new } => {
                map.serialize_entry("op", "update")?;
                map.serialize_entry("schema", &relation.schema)?;
                map.serialize_entry("table", &relation.table)?;
                map.serialize_entry("columns", &Columns(&relation.columns))?;
                map.serialize_entry(
                    "new",
                    &RowRef {
                        columns: &relation.columns,
                        values: new,
                        key_only: false,
                    },
                )?;
                if let Some(old) = old {
                    map.serialize_entry("old", &old_ref(relation, old))?;
                }
            }
            Change::Delete { relation, old } => {
                map.serialize_entry("op", "delete")?;
                map.serialize_entry("schema", &relation.schema)?;
                map.serialize_entry("table", &relation.table)?;
                map.serialize_entry("columns", &Columns(&relation.columns))?;
                map.serialize_entry("old", &old_ref(relation, old))?;
            }
            Change::Truncate { .. } | Change::Message { .. } | Change::Schema { .. } => {}
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ReplicaIdentity;
    use crate::event::TypeKind;
    use datum_guest::wire::Envelope;

    fn relation() -> Arc<Relation> {
        let column = |name: &str, type_name: &str, key| Column {
            name: name.into(),
            type_oid: 0,
            type_name: type_name.into(),
            type_modifier: -1,
            key,
            kind: TypeKind::Text,
        };
        Arc::new(Relation {
            oid: 1,
            schema: "public".into(),
            table: "users".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![column("id", "int4", true), column("email", "text", false)],
        })
    }

    fn batch() -> Batch {
        let relation = relation();
        Batch {
            txn: Txn {
                xid: 9,
                commit_lsn: 100,
                end_lsn: 108,
                commit_time: 5,
                chunk: 0,
                last: true,
            },
            changes: vec![
                Change::Insert {
                    relation: relation.clone(),
                    new: vec![Value::Int(1), Value::Text("a@b".into())],
                },
                Change::Update {
                    relation: relation.clone(),
                    old: Some(OldRow {
                        key_only: true,
                        values: vec![Value::Int(1), Value::Null],
                    }),
                    new: vec![Value::Int(2), Value::Unchanged],
                },
                Change::Delete {
                    relation,
                    old: OldRow {
                        key_only: true,
                        values: vec![Value::Int(2), Value::Null],
                    },
                },
            ],
            bytes: 0,
        }
    }

    #[test]
    fn the_borrowed_encoding_equals_the_event_model() {
        let batch = batch();
        let bytes =
            encode_input(&batch.txn, batch.changes.iter().map(ChangeRef::Source)).expect("encode");
        let decoded: wire::Batch = wire::from_msgpack(&bytes).expect("decode");
        let expected: Vec<WireChange> = batch.changes.iter().map(to_wire).collect();
        assert_eq!(decoded.txn, batch.txn);
        assert_eq!(decoded.changes, expected);
        // A key-only old row carries only the key.
        assert_eq!(
            decoded.changes[2]
                .old
                .as_ref()
                .map(|r| r.names().collect::<Vec<_>>()),
            Some(vec!["id"])
        );
    }

    /// The envelope as `rmp-serde` writes it from the borrowed changes:
    /// what `encode_input` must write, byte for byte.
    fn through_serde(txn: &Txn, changes: &[ChangeRef<'_>]) -> Vec<u8> {
        #[derive(Serialize)]
        struct Input<'a> {
            txn: &'a Txn,
            changes: &'a [ChangeRef<'a>],
        }
        wire::to_msgpack(&Input { txn, changes }).expect("encode")
    }

    #[test]
    fn heads_kept_between_calls_follow_a_table_that_changed_and_many_tables() {
        let mut heads = Heads::default();
        let insert = |relation: &Arc<Relation>| Change::Insert {
            relation: relation.clone(),
            new: relation.columns.iter().map(|_| Value::Int(1)).collect(),
        };
        let check = |heads: &mut Heads, change: &Change| {
            let txn = Txn::default();
            let kept = encode_input_with(&txn, std::iter::once(ChangeRef::Source(change)), heads)
                .expect("encode");
            let fresh =
                encode_input(&txn, std::iter::once(ChangeRef::Source(change))).expect("encode");
            assert_eq!(kept, fresh);
        };
        let first = relation();
        check(&mut heads, &insert(&first));
        // The same table after an ALTER: a new relation, whose head must
        // not be the old one's.
        let mut altered = (*first).clone();
        altered.columns.push(Column::new("name", "text", false));
        altered.columns[1].name = "mail".into();
        let altered = Arc::new(altered);
        check(&mut heads, &insert(&altered));
        // More tables than are kept, then the first again.
        let others: Vec<Arc<Relation>> = (0..HEADS_KEPT + 6)
            .map(|i| {
                let mut other = (*first).clone();
                other.table = format!("t{i}");
                Arc::new(other)
            })
            .collect();
        for other in &others {
            check(&mut heads, &insert(other));
        }
        assert!(heads.0.len() <= HEADS_KEPT);
        check(&mut heads, &insert(&first));
        check(&mut heads, &insert(&altered));
        // More tables than are kept in one call: every head is kept for
        // the call, and the next call starts over.
        let changes: Vec<Change> = others.iter().map(insert).collect();
        let txn = Txn::default();
        let kept = encode_input_with(&txn, changes.iter().map(ChangeRef::Source), &mut heads)
            .expect("encode");
        assert!(heads.0.len() >= others.len(), "cleared during the call");
        let fresh = encode_input(&txn, changes.iter().map(ChangeRef::Source)).expect("encode");
        assert_eq!(kept, fresh);
        check(&mut heads, &insert(&first));
        assert_eq!(heads.0.len(), 1);
    }

    #[test]
    fn a_transaction_is_encoded_byte_for_byte_as_rmp_serde_encodes_it() {
        let txns = [
            Txn::default(),
            Txn {
                xid: u32::MAX,
                commit_lsn: u64::MAX,
                end_lsn: 127,
                commit_time: i64::MIN,
                chunk: u32::MAX,
                last: true,
            },
            Txn {
                xid: 128,
                commit_lsn: 1 << 32,
                end_lsn: (1 << 32) + 48,
                commit_time: -33,
                chunk: 65_536,
                last: false,
            },
            Txn {
                commit_time: i64::MAX,
                ..Txn::default()
            },
        ];
        for txn in txns {
            let mut ours = Vec::new();
            write_txn(&mut ours, &txn).expect("writing into memory");
            let theirs = rmp_serde::to_vec_named(&txn).expect("a transaction serializes");
            assert_eq!(ours, theirs, "{txn:?}");
        }
    }

    #[test]
    fn the_direct_encoding_is_byte_for_byte_what_rmp_serde_writes() {
        let column = |name: &str, key| Column {
            name: name.into(),
            type_oid: 0,
            type_name: "text".into(),
            type_modifier: -1,
            key,
            kind: TypeKind::Text,
        };
        let values = vec![
            Value::Null,
            Value::Bool(true),
            Value::Bool(false),
            Value::Float(-2.5),
            Value::Text(String::new()),
            Value::Text("x".repeat(31)),
            Value::Text("é".repeat(40)),
            Value::Text("y".repeat(70_000)),
            Value::Bytes(vec![0, 1, 255]),
            Value::Numeric("12.50".into()),
            Value::Json("{\"a\": 1}".into()),
            Value::Uuid([7; 16]),
            Value::Time(86_399_999_999),
            Value::Array(vec![Value::Int(1), Value::Null, Value::Text("a".into())]),
            Value::Unchanged,
        ];
        let ints = [
            0,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            u32::MAX as i64,
            u32::MAX as i64 + 1,
            i64::MAX,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32_768,
            -32_769,
            i32::MIN as i64,
            i32::MIN as i64 - 1,
            i64::MIN,
        ];
        let values: Vec<Value> = values
            .into_iter()
            .chain(ints.into_iter().map(Value::Int))
            .collect();
        let wide = Arc::new(Relation {
            oid: 2,
            schema: "s".repeat(40),
            table: "wide".into(),
            replica_identity: ReplicaIdentity::Full,
            columns: (0..values.len())
                .map(|i| column(&format!("c{i}"), i < 2))
                .collect(),
        });
        let other = relation();
        let mut changes = batch().changes;
        changes.extend([
            Change::Snapshot {
                relation: wide.clone(),
                new: values.clone(),
            },
            Change::Insert {
                relation: other.clone(),
                new: vec![Value::Int(3), Value::Text("c@d".into())],
            },
            Change::Update {
                relation: wide.clone(),
                old: Some(OldRow {
                    key_only: false,
                    values: values.iter().rev().cloned().collect(),
                }),
                new: values.clone(),
            },
            Change::Delete {
                relation: wide.clone(),
                old: OldRow {
                    key_only: true,
                    values: values.clone(),
                },
            },
            // Fewer values than columns.
            Change::Insert {
                relation: wide.clone(),
                new: values[..3].to_vec(),
            },
            Change::Truncate {
                relations: vec![wide, other.clone()],
                cascade: true,
                restart_identity: false,
            },
            Change::Schema {
                relation: other.clone(),
                before: other,
                ddl: vec!["ALTER TABLE users ADD x int".into()],
            },
            Change::Message {
                transactional: false,
                lsn: crate::event::Lsn(5),
                prefix: "app".into(),
                content: b"hello".to_vec(),
            },
        ]);
        let made = WireChange::new(Op::Insert, "public", "made");
        let mut refs: Vec<ChangeRef<'_>> = changes.iter().map(ChangeRef::Source).collect();
        refs.insert(2, ChangeRef::Wire(&made));
        let txn = batch().txn;
        let direct = encode_input(&txn, refs.iter().copied()).expect("encode");
        assert!(
            direct == through_serde(&txn, &refs),
            "the direct encoding differs from rmp-serde's"
        );
        let empty = encode_input(&txn, std::iter::empty()).expect("encode");
        assert_eq!(empty, through_serde(&txn, &[]));
    }

    #[test]
    fn outputs_resolve_against_their_input() {
        let batch = batch();
        let input: Vec<Item> = (0..3).map(Item::Source).collect();
        let mut made = WireChange::new(datum_guest::Op::Insert, "public", "users");
        made.new = Some(wire::Row::from_fields(vec![("email".into(), "x".into())]));
        let envelope = Envelope::Changes {
            changes: vec![
                Output::Keep(2),
                Output::Change(Box::new(made)),
                Output::Keep(0),
            ],
        };
        let out = decode_output(wire::to_msgpack(&envelope).expect("encode"), &input, &batch)
            .expect("decode");
        assert_eq!(out[0], Item::Source(2));
        assert_eq!(out[2], Item::Source(0));
        let Item::Wire(made) = &out[1] else {
            panic!("{:?}", out[1])
        };
        assert_eq!(
            made.columns,
            vec![WireColumn {
                name: "email".into(),
                type_name: "text".into(),
                key: false
            }],
            "columns inferred from the input's table"
        );

        let bad = Envelope::Changes {
            changes: vec![Output::Keep(3)],
        };
        let err = decode_output(wire::to_msgpack(&bad).expect("encode"), &input, &batch)
            .expect_err("out of range");
        assert_eq!(err.kind(), "invalid_output");
        let err = decode_output(b"\xc1".to_vec(), &input, &batch).expect_err("garbage");
        assert_eq!(err.kind(), "invalid_output");
    }

    /// A kept change is one byte of the module's answer and a whole change
    /// downstream: an answer of millions of `0`s made millions of rows
    /// (gigabytes for the sink to render) out of one.
    #[test]
    fn an_answer_keeping_far_more_changes_than_the_batch_has_is_invalid() {
        let batch = batch();
        let input: Vec<Item> = (0..3).map(Item::Source).collect();
        let keeping = |n: usize| Envelope::Changes {
            changes: vec![Output::Keep(1); n],
        };
        let most = 3 * MAX_KEPT_PER_INPUT;
        let out = decode_output(
            wire::to_msgpack(&keeping(most)).expect("encode"),
            &input,
            &batch,
        )
        .expect("as many as allowed");
        assert_eq!(out.len(), most);
        let err = decode_output(
            wire::to_msgpack(&keeping(1_000)).expect("encode"),
            &input,
            &batch,
        )
        .expect_err("too many");
        assert_eq!(err.kind(), "invalid_output");
        assert!(
            err.to_string()
                .contains("keeps 1000 changes of a batch of 3"),
            "{err}"
        );
    }

    /// A change of a few bytes in a module's answer decodes to hundreds of
    /// bytes on the host: an answer of millions of tiny changes, within
    /// `max_output`, took gigabytes of the host's memory.
    #[test]
    fn an_answer_of_more_changes_than_a_batch_may_make_is_refused_before_it_is_decoded() {
        let batch = batch();
        let input: Vec<Item> = (0..3).map(Item::Source).collect();
        let mut made = WireChange::new(datum_guest::Op::Delete, "", "");
        made.old = Some(wire::Row::from_fields(vec![]));
        let making = |n: usize| Envelope::Changes {
            changes: vec![Output::Change(Box::new(made.clone())); n],
        };
        let out = decode_output(
            wire::to_msgpack(&making(MIN_MOST_CHANGES)).expect("encode"),
            &input,
            &batch,
        )
        .expect("as many as allowed");
        assert_eq!(out.len(), MIN_MOST_CHANGES);
        let many = wire::to_msgpack(&making(MIN_MOST_CHANGES + 1)).expect("encode");
        let err = decode_output(many, &input, &batch).expect_err("too many");
        assert_eq!(err.kind(), "invalid_output");
        assert!(err.to_string().contains("more than 65536 changes"), "{err}");
        // The same answer in another shape (a second key) is refused too.
        let mut other = vec![0x82];
        other.extend(wire::to_msgpack(&making(MIN_MOST_CHANGES + 1)).expect("encode")[1..].iter());
        other.extend(b"\xa5error\xc0");
        let err = decode_output(other, &input, &batch).expect_err("too many");
        assert!(err.to_string().contains("more than 65536 changes"), "{err}");
        // The bound follows the source batch, not the module's input: a
        // second module of a chain, given the first one's 65,536 changes,
        // may not make 16 times as many.
        let big: Vec<Item> = (0..MIN_MOST_CHANGES).map(|i| Item::Source(i % 3)).collect();
        let many = wire::to_msgpack(&making(MIN_MOST_CHANGES + 1)).expect("encode");
        let err = decode_output(many, &big, &batch).expect_err("chained");
        assert!(err.to_string().contains("more than 65536 changes"), "{err}");
        // A big source batch may make 16 per change.
        let mut source = batch.clone();
        source.changes = (0..5_000)
            .map(|i| source.changes[i % batch.changes.len()].clone())
            .collect();
        let out = decode_output(
            wire::to_msgpack(&making(70_000)).expect("encode"),
            &input,
            &source,
        )
        .expect("16 per source change");
        assert_eq!(out.len(), 70_000);
    }

    /// A module's error message went into the host's error, its log line
    /// and the dead letter as it came: a newline in it forged a log line,
    /// and megabytes of it were written for every failing batch.
    #[test]
    fn a_module_s_error_message_is_escaped_and_cut() {
        let batch = batch();
        let input: Vec<Item> = (0..3).map(Item::Source).collect();
        let failing = |message: String| Envelope::Error {
            error: GuestError {
                message,
                index: None,
            },
        };
        let err = decode_output(
            wire::to_msgpack(&failing(
                "bad\n2026-01-01T00:00:00Z  INFO datum: forged".into(),
            ))
            .expect("encode"),
            &input,
            &batch,
        )
        .expect_err("fails");
        let text = err.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("bad\\n2026"), "{text}");
        let err = decode_output(
            wire::to_msgpack(&failing("é".repeat(1_000_000))).expect("encode"),
            &input,
            &batch,
        )
        .expect_err("fails");
        let text = err.to_string();
        assert!(
            text.len() < 2 * super::super::sandbox::GUEST_TEXT_MAX,
            "{}",
            text.len()
        );
        assert!(
            text.ends_with("(2000000 bytes in all)"),
            "{}",
            &text[text.len() - 40..]
        );
    }
}
