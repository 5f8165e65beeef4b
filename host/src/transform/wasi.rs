//! WASI preview 1 (`wasi_snapshot_preview1`) for a sandbox that grants
//! nothing: all 46 of its functions, written out here.
//!
//! Owns what each function answers. The only descriptors are 0, 1 and 2:
//! stdin is closed (reading it is end of file), stdout and stderr write to
//! the call's capped buffers ([`Capture`]). No directory is preopened, so
//! every `path_*` call fails with `EBADF`; there is no socket, environment
//! variable or argument; the realtime and monotonic clocks read the batch's
//! commit time and
//! `random_get` the batch's generator ([`CallEnv`]), stopping at the call's
//! deadline when asked to fill much; nothing waits.
//! A call that needs what does not exist answers the errno a real system
//! gives for it (`EBADF`, `ESPIPE`, `ENOTSOCK`, …); a pointer or length
//! outside the module's memory is a trap, and so is `proc_exit`, whose
//! error names the status.
//!
//! Written here rather than taken from `wasmtime-wasi`: that crate brings
//! the component model and a filesystem and network layer, none of which a
//! sandbox that grants nothing uses, and they were a large part of building
//! the host.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use wasmtime::{Caller, Extern, Linker};

use super::sandbox::{CallEnv, Capture};

const MODULE: &str = "wasi_snapshot_preview1";

// Errnos of preview 1.
const SUCCESS: i32 = 0;
const BADF: i32 = 8;
const INVAL: i32 = 28;
const NOTDIR: i32 = 54;
const NOTSOCK: i32 = 57;
const NOTSUP: i32 = 58;
const SPIPE: i32 = 70;

// Rights of the standard descriptors, as `fd_fdstat_get` reports them.
const RIGHT_FD_READ: u64 = 1 << 1;
const RIGHT_FD_WRITE: u64 = 1 << 6;

// Clocks.
const CLOCK_REALTIME: u32 = 0;
const CLOCK_MONOTONIC: u32 = 1;
const CLOCK_PROCESS_CPUTIME: u32 = 2;
const CLOCK_THREAD_CPUTIME: u32 = 3;
/// The batch's clock counts in microseconds.
const CLOCK_RESOLUTION_NS: u64 = 1_000;

/// Most buffers one `fd_write` or `fd_read` names (`IOV_MAX` on Linux): a
/// host function cannot be interrupted, so what it loops over is bounded.
/// More is EINVAL.
const IOV_MAX: u32 = 1024;

// The layouts of `subscription` and `event` (`poll_oneoff`).
const SUBSCRIPTION_SIZE: usize = 48;
const EVENT_SIZE: usize = 32;
const EVENTTYPE_CLOCK: u8 = 0;
const EVENTTYPE_FD_READ: u8 = 1;
const EVENTTYPE_FD_WRITE: u8 = 2;
const SUBCLOCKFLAGS_ABSTIME: u16 = 1;
/// Bytes `random_get` fills between two looks at the call's deadline (a
/// multiple of the generator's 8-byte words).
const RANDOM_PIECE: usize = 1 << 20;

/// Most subscriptions one `poll_oneoff` takes; more is EINVAL. Its answers
/// are gathered before they are written (subscriptions and events may
/// share memory), so their number is bounded.
const MAX_SUBSCRIPTIONS: usize = 4096;

/// What a standard descriptor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stdio {
    In,
    Out,
    Err,
}

/// One instance's WASI state: its descriptors, and where time, randomness
/// and output go.
pub(crate) struct Wasi {
    env: Arc<CallEnv>,
    stdout: Capture,
    stderr: Capture,
    /// Descriptors 0, 1 and 2, or `None` once closed (or renumbered away).
    fds: [Option<Stdio>; 3],
}

impl Wasi {
    pub(crate) fn new(env: &Arc<CallEnv>, stdout: &Capture, stderr: &Capture) -> Wasi {
        Wasi {
            env: env.clone(),
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            fds: [Some(Stdio::In), Some(Stdio::Out), Some(Stdio::Err)],
        }
    }

