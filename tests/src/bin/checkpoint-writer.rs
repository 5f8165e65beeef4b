//! Commits ever larger offsets to a state file as fast as it can, printing
//! each one once `commit_offset` has returned; the crash-consistency test
//! kills it with SIGKILL at random moments.
//!
//! `checkpoint-writer STATE`: continues from the offsets in the file.

use std::io::Write;

use datum::{Lsn, Offset, Store};

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: checkpoint-writer STATE");
    let store = Store::open(&path).unwrap_or_else(|err| panic!("{err}"));
    // From the lower of the two: a writer killed between its two commits
    // left `q` one behind, and going on from `p` would leave it two behind
    // after another such kill, which the test reads as a torn write.
    let stored = |name| {
        store
            .offset(name)
            .expect("read")
            .map(|o| o.end_lsn.0)
            .unwrap_or(0)
    };
    let mut next = stored("p").min(stored("q")) + 1;
    let mut out = std::io::stdout().lock();
    loop {
        // Half the pipelines' offsets in one commit, so that a torn write
        // would show as a mismatch between them.
        for name in ["p", "q"] {
            store
                .commit_offset(
                    name,
                    Offset {
                        end_lsn: Lsn(next),
                        commit_lsn: Lsn(next),
                        ..Offset::default()
                    },
                )
                .expect("commit");
        }
        writeln!(out, "{next}").expect("stdout");
        out.flush().expect("stdout");
        next += 1;
    }
}
