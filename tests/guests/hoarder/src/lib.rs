//! A guest for the allocator's tests, not an example to copy: it keeps
//! memory from one call to the next, the case where a module's allocations
//! must never be handed out twice.
//!
//! Each change adds a string to a list that every 7th change empties
//! (memory held across calls, then returned), and every 3rd change adds one
//! to a list kept for ever (more than the allocator's region holds, in a
//! long run). A string's text follows from its position, so it can be
//! checked: every new row gets `kept` (the lengths of both lists) and
//! `intact` (whether the strings checked still read as written: the short
//! list whole, and of the long one the first, the last, a few in between,
//! and all of it every 100th change).

use std::sync::Mutex;

use datum_guest::{Change, Result, map};

#[derive(Default)]
struct Kept {
    changes: u64,
    short: Vec<String>,
    long: Vec<String>,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    changes: 0,
    short: Vec::new(),
    long: Vec::new(),
});

fn text(n: usize) -> String {
    format!("kept-{n}-{}", "x".repeat(n % 97))
}

fn intact(list: &[String], indexes: impl Iterator<Item = usize>) -> bool {
    indexes
        .filter_map(|i| list.get(i).map(|s| (i, s)))
        .all(|(i, s)| *s == text(i))
}

/// Keeps, checks and stamps.
#[map]
pub fn hoard(mut change: Change) -> Result<Change> {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    kept.changes += 1;
    let n = kept.changes;
    if n.is_multiple_of(7) {
        kept.short = Vec::new();
    }
    let next = kept.short.len();
    kept.short.push(text(next));
    if n.is_multiple_of(3) {
        let next = kept.long.len();
        kept.long.push(text(next));
    }
    let long = kept.long.len();
    let sampled = [
        0,
        long / 3,
        long / 2,
        (n as usize * 7919) % long.max(1),
        long.saturating_sub(1),
    ];
    let ok = intact(&kept.short, 0..kept.short.len())
        && if n.is_multiple_of(100) {
            intact(&kept.long, 0..long)
        } else {
            intact(&kept.long, sampled.into_iter())
        };
    change.set_column("kept", "text", format!("{}/{}", kept.short.len(), long));
    change.set_column("intact", "bool", ok);
    Ok(change)
}
