//! The WASI preview 1 context a module runs in: nothing granted, output
//! captured, time and randomness taken from the batch, no call that waits.
//!
//! Owns the module's view of the outside world. No preopened directory,
//! environment variable, argument or socket exists; stdout and stderr go to
//! capped in-memory buffers drained after each call, and are escaped before
//! they reach a log; every clock reads the batch's commit time and
//! `random_get` draws from a generator reseeded for each batch, so the same
//! input always gives the same output. Since the batch's clock stands still,
//! `poll_oneoff` never waits: a sleep is over at once. Also owns driving a
//! call to its end or to its wall-clock deadline, whichever comes first
//! ([`block_on_until`]).

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{OutputStream, StreamResult};

use wasmtime::{Caller, Extern, Linker};

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

struct BatchClock(Arc<CallEnv>);

impl BatchClock {
    /// The commit time in nanoseconds since the Unix epoch, as WASI can say
    /// it: its timestamps are unsigned 64-bit nanoseconds, so a time before
    /// 1970 reads as the epoch and one after 2554 as the last nanosecond
    /// (`docs/abi.md`, "The sandbox").
    fn nanos(&self) -> u64 {
        let micros = self.0.commit_time.load(Ordering::Relaxed);
        u64::try_from(micros).unwrap_or(0).saturating_mul(1_000)
    }
}

impl HostWallClock for BatchClock {
    fn resolution(&self) -> Duration {
        Duration::from_micros(1)
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }
}

impl HostMonotonicClock for BatchClock {
    fn resolution(&self) -> u64 {
        1_000
    }

    fn now(&self) -> u64 {
        self.nanos()
    }
}

/// SplitMix64 over the per-batch state: small, fast, and reproducible.
struct BatchRng(Arc<CallEnv>);

impl BatchRng {
    fn next(&mut self) -> u64 {
        let state = self
            .0
            .rng_state
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl rand_core::TryRng for BatchRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.next() as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.next())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
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

    fn push(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.cap.saturating_sub(buffer.bytes.len());
        let take = room.min(bytes.len());
        buffer.bytes.extend_from_slice(&bytes[..take]);
        buffer.dropped += bytes.len() - take;
    }

    /// Takes what was written since the last drain.
    pub(crate) fn drain(&self) -> Captured {
        std::mem::take(&mut *self.buffer.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        // Beyond the cap bytes are dropped, not refused: a chatty module
        // must not fail because of its logging.
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
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

/// A WASI context that grants nothing and reads time and randomness from
/// `env`.
pub(crate) fn wasi_ctx(env: &Arc<CallEnv>, stdout: &Capture, stderr: &Capture) -> WasiP1Ctx {
    WasiCtxBuilder::new()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .wall_clock(BatchClock(env.clone()))
        .monotonic_clock(BatchClock(env.clone()))
        .secure_random(BatchRng(env.clone()))
        .insecure_random(BatchRng(env.clone()))
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build_p1()
}

/// Wakes the thread that drives a call.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A runtime whose context a call runs in, in case a WASI function reaches
/// for Tokio's timers or blocking pool; the call itself is driven on the
/// caller's thread by [`block_on_until`], never by this runtime.
fn io_runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("wasm-io")
                .enable_all()
                .build()
                .ok()
        })
        .as_ref()
}

/// Drives `call` (a wasm call and the host functions it makes) on this
/// thread until it finishes or the wall clock passes `deadline`; `None`
/// means the deadline came first and the call was dropped, which cancels
/// it wherever it was, a host function included.
///
/// Wasm code running past the deadline is stopped by the epoch callback
/// (see `module.rs`); this bounds the time a call spends waiting in the
/// host. Usable on any thread, inside an async runtime or not (the thread
/// blocks, as a synchronous call would).
pub(crate) fn block_on_until<F: Future>(deadline: Instant, call: F) -> Option<F::Output> {
    let _context = io_runtime().map(tokio::runtime::Runtime::enter);
    let mut call = std::pin::pin!(call);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = call.as_mut().poll(&mut cx) {
            return Some(output);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout(deadline - now);
    }
}

// WASI preview 1 errnos.
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_BADF: i32 = 8;
const ERRNO_INVAL: i32 = 28;

// The preview 1 layouts of `subscription` and `event`.
const SUBSCRIPTION_SIZE: usize = 48;
const EVENT_SIZE: usize = 32;
const EVENTTYPE_CLOCK: u8 = 0;
const EVENTTYPE_FD_READ: u8 = 1;
const EVENTTYPE_FD_WRITE: u8 = 2;
const CLOCK_REALTIME: u32 = 0;
const CLOCK_MONOTONIC: u32 = 1;
const SUBCLOCKFLAGS_ABSTIME: u16 = 1;