    fn fd(&self, fd: i32) -> Option<Stdio> {
        usize::try_from(fd)
            .ok()
            .and_then(|i| self.fds.get(i).copied().flatten())
    }

    /// The errno of a call on `fd`: `EBADF` when it does not exist, else
    /// what `on` says for the descriptor.
    fn answer(&self, fd: i32, on: impl FnOnce(Stdio) -> i32) -> i32 {
        self.fd(fd).map_or(BADF, on)
    }
}

/// A store's data that holds a [`Wasi`].
pub(crate) trait WasiView {
    fn wasi(&mut self) -> &mut Wasi;
    /// When the running call must have returned, on the wall clock.
    fn deadline(&self) -> Instant;
}

/// A module's memory, as one call of a WASI function reads and writes it.
/// Every access is bounds-checked; one outside memory or misaligned is an
/// error, which traps the call.
struct Guest<'a> {
    mem: &'a mut [u8],
    func: &'static str,
}

impl Guest<'_> {
    fn range(
        &self,
        ptr: i32,
        len: usize,
        align: usize,
        what: &str,
    ) -> wasmtime::Result<Range<usize>> {
        let start = ptr as u32 as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.mem.len() && start.is_multiple_of(align) => Ok(start..end),
            _ => Err(wasmtime::format_err!(
                "{}: {what} ({len} bytes at {start}) lies outside the module's memory or is \
                 misaligned",
                self.func
            )),
        }
    }

    fn bytes(&self, ptr: i32, len: usize, what: &str) -> wasmtime::Result<&[u8]> {
        let range = self.range(ptr, len, 1, what)?;
        Ok(&self.mem[range])
    }

    fn bytes_mut(&mut self, ptr: i32, len: usize, what: &str) -> wasmtime::Result<&mut [u8]> {
        let range = self.range(ptr, len, 1, what)?;
        Ok(&mut self.mem[range])
    }

    /// Writes `bytes` at `ptr`, which must be aligned to `align`.
    fn put(&mut self, ptr: i32, bytes: &[u8], align: usize, what: &str) -> wasmtime::Result<()> {
        let range = self.range(ptr, bytes.len(), align, what)?;
        self.mem[range].copy_from_slice(bytes);
        Ok(())
    }

    fn put_u32(&mut self, ptr: i32, value: u32, what: &str) -> wasmtime::Result<()> {
        self.put(ptr, &value.to_le_bytes(), 4, what)
    }

    fn put_u64(&mut self, ptr: i32, value: u64, what: &str) -> wasmtime::Result<()> {
        self.put(ptr, &value.to_le_bytes(), 8, what)
    }

    /// The buffers of an `iovec` array: (pointer, length) pairs; `Err`
    /// with EINVAL for more than [`IOV_MAX`] of them, as `writev` answers.
    fn iovecs(&self, iovs: i32, count: i32) -> wasmtime::Result<Result<Vec<(i32, usize)>, i32>> {
        let count = count as u32;
        if count > IOV_MAX {
            return Ok(Err(INVAL));
        }
        let range = self.range(iovs, count as usize * 8, 4, "the buffer list")?;
        Ok(Ok(self.mem[range]
            .chunks_exact(8)
            .map(|iov| {
                let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                (ptr, len as usize)
            })
            .collect()))
    }
}

/// The calling module's memory and WASI state.
fn guest<'a, T: WasiView>(
    caller: &'a mut Caller<'_, T>,
    func: &'static str,
) -> wasmtime::Result<(Guest<'a>, &'a mut Wasi)> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        wasmtime::bail!("{func}: the module exports no memory");
    };
    let (mem, data) = memory.data_and_store_mut(caller);
    Ok((Guest { mem, func }, data.wasi()))
}

