//! The module's side of the wasm boundary (wasm32 only): the exports every
//! Datum module has — `datum_abi_v1`, `datum_schema_changes`, `datum_alloc`, `datum_dealloc`,
//! `datum_panic_message` — and the entry points the macros' glue calls for
//! `datum_transform` and `datum_init`.
//!
//! Owns buffer ownership across the boundary and the panic hook. Buffers
//! handed to the host (results, the panic message) are allocated with exactly
//! their length, align 1, which is the layout `datum_alloc` uses and
//! `datum_dealloc` assumes. What happens to a batch belongs to `abi`.

use std::alloc::Layout;
use std::fmt::Write as _;
use std::sync::{Mutex, Once, PoisonError};

use crate::abi;

/// The message of the last panic, exactly sized, waiting for
/// `datum_panic_message`.
static PANIC_MESSAGE: Mutex<Option<Box<[u8]>>> = Mutex::new(None);

/// Marks ABI version 1. Never called.
#[unsafe(no_mangle)]
pub extern "C" fn datum_abi_v1() {}

/// Marks a module that understands `schema` changes: the host sends them
/// to it (`docs/abi.md`). Never called.
#[unsafe(no_mangle)]
pub extern "C" fn datum_schema_changes() {}

/// Returns `len` writable bytes (align 1), or 0 if memory is exhausted.
/// A zero-length request gets a non-null dangling pointer.
#[unsafe(no_mangle)]
pub extern "C" fn datum_alloc(len: u32) -> u32 {
    let Ok(layout) = Layout::array::<u8>(len as usize) else {
        return 0;
    };
    if len == 0 {
        return std::ptr::NonNull::<u8>::dangling()
            .as_ptr()
            .expose_provenance() as u32;
    }
    // SAFETY: the layout's size is not zero.
    let ptr = unsafe { std::alloc::alloc(layout) };
    ptr.expose_provenance() as u32
}

/// Frees a buffer of `len` bytes that `datum_alloc` or a result handed out.
#[unsafe(no_mangle)]
pub extern "C" fn datum_dealloc(ptr: u32, len: u32) {
    if ptr == 0 || len == 0 {
        return;
    }
    let Ok(layout) = Layout::array::<u8>(len as usize) else {
        return;
    };
    // SAFETY: per the ABI, the host frees only buffers the guest handed out
    // (from `datum_alloc`, or a result), with their length; both were
    // allocated with this layout.
    unsafe { std::alloc::dealloc(std::ptr::with_exposed_provenance_mut(ptr as usize), layout) }
}

/// After a trap: the last panic's message (packed pointer and length, a
/// buffer the host may free with `datum_dealloc`), or 0 if none was
/// recorded. The message is handed out once.
#[unsafe(no_mangle)]
pub extern "C" fn datum_panic_message() -> u64 {
    let message = PANIC_MESSAGE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    message.map_or(0, hand_out)
}

/// Packs a buffer as `ptr << 32 | len` and leaves it to the host.
fn hand_out(buffer: Box<[u8]>) -> u64 {
    let len = buffer.len() as u64;
    if len == 0 {
        return 0;
    }
    let ptr = Box::into_raw(buffer).cast::<u8>().expose_provenance() as u64;
    (ptr << 32) | len
}

/// Takes ownership of the input buffer the host wrote at `ptr`.
///
/// # Safety
///
/// `ptr` must come from `datum_alloc(len)` and not be freed yet, as the ABI
/// says the host does.
unsafe fn take_input(ptr: u32, len: u32) -> Vec<u8> {
    if len == 0 || ptr == 0 {
        return Vec::new();
    }
    let len = len as usize;
    // SAFETY: per this function's contract, `ptr` is a live allocation of
    // `len` bytes with align 1, which is a `Vec<u8>`'s layout for capacity
    // `len`, and the host wrote all of it.
    unsafe {
        Vec::from_raw_parts(
            std::ptr::with_exposed_provenance_mut(ptr as usize),
            len,
            len,
        )
    }
}

fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            record_panic(info);
            default(info);
        }));
    });
}

fn record_panic(info: &std::panic::PanicHookInfo<'_>) {
    let payload = info.payload_as_str().unwrap_or("a panic without a message");
    let mut message = match info.location() {
        Some(location) => format!("panicked at {location}: {payload}"),
        None => format!("panicked: {payload}"),
    };
    if let Some(index) = abi::current_change() {
        let _ = write!(message, " (change {index})");
    }
    *PANIC_MESSAGE.lock().unwrap_or_else(PoisonError::into_inner) =
        Some(message.into_bytes().into_boxed_slice());
}

/// `datum_transform`'s body: runs `driver` on the input and hands out the
/// envelope.
///
/// # Safety
///
/// As for `take_input`: the host calls it as the ABI says.
pub unsafe fn transform_entry(ptr: u32, len: u32, driver: impl FnOnce(Vec<u8>) -> Vec<u8>) -> u64 {
    install_panic_hook();
    // SAFETY: forwarded from this function's contract.
    let input = unsafe { take_input(ptr, len) };
    #[cfg(all(feature = "arena", not(target_feature = "atomics")))]
    {
        ALLOCATOR.begin();
        let envelope = driver(input);
        ALLOCATOR.end();
        // The host frees the envelope after the call: it moves out of the
        // call's region, which then starts over.
        let handed: Box<[u8]> = envelope.as_slice().into();
        drop(envelope);
        hand_out(handed)
    }
    #[cfg(not(all(feature = "arena", not(target_feature = "atomics"))))]
    hand_out(driver(input).into_boxed_slice())
}

/// Every SDK module's allocator: a region per `datum_transform` call
/// (`arena`), the general allocator for everything else.
#[cfg(all(feature = "arena", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: crate::arena::global::CallArena = crate::arena::global::CallArena::new();

/// `datum_init`'s body: runs `driver` on the configuration; 0 is success.
///
/// # Safety
///
/// As for `take_input`: the host calls it as the ABI says.
pub unsafe fn init_entry(
    ptr: u32,
    len: u32,
    driver: impl FnOnce(Vec<u8>) -> Option<Vec<u8>>,
) -> u64 {
    install_panic_hook();
    // SAFETY: forwarded from this function's contract.
    let input = unsafe { take_input(ptr, len) };
    driver(input).map_or(0, |envelope| hand_out(envelope.into_boxed_slice()))
}
