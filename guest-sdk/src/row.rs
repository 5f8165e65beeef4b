//! A row whose values are decoded only when read.
//!
//! Owns [`Row`]'s representation: one cell per column, each either a value
//! the module set or the column's MessagePack in the batch it came in,
//! decoded the first time it is read. A module that reads one column of five
//! decodes one; a column it never changed is written back as the bytes it
//! came in (`write`), so the output of a map that edits one column costs
//! about that column. Reading the bytes (and checking that every value in
//! them decodes) belongs to `read`.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::wire::Value;

/// The buffer a decoded batch came in, shared by the rows read from it.
pub(crate) type Shared = Arc<Vec<u8>>;

/// A row: column names and values, in column order. Serialized as a map.
///
/// Values read from a batch are decoded when first read ([`Row::get`] and
/// the typed getters), and a value never changed is passed on as the bytes
/// it came in: reading one column of a wide row costs one column.
#[derive(Clone, Default)]
pub struct Row {
    cells: Vec<Cell>,
    /// What the cells' ranges point into.
    bytes: Option<Shared>,
}

#[derive(Clone)]
struct Cell {
    name: Name,
    /// The value, when the module set it (or built the row).
    set: Option<Value>,
    /// Otherwise the value's MessagePack in `Row::bytes`...
    raw: Range<usize>,
    /// ...decoded on first read.
    decoded: OnceLock<Value>,
}

#[derive(Clone)]
enum Name {
    Owned(String),
    /// The name's MessagePack string (`token`) and its text (`text`) in
    /// `Row::bytes`; `read` checked that the text is UTF-8.
    Raw {
        token: Range<usize>,
        text: Range<usize>,
    },
}

impl Name {
    fn as_str<'a>(&'a self, bytes: Option<&'a [u8]>) -> &'a str {
        match self {
            Name::Owned(name) => name,
            Name::Raw { text, .. } => bytes
                .and_then(|b| b.get(text.clone()))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or_default(),
        }
    }
}

impl Cell {
    fn owned(name: String, value: Value) -> Cell {
        Cell {
            name: Name::Owned(name),
            set: Some(value),
            raw: 0..0,
            decoded: OnceLock::new(),
        }
    }

    fn name<'a>(&'a self, bytes: Option<&'a [u8]>) -> &'a str {
        self.name.as_str(bytes)
    }

    fn name_is(&self, bytes: Option<&[u8]>, name: &str) -> bool {
        match &self.name {
            Name::Owned(own) => own == name,
            Name::Raw { text, .. } => {
                bytes.and_then(|b| b.get(text.clone())) == Some(name.as_bytes())
            }
        }
    }

    /// Decodes `raw`. `read` decoded the same bytes with the same code
    /// before it made the cell (`read::row`), so this does not fail.
    fn decode(&self, bytes: Option<&[u8]>) -> Value {
        bytes
            .and_then(|b| b.get(self.raw.clone()))
            .and_then(crate::read::value_of)
            .unwrap_or(Value::Null)
    }

    fn value<'a>(&'a self, bytes: Option<&[u8]>) -> &'a Value {
        match &self.set {
            Some(value) => value,
            None => self.decoded.get_or_init(|| self.decode(bytes)),
        }
    }

    /// The value to change: from now on it is no longer the bytes it came in.
    fn value_mut(&mut self, bytes: Option<&[u8]>) -> &mut Value {
        if self.set.is_none() {
            let value = match self.decoded.take() {
                Some(value) => value,
                None => self.decode(bytes),
            };
            self.set = Some(value);
        }
        self.set.get_or_insert(Value::Null)
    }

    fn into_value(mut self, bytes: Option<&[u8]>) -> Value {
        match self.set.take() {
            Some(value) => value,
            None => match self.decoded.take() {
                Some(value) => value,
                None => self.decode(bytes),
            },
        }
    }
}

impl Row {
    /// An empty row.
    pub fn new() -> Row {
        Row::default()
    }

    /// A row from `(name, value)` pairs, in order.
    pub fn from_fields(fields: Vec<(String, Value)>) -> Row {
        Row {
            cells: fields
                .into_iter()
                .map(|(name, value)| Cell::owned(name, value))
                .collect(),
            bytes: None,
        }
    }

    /// A row read from `bytes`: `(name token, name text, value)` ranges.
    pub(crate) fn from_raw(bytes: Shared, cells: Vec<[Range<usize>; 3]>) -> Row {
        Row {
            cells: cells
                .into_iter()
                .map(|[token, text, value]| Cell {
                    name: Name::Raw { token, text },
                    set: None,
                    raw: value,
                    decoded: OnceLock::new(),
                })
                .collect(),
            bytes: Some(bytes),
        }
    }

    fn buf(&self) -> Option<&[u8]> {
        self.bytes.as_deref().map(Vec::as_slice)
    }