/// The batch's commit time in nanoseconds since the Unix epoch, as WASI can
/// say it: its timestamps are unsigned 64-bit nanoseconds, so a time before
/// 1970 reads as the epoch and one after 2554 as the last nanosecond
/// (`docs/abi.md`, "The sandbox").
fn now_nanos(env: &CallEnv) -> u64 {
    u64::try_from(env.commit_time())
        .unwrap_or(0)
        .saturating_mul(1_000)
}

/// Writes what `value` says of `clock` at `out`: the realtime and monotonic
/// clocks are the batch's; the CPU-time clocks do not exist (EBADF); any
/// other is EINVAL.
fn read_clock<T: WasiView>(
    caller: &mut Caller<'_, T>,
    func: &'static str,
    clock: i32,
    out: i32,
    value: impl FnOnce(&Wasi) -> u64,
) -> wasmtime::Result<i32> {
    match clock as u32 {
        CLOCK_REALTIME | CLOCK_MONOTONIC => {
            let (mut mem, wasi) = guest(caller, func)?;
            mem.put_u64(out, value(wasi), "the clock's answer")?;
            Ok(SUCCESS)
        }
        CLOCK_PROCESS_CPUTIME | CLOCK_THREAD_CPUTIME => Ok(BADF),
        _ => Ok(INVAL),
    }
}

/// Adds every function of preview 1 to `linker`.
pub(crate) fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    add_process(linker)?;
    add_descriptors(linker)?;
    add_paths(linker)?;
    add_sockets(linker)?;
    linker.func_wrap(MODULE, "poll_oneoff", poll_oneoff::<T>)?;
    Ok(())
}

