//! What a module's world is made of: the batch's time and randomness,
//! and captured output.
//!
//! Owns the per-call environment the WASI functions (`wasi`) read: the
//! realtime and monotonic clocks read the batch's commit time and `random_get` draws from a
//! generator reseeded for each batch, so the same input always gives the
//! same output ([`CallEnv`]); stdout and stderr go to capped in-memory
//! buffers drained after each call ([`Capture`]), and are escaped before
//! they reach a log ([`escape_for_log`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the sandbox reads per call: set by the host before each call.
#[derive(Debug, Default)]
pub(crate) struct CallEnv {
    /// The batch's commit time, µs since the Unix epoch.
    pub(crate) commit_time: AtomicI64,
    /// The random generator's state; reseeded per batch.
    pub(crate) rng_state: AtomicU64,
}

impl CallEnv {
    pub(crate) fn prepare(&self, commit_time: i64, seed: u64) {
        self.commit_time.store(commit_time, Ordering::Relaxed);
        self.rng_state.store(seed, Ordering::Relaxed);
    }
}

impl CallEnv {
    /// The batch's commit time, µs since the Unix epoch.
    pub(crate) fn commit_time(&self) -> i64 {
        self.commit_time.load(Ordering::Relaxed)
    }

    /// Fills `dst` from the batch's generator: SplitMix64 over the
    /// per-batch state, small, fast and reproducible.
    pub(crate) fn fill_random(&self, dst: &mut [u8]) {
        // The state is read and written once per call, not per word: a
        // call may fill the whole of a module's memory.
        let mut state = self.rng_state.load(Ordering::Relaxed);
        for chunk in dst.chunks_mut(8) {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let bytes = (z ^ (z >> 31)).to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        self.rng_state.store(state, Ordering::Relaxed);
    }
}

/// A capped, drainable buffer for one output stream.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub(crate) bytes: Vec<u8>,
    pub(crate) dropped: usize,
}

#[derive(Clone)]
pub(crate) struct Capture {
    buffer: Arc<Mutex<Captured>>,
    cap: usize,
}

impl Capture {
    pub(crate) fn new(cap: usize) -> Capture {
        Capture {
            buffer: Arc::default(),
            cap,
        }
    }

    /// Keeps what fits under the cap and counts the rest as dropped.
    pub(crate) fn push(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.cap.saturating_sub(buffer.bytes.len());
        let take = room.min(bytes.len());
        buffer.bytes.extend_from_slice(&bytes[..take]);
        buffer.dropped = buffer.dropped.saturating_add(bytes.len() - take);
    }

    /// Takes what was written since the last drain.
    pub(crate) fn drain(&self) -> Captured {
        std::mem::take(&mut *self.buffer.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Captured module output as one log line shows it: every control character
/// (CR, NUL, ESC, tab, DEL, C1) and every bidirectional-text control is
/// written as an escape (`\r`, `\0`, `\u{1b}`), so that a module cannot
/// rewrite, hide or forge log lines on a terminal or in a text file.
pub(crate) fn escape_for_log(line: &str) -> std::borrow::Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !line.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\0' => out.push_str("\\0"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Most bytes of a module's own text (its error message, a panic message)
/// an error keeps.
pub(crate) const GUEST_TEXT_MAX: usize = 4096;

/// Text a module wrote into an error, as the host's errors, logs and dead
/// letters carry it: escaped like [`escape_for_log`] (a `\n` in it cannot
/// forge a log line) and cut to [`GUEST_TEXT_MAX`] bytes.
pub(crate) fn guest_text(text: &str) -> String {
    let escaped = escape_for_log(text);
    if escaped.len() <= GUEST_TEXT_MAX {
        return escaped.into_owned();
    }
    let mut end = GUEST_TEXT_MAX;
    while !escaped.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &escaped[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_filled_in_pieces_of_whole_words_are_those_of_one_fill() {
        let (whole, pieces) = (CallEnv::default(), CallEnv::default());
        whole.prepare(0, 42);
        pieces.prepare(0, 42);
        let mut a = vec![0u8; 3 * 64 + 5];
        let mut b = a.clone();
        whole.fill_random(&mut a);
        for piece in b.chunks_mut(64) {
            pieces.fill_random(piece);
        }
        assert_eq!(a, b);
        assert!(a.iter().any(|&x| x != 0));
    }

    #[test]
    fn log_lines_escape_every_control_character() {
        let line = "a\rb\0c\u{1b}[31md\te\u{7f}f\u{85}g\u{202e}h\u{2066}i ok é";
        assert_eq!(
            escape_for_log(line),
            r"a\rb\0c\u{1b}[31md\te\u{7f}f\u{85}g\u{202e}h\u{2066}i ok é"
        );
        assert!(matches!(
            escape_for_log("plain text"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
