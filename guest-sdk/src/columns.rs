//! A change's column list, shared by the changes of one table.
//!
//! Owns [`Columns`]: the changes of a batch mostly share one table's
//! columns, so reading a batch makes the list once per table and each change
//! holds a reference to it, with the MessagePack it came in; a list no
//! module changed is written back as those bytes. Changing a change's list
//! (through `DerefMut`) copies it for that change first.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::wire::Column;

/// The columns of a change's table, in order: a `Vec<Column>` to read and
/// change (`change.columns.iter()`, `.push(..)`, `.retain(..)`), shared with
/// the other changes of the same table until changed.
#[derive(Clone, Default)]
pub struct Columns(Arc<Shared>);

#[derive(Clone, Default)]
struct Shared {
    list: Vec<Column>,
    /// The list's MessagePack as it came in, until it is changed.
    raw: Option<Vec<u8>>,
}

impl Columns {
    /// No columns.
    pub fn new() -> Columns {
        Columns::default()
    }

    /// Whether there is no column.
    pub fn is_empty(&self) -> bool {
        self.0.list.is_empty()
    }

    /// A list read from `raw`, its MessagePack.
    pub(crate) fn read(list: Vec<Column>, raw: Vec<u8>) -> Columns {
        Columns(Arc::new(Shared {
            list,
            raw: Some(raw),
        }))
    }

    /// The MessagePack the list came in, if it is unchanged since.
    pub(crate) fn raw(&self) -> Option<&[u8]> {
        self.0.raw.as_deref()
    }
}

impl Deref for Columns {
    type Target = Vec<Column>;

    fn deref(&self) -> &Vec<Column> {
        &self.0.list
    }
}

impl DerefMut for Columns {
    fn deref_mut(&mut self) -> &mut Vec<Column> {
        let shared = Arc::make_mut(&mut self.0);
        shared.raw = None;
        &mut shared.list
    }
}

impl From<Vec<Column>> for Columns {
    fn from(list: Vec<Column>) -> Columns {
        Columns(Arc::new(Shared { list, raw: None }))
    }
}

impl From<Columns> for Vec<Column> {
    fn from(columns: Columns) -> Vec<Column> {
        match Arc::try_unwrap(columns.0) {
            Ok(shared) => shared.list,
            Err(shared) => shared.list.clone(),
        }
    }
}

impl FromIterator<Column> for Columns {
    fn from_iter<I: IntoIterator<Item = Column>>(iter: I) -> Columns {
        Columns::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Columns {
    type Item = &'a Column;
    type IntoIter = std::slice::Iter<'a, Column>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.list.iter()
    }
}

impl IntoIterator for Columns {
    type Item = Column;
    type IntoIter = std::vec::IntoIter<Column>;

    fn into_iter(self) -> Self::IntoIter {
        Vec::from(self).into_iter()
    }
}

impl PartialEq for Columns {
    fn eq(&self, other: &Columns) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.list == other.0.list
    }
}

impl Eq for Columns {}

impl PartialEq<Vec<Column>> for Columns {
    fn eq(&self, other: &Vec<Column>) -> bool {
        self.0.list == *other
    }
}

impl PartialEq<[Column]> for Columns {
    fn eq(&self, other: &[Column]) -> bool {
        self.0.list == other
    }
}

impl fmt::Debug for Columns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.list.fmt(f)
    }
}

impl Serialize for Columns {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.list.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Columns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Columns, D::Error> {
        Vec::<Column>::deserialize(deserializer).map(Columns::from)
    }
}