    /// The `(name, value)` pairs, in order.
    pub fn fields(&self) -> Fields<'_> {
        Fields {
            cells: self.cells.iter(),
            bytes: self.buf(),
        }
    }

    /// Consumes the row into its `(name, value)` pairs.
    pub fn into_fields(self) -> Vec<(String, Value)> {
        let bytes = self.bytes;
        let buf = bytes.as_deref().map(Vec::as_slice);
        self.cells
            .into_iter()
            .map(|cell| {
                let name = cell.name(buf).to_owned();
                (name, cell.into_value(buf))
            })
            .collect()
    }

    fn position(&self, name: &str) -> Option<usize> {
        let buf = self.buf();
        self.cells.iter().position(|c| c.name_is(buf, name))
    }

    /// The value of a column, if the row has it.
    pub fn get(&self, name: &str) -> Option<&Value> {
        let buf = self.buf();
        self.cells
            .iter()
            .find(|c| c.name_is(buf, name))
            .map(|c| c.value(buf))
    }

    /// A mutable reference to a column's value.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Value> {
        let index = self.position(name)?;
        let buf = self.bytes.as_deref().map(Vec::as_slice);
        self.cells.get_mut(index).map(|c| c.value_mut(buf))
    }

    /// Sets a column, replacing its value or appending it; returns the old
    /// value.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<Value>) -> Option<Value> {
        let name = name.into();
        let value = value.into();
        match self.get_mut(&name) {
            Some(slot) => Some(std::mem::replace(slot, value)),
            None => {
                self.cells.push(Cell::owned(name, value));
                None
            }
        }
    }

    /// Removes a column; returns its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        let index = self.position(name)?;
        let cell = self.cells.remove(index);
        Some(cell.into_value(self.buf()))
    }

    /// Whether the row has a column of that name.
    pub fn contains(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    /// Column names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let buf = self.buf();
        self.cells.iter().map(move |c| c.name(buf))
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether the row has no column.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The `(name, value)` pairs with mutable values, in order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = (&str, &mut Value)> {
        let buf = self.bytes.as_deref().map(Vec::as_slice);
        self.cells.iter_mut().map(move |cell| {
            cell.value_mut(buf);
            let Cell { name, set, .. } = cell;
            (name.as_str(buf), set.get_or_insert(Value::Null))
        })
    }

    /// Keeps only the columns for which `keep(name, value)` holds, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &Value) -> bool) {
        let buf = self.bytes.as_deref().map(Vec::as_slice);
        self.cells.retain(|c| keep(c.name(buf), c.value(buf)));
    }

    /// Renames a column in place (its position is kept); returns whether the
    /// row had it.
    pub fn rename(&mut self, from: &str, to: impl Into<String>) -> bool {
        match self.position(from).and_then(|i| self.cells.get_mut(i)) {
            Some(cell) => {
                cell.name = Name::Owned(to.into());
                true
            }
            None => false,
        }
    }

    /// Appends the row's MessagePack (a map) to `out`: the bytes a value or
    /// a name came in where it is unchanged, the rest encoded.
    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), rmp_serde::encode::Error> {
        let buf = self.buf();
        let len = u32::try_from(self.cells.len())
            .map_err(|_| rmp_serde::encode::Error::Syntax("a row of 2^32 columns".into()))?;
        rmp::encode::write_map_len(out, len)?;
        for cell in &self.cells {
            let name = match &cell.name {
                Name::Raw { token, .. } => buf.and_then(|b| b.get(token.clone())),
                Name::Owned(_) => None,
            };
            match name {
                Some(token) => out.extend_from_slice(token),
                None => rmp::encode::write_str(out, cell.name(buf))?,
            }
            match (&cell.set, buf.and_then(|b| b.get(cell.raw.clone()))) {
                (None, Some(raw)) => out.extend_from_slice(raw),
                _ => rmp_serde::encode::write_named(out, cell.value(buf))?,
            }
        }
        Ok(())
    }
}

/// The `(name, value)` pairs of a [`Row`], in order: [`Row::fields`].
#[derive(Clone)]
pub struct Fields<'a> {
    cells: std::slice::Iter<'a, Cell>,
    bytes: Option<&'a [u8]>,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (&'a str, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        let cell = self.cells.next()?;
        Some((cell.name(self.bytes), cell.value(self.bytes)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.cells.size_hint()
    }
}

impl fmt::Debug for Fields<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

impl DoubleEndedIterator for Fields<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let cell = self.cells.next_back()?;
        Some((cell.name(self.bytes), cell.value(self.bytes)))
    }
}

impl ExactSizeIterator for Fields<'_> {}

impl<'a> IntoIterator for &'a Row {
    type Item = (&'a str, &'a Value);
    type IntoIter = Fields<'a>;

    fn into_iter(self) -> Fields<'a> {
        self.fields()
    }
}

impl IntoIterator for Row {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_fields().into_iter()
    }
}

impl PartialEq for Row {
    fn eq(&self, other: &Row) -> bool {
        self.len() == other.len() && self.fields().eq(other.fields())
    }
}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Row")
            .field("fields", &self.fields().collect::<Vec<_>>())
            .finish()
    }
}

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (name, value) in self.fields() {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Row {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Row, D::Error> {
        struct RowVisitor;
        impl<'de> Visitor<'de> for RowVisitor {
            type Value = Row;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of column names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Row, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
                while let Some((name, value)) = map.next_entry::<String, Value>()? {
                    fields.push((name, value));
                }
                Ok(Row::from_fields(fields))
            }
        }
        deserializer.deserialize_map(RowVisitor)
    }
}