/// Arguments, environment, clocks, randomness and the process.
fn add_process<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    // No argument and no environment variable: both lists are empty.
    for (list, sizes) in [
        ("args_get", "args_sizes_get"),
        ("environ_get", "environ_sizes_get"),
    ] {
        linker.func_wrap(MODULE, list, |_: Caller<'_, T>, _: i32, _: i32| SUCCESS)?;
        linker.func_wrap(
            MODULE,
            sizes,
            move |mut c: Caller<'_, T>, count: i32, size: i32| -> wasmtime::Result<i32> {
                let (mut mem, _) = guest(&mut c, sizes)?;
                mem.put_u32(size, 0, "the size")?;
                mem.put_u32(count, 0, "the count")?;
                Ok(SUCCESS)
            },
        )?;
    }
    linker.func_wrap(
        MODULE,
        "clock_res_get",
        |mut c: Caller<'_, T>, clock: i32, out: i32| {
            read_clock(&mut c, "clock_res_get", clock, out, |_| CLOCK_RESOLUTION_NS)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "clock_time_get",
        |mut c: Caller<'_, T>, clock: i32, _precision: i64, out: i32| {
            read_clock(&mut c, "clock_time_get", clock, out, |wasi| {
                now_nanos(&wasi.env)
            })
        },
    )?;
    linker.func_wrap(
        MODULE,
        "random_get",
        |mut c: Caller<'_, T>, buf: i32, len: i32| -> wasmtime::Result<i32> {
            let deadline = c.data().deadline();
            let (mut mem, wasi) = guest(&mut c, "random_get")?;
            let env = wasi.env.clone();
            // Filling most of a large memory takes a while: stopped at the
            // call's deadline as running wasm is. Whole words per piece, so
            // the bytes are those of one fill.
            let buffer = mem.bytes_mut(buf, len as u32 as usize, "the buffer")?;
            for piece in buffer.chunks_mut(RANDOM_PIECE) {
                if Instant::now() >= deadline {
                    return Err(wasmtime::Trap::Interrupt.into());
                }
                env.fill_random(piece);
            }
            Ok(SUCCESS)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "proc_exit",
        |_: Caller<'_, T>, status: i32| -> wasmtime::Result<()> {
            Err(wasmtime::format_err!(
                "the module exited with status {} (proc_exit)",
                status as u32
            ))
        },
    )?;
    linker.func_wrap(MODULE, "proc_raise", |_: Caller<'_, T>, _: i32| NOTSUP)?;
    linker.func_wrap(MODULE, "sched_yield", |_: Caller<'_, T>| SUCCESS)?;
    Ok(())
}

/// The `fd_*` functions, on the three standard descriptors.
fn add_descriptors<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "fd_write",
        |mut c: Caller<'_, T>, fd: i32, iovs: i32, count: i32, out: i32| -> wasmtime::Result<i32> {
            let (mut mem, wasi) = guest(&mut c, "fd_write")?;
            let buffers = match mem.iovecs(iovs, count)? {
                Ok(buffers) => buffers,
                Err(errno) => return Ok(errno),
            };
            let capture = match wasi.fd(fd) {
                Some(Stdio::Out) => &wasi.stdout,
                Some(Stdio::Err) => &wasi.stderr,
                Some(Stdio::In) | None => return Ok(BADF),
            };
            let mut written = 0usize;
            for (ptr, len) in buffers {
                // Beyond the cap bytes are dropped, not refused: a chatty
                // module must not fail because of its logging.
                capture.push(mem.bytes(ptr, len, "a buffer")?);
                written += len;
            }
            mem.put_u32(
                out,
                u32::try_from(written).unwrap_or(u32::MAX),
                "the count written",
            )?;
            Ok(SUCCESS)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_read",
        |mut c: Caller<'_, T>, fd: i32, iovs: i32, count: i32, out: i32| -> wasmtime::Result<i32> {
            let (mut mem, wasi) = guest(&mut c, "fd_read")?;
            if let Err(errno) = mem.iovecs(iovs, count)? {
                return Ok(errno);
            }
            match wasi.fd(fd) {
                // stdin is closed: end of file.
                Some(Stdio::In) => {
                    mem.put_u32(out, 0, "the count read")?;
                    Ok(SUCCESS)
                }
                Some(Stdio::Out | Stdio::Err) | None => Ok(BADF),
            }
        },
    )?;
    // Reading or writing at an offset: ESPIPE on a stream that could be
    // read or written at all (stdin for reads, stdout and stderr for
    // writes), EBADF on the others.
    for (name, readable) in [("fd_pread", true), ("fd_pwrite", false)] {
        linker.func_wrap(
            MODULE,
            name,
            move |mut c: Caller<'_, T>, fd: i32, iovs: i32, count: i32, _: i64, _: i32| {
                let (mem, wasi) = guest(&mut c, name)?;
                if let Err(errno) = mem.iovecs(iovs, count)? {
                    return Ok(errno);
                }
                Ok(wasi.answer(fd, |s| {
                    if (s == Stdio::In) == readable {
                        SPIPE
                    } else {
                        BADF
                    }
                }))
            },
        )?;
    }
    linker.func_wrap(
        MODULE,
        "fd_fdstat_get",
        |mut c: Caller<'_, T>, fd: i32, out: i32| -> wasmtime::Result<i32> {
            let (mut mem, wasi) = guest(&mut c, "fd_fdstat_get")?;
            let Some(stdio) = wasi.fd(fd) else {
                return Ok(BADF);
            };
            let rights = if stdio == Stdio::In {
                RIGHT_FD_READ
            } else {
                RIGHT_FD_WRITE
            };
            // filetype u8 at 0 (unknown: not a terminal), flags u16 at 2,
            // rights u64 at 8 and 16.
            let mut fdstat = [0u8; 24];
            fdstat[8..16].copy_from_slice(&rights.to_le_bytes());
            fdstat[16..24].copy_from_slice(&rights.to_le_bytes());
            mem.put(out, &fdstat, 8, "the descriptor's status")?;
            Ok(SUCCESS)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_filestat_get",
        |mut c: Caller<'_, T>, fd: i32, out: i32| -> wasmtime::Result<i32> {
            let (mut mem, wasi) = guest(&mut c, "fd_filestat_get")?;
            if wasi.fd(fd).is_none() {
                return Ok(BADF);
            }
            // Every field of a standard descriptor's status is zero.
            mem.put(out, &[0u8; 64], 8, "the file's status")?;
            Ok(SUCCESS)
        },
    )?;
    linker.func_wrap(MODULE, "fd_close", |mut c: Caller<'_, T>, fd: i32| -> i32 {
        let wasi = c.data_mut().wasi();
        match usize::try_from(fd).ok().and_then(|i| wasi.fds.get_mut(i)) {
            Some(slot @ Some(_)) => {
                *slot = None;
                SUCCESS
            }
            _ => BADF,
        }
    })?;
    linker.func_wrap(
        MODULE,
        "fd_renumber",
        |mut c: Caller<'_, T>, from: i32, to: i32| -> i32 {
            let wasi = c.data_mut().wasi();
            if wasi.fd(from).is_none() || wasi.fd(to).is_none() {
                return BADF;
            }
            if from != to {
                // Both are 0, 1 or 2: they exist.
                let moved = wasi.fds[from as usize].take();
                wasi.fds[to as usize] = moved;
            }
            SUCCESS
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_seek",
        |mut c: Caller<'_, T>, fd: i32, _: i64, _: i32, _: i32| {
            c.data_mut().wasi().answer(fd, |_| SPIPE)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_tell",
        |mut c: Caller<'_, T>, fd: i32, _: i32| c.data_mut().wasi().answer(fd, |_| SPIPE),
    )?;
    linker.func_wrap(
        MODULE,
        "fd_prestat_dir_name",
        |mut c: Caller<'_, T>, fd: i32, _: i32, _: i32| c.data_mut().wasi().answer(fd, |_| NOTDIR),
    )?;
    // Nothing is preopened, and a standard descriptor cannot be synced,
    // advised, resized, read as a directory or given other flags, rights or
    // times: each answers EBADF.
    for name in ["fd_prestat_get", "fd_fdstat_set_flags"] {
        linker.func_wrap(MODULE, name, |_: Caller<'_, T>, _: i32, _: i32| BADF)?;
    }
    for name in ["fd_sync", "fd_datasync"] {
        linker.func_wrap(MODULE, name, |_: Caller<'_, T>, _: i32| BADF)?;
    }
    linker.func_wrap(
        MODULE,
        "fd_advise",
        |_: Caller<'_, T>, _: i32, _: i64, _: i64, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "fd_allocate",
        |_: Caller<'_, T>, _: i32, _: i64, _: i64| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "fd_fdstat_set_rights",
        |_: Caller<'_, T>, _: i32, _: i64, _: i64| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "fd_filestat_set_size",
        |_: Caller<'_, T>, _: i32, _: i64| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "fd_filestat_set_times",
        |_: Caller<'_, T>, _: i32, _: i64, _: i64, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "fd_readdir",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i64, _: i32| BADF,
    )?;
    Ok(())
}

/// The `path_*` functions: no descriptor is a directory, so each answers
/// EBADF whatever its arguments (it reads none of them).
fn add_paths<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    for name in [
        "path_create_directory",
        "path_remove_directory",
        "path_unlink_file",
    ] {
        linker.func_wrap(MODULE, name, |_: Caller<'_, T>, _: i32, _: i32, _: i32| {
            BADF
        })?;
    }
    linker.func_wrap(
        MODULE,
        "path_filestat_get",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i32, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "path_symlink",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i32, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "path_filestat_set_times",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i32, _: i64, _: i64, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "path_link",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "path_readlink",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| BADF,
    )?;
    linker.func_wrap(
        MODULE,
        "path_rename",
        |_: Caller<'_, T>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| BADF,
    )?;
    // Whatever its flags and rights say: a module that sets every bit gets
    // the errno too, not a trap.
    linker.func_wrap(
        MODULE,
        "path_open",
        |_: Caller<'_, T>,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i64,
         _: i64,
         _: i32,
         _: i32| { BADF },
    )?;
    Ok(())
}

