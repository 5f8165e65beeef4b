//! The WASI preview 1 context a module runs in: nothing granted, output
//! captured, time and randomness taken from the batch.
//!
//! Owns the module's view of the outside world. No preopened directory,
//! environment variable, argument or socket exists; stdout and stderr go to
//! capped in-memory buffers drained after each call; every clock reads the
//! batch's commit time and `random_get` draws from a generator reseeded for
//! each batch, so the same input always gives the same output.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{OutputStream, StreamResult};

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

impl HostWallClock for BatchClock {
    fn resolution(&self) -> Duration {
        Duration::from_micros(1)
    }

    fn now(&self) -> Duration {
        let micros = self.0.commit_time.load(Ordering::Relaxed);
        Duration::from_micros(micros.max(0) as u64)
    }
}

impl HostMonotonicClock for BatchClock {
    fn resolution(&self) -> u64 {
        1_000
    }

    fn now(&self) -> u64 {
        let micros = self.0.commit_time.load(Ordering::Relaxed);
        (micros.max(0) as u64).saturating_mul(1_000)
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