/// Replaces the WASI functions whose preview 1 implementation waits or
/// traps on a module's arguments with ones that do neither, for a sandbox
/// that grants nothing. Call after adding WASI to `linker`.
pub(crate) fn replace_waiting_and_trapping_calls<T: Send + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.func_wrap("wasi_snapshot_preview1", "poll_oneoff", poll_oneoff::<T>)?;
    // Nothing is preopened, so no descriptor is a directory and every
    // `path_open` fails with EBADF, as the preview 1 implementation answers
    // for a valid call; that implementation traps instead when a flags
    // argument has a bit it does not know (every rights bit set, say).
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "path_open",
        |_: Caller<'_, T>,
         _dirfd: i32,
         _dirflags: i32,
         _path: i32,
         _path_len: i32,
         _oflags: i32,
         _rights: i64,
         _inheriting: i64,
         _fdflags: i32,
         _opened: i32|
         -> i32 { ERRNO_BADF },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// `poll_oneoff(in, out, nsubscriptions, nevents) -> errno` on the batch's
/// clock, which stands still: every clock subscription (relative or
/// absolute, realtime or monotonic) is due at once, and so are reading
/// stdin (closed: end of file) and writing stdout or stderr (captured), so
/// nothing ever waits. Other descriptors do not exist (EBADF), other clocks
/// cannot be waited on (EINVAL), as in wasmtime's implementation; so is
/// `nsubscriptions == 0` (EINVAL) and a pointer outside memory (a trap).
fn poll_oneoff<T>(
    mut caller: Caller<'_, T>,
    subscriptions: i32,
    events: i32,
    count: i32,
    nevents: i32,
) -> wasmtime::Result<i32> {
    let Some(memory) = caller.get_export("memory").and_then(Extern::into_memory) else {
        wasmtime::bail!("poll_oneoff: the module exports no memory");
    };
    let count = count as u32 as usize;
    if count == 0 {
        return Ok(ERRNO_INVAL);
    }
    let memory = memory.data_mut(&mut caller);
    let size = memory.len();
    let region = |ptr: i32, each: usize, align: usize, what: &str| {
        let start = ptr as u32 as usize;
        match count
            .checked_mul(each)
            .and_then(|len| start.checked_add(len))
        {
            Some(end) if end <= size && start.is_multiple_of(align) => Ok(start..end),
            _ => Err(wasmtime::format_err!(
                "poll_oneoff: {what} at {start} lie outside memory or are misaligned"
            )),
        }
    };
    let subscriptions = region(subscriptions, SUBSCRIPTION_SIZE, 8, "the subscriptions")?;
    let events = region(events, EVENT_SIZE, 8, "the events")?;
    let nevents = {
        let start = nevents as u32 as usize;
        match start.checked_add(4) {
            Some(end) if end <= size && start.is_multiple_of(4) => start..end,
            _ => wasmtime::bail!("poll_oneoff: the event count lies outside memory"),
        }
    };
    let mut answers = Vec::with_capacity(count);
    for sub in memory[subscriptions].chunks_exact(SUBSCRIPTION_SIZE) {
        let u32_at =
            |at: usize| u32::from_le_bytes([sub[at], sub[at + 1], sub[at + 2], sub[at + 3]]);
        let userdata = &sub[0..8];
        let kind = match sub[8] {
            EVENTTYPE_CLOCK => {
                let clock = u32_at(16);
                let flags = u16::from_le_bytes([sub[40], sub[41]]);
                if flags & !SUBCLOCKFLAGS_ABSTIME != 0
                    || !matches!(clock, CLOCK_REALTIME | CLOCK_MONOTONIC)
                {
                    return Ok(ERRNO_INVAL);
                }
                EVENTTYPE_CLOCK
            }
            EVENTTYPE_FD_READ if u32_at(16) == 0 => EVENTTYPE_FD_READ,
            EVENTTYPE_FD_WRITE if matches!(u32_at(16), 1 | 2) => EVENTTYPE_FD_WRITE,
            EVENTTYPE_FD_READ | EVENTTYPE_FD_WRITE => return Ok(ERRNO_BADF),
            _ => return Ok(ERRNO_INVAL),
        };
        let mut event = [0u8; EVENT_SIZE];
        event[0..8].copy_from_slice(userdata);
        // error (u16 at 8) is success; type at 10; fd_readwrite.nbytes at
        // 16 is 1 for a ready descriptor, as wasmtime reports it.
        event[10] = kind;
        if kind != EVENTTYPE_CLOCK {
            event[16] = 1;
        }
        answers.push(event);
    }
    for (slot, event) in memory[events].chunks_exact_mut(EVENT_SIZE).zip(&answers) {
        slot.copy_from_slice(event);
    }
    memory[nevents].copy_from_slice(&(answers.len() as u32).to_le_bytes());
    Ok(ERRNO_SUCCESS)
}