/// The `sock_*` functions: no descriptor is a socket.
fn add_sockets<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let not_a_socket = |c: &mut Caller<'_, T>, fd: i32| c.data_mut().wasi().answer(fd, |_| NOTSOCK);
    linker.func_wrap(
        MODULE,
        "sock_accept",
        move |mut c: Caller<'_, T>, fd: i32, _: i32, _: i32| not_a_socket(&mut c, fd),
    )?;
    linker.func_wrap(
        MODULE,
        "sock_recv",
        move |mut c: Caller<'_, T>, fd: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
            not_a_socket(&mut c, fd)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "sock_send",
        move |mut c: Caller<'_, T>, fd: i32, _: i32, _: i32, _: i32, _: i32| {
            not_a_socket(&mut c, fd)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "sock_shutdown",
        move |mut c: Caller<'_, T>, fd: i32, _: i32| not_a_socket(&mut c, fd),
    )?;
    Ok(())
}

/// `poll_oneoff(in, out, nsubscriptions, nevents) -> errno` on the batch's
/// clock, which stands still: every clock subscription (relative or
/// absolute, realtime or monotonic) is due at once, and so are reading
/// stdin (closed: end of file) and writing stdout or stderr (captured), so
/// nothing ever waits. A descriptor that does not exist (or cannot be read
/// or written that way) is EBADF, another clock EINVAL; so is
/// `nsubscriptions` of 0 or over [`MAX_SUBSCRIPTIONS`] (EINVAL), and a
/// pointer outside memory a trap.
fn poll_oneoff<T: WasiView>(
    mut caller: Caller<'_, T>,
    subscriptions: i32,
    events: i32,
    count: i32,
    nevents: i32,
) -> wasmtime::Result<i32> {
    let (mem, wasi) = guest(&mut caller, "poll_oneoff")?;
    let count = count as u32 as usize;
    if count == 0 || count > MAX_SUBSCRIPTIONS {
        return Ok(INVAL);
    }
    let subscriptions = mem.range(
        subscriptions,
        count.saturating_mul(SUBSCRIPTION_SIZE),
        8,
        "the subscriptions",
    )?;
    let events = mem.range(events, count.saturating_mul(EVENT_SIZE), 8, "the events")?;
    let nevents = mem.range(nevents, 4, 4, "the event count")?;
    let mut answers = Vec::with_capacity(count);
    for sub in mem.mem[subscriptions].chunks_exact(SUBSCRIPTION_SIZE) {
        let u32_at =
            |at: usize| u32::from_le_bytes([sub[at], sub[at + 1], sub[at + 2], sub[at + 3]]);
        let fd = u32_at(16) as i32;
        let kind = match sub[8] {
            EVENTTYPE_CLOCK => {
                let flags = u16::from_le_bytes([sub[40], sub[41]]);
                if flags & !SUBCLOCKFLAGS_ABSTIME != 0
                    || !matches!(u32_at(16), CLOCK_REALTIME | CLOCK_MONOTONIC)
                {
                    return Ok(INVAL);
                }
                EVENTTYPE_CLOCK
            }
            EVENTTYPE_FD_READ if wasi.fd(fd) == Some(Stdio::In) => EVENTTYPE_FD_READ,
            EVENTTYPE_FD_WRITE if matches!(wasi.fd(fd), Some(Stdio::Out | Stdio::Err)) => {
                EVENTTYPE_FD_WRITE
            }
            EVENTTYPE_FD_READ | EVENTTYPE_FD_WRITE => return Ok(BADF),
            _ => return Ok(INVAL),
        };
        let mut event = [0u8; EVENT_SIZE];
        event[0..8].copy_from_slice(&sub[0..8]);
        // error (u16 at 8) is success; type at 10; fd_readwrite.nbytes at
        // 16 is 1 for a ready descriptor, as wasmtime reports it.
        event[10] = kind;
        if kind != EVENTTYPE_CLOCK {
            event[16] = 1;
        }
        answers.push(event);
    }
    for (slot, event) in mem.mem[events].chunks_exact_mut(EVENT_SIZE).zip(&answers) {
        slot.copy_from_slice(event);
    }
    mem.mem[nevents].copy_from_slice(&(answers.len() as u32).to_le_bytes());
    Ok(SUCCESS)
}
