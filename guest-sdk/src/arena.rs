//! A bump region for the allocations of one `datum_transform` call.
//!
//! Owns the bookkeeping of the module's allocator (wasm32 only, see
//! `exports`): while a call runs, allocations are carved from one region in
//! order, a free only counts down, and when the call ends with everything it
//! carved freed again, the region starts over. Decoding a batch, building
//! the output and dropping both is most of a module's allocations; a bump
//! and a count are far cheaper than a general allocator's bins.
//!
//! It never reuses memory something still holds: a region with a live
//! allocation (a cache a module keeps in a static, say) is not started over,
//! and once full every allocation goes to the general allocator, as it
//! would without the region. So the cost of a module that keeps memory
//! across calls is at most the region's size, and its speed that of the
//! general allocator.

use std::alloc::Layout;

/// The region's size: the allocations of a batch of a few hundred changes.
pub(crate) const SIZE: usize = 1 << 20;

/// The region's state. Addresses are plain numbers: the allocator owns the
/// region, this only decides where in it each allocation goes.
#[derive(Debug)]
pub(crate) struct Arena {
    /// The region, `start..end`; empty until the first call.
    start: usize,
    end: usize,
    /// Where the next allocation may start.
    next: usize,
    /// The start of the latest allocation, which may grow in place.
    last: usize,
    /// Allocations carved and not yet freed.
    live: usize,
    /// Inside a call.
    active: bool,
}

impl Default for Arena {
    fn default() -> Arena {
        Arena::new()
    }
}

impl Arena {
    /// No region yet, outside a call.
    pub(crate) const fn new() -> Arena {
        Arena {
            start: 0,
            end: 0,
            next: 0,
            last: usize::MAX,
            live: 0,
            active: false,
        }
    }

    /// Whether the region has been given.
    pub(crate) fn has_region(&self) -> bool {
        self.end > self.start
    }

    /// Gives the region `start..start + len`.
    pub(crate) fn set_region(&mut self, start: usize, len: usize) {
        self.start = start;
        self.end = start + len;
        self.next = start;
        self.last = usize::MAX;
    }

    /// A call begins: allocations come from the region.
    pub(crate) fn begin(&mut self) {
        self.active = true;
    }

    /// A call ended: allocations go elsewhere, and the region starts over
    /// if nothing carved from it is still held.
    pub(crate) fn end(&mut self) {
        self.active = false;
        if self.live == 0 {
            self.next = self.start;
            self.last = usize::MAX;
        }
    }

    /// Whether `ptr` was carved from the region.
    pub(crate) fn owns(&self, ptr: usize) -> bool {
        self.start <= ptr && ptr < self.end
    }

    /// Carves an allocation during a call, or `None` (outside a call, or
    /// no room left): the caller asks the general allocator then.
    pub(crate) fn alloc(&mut self, layout: Layout) -> Option<usize> {
        if !self.active || !self.has_region() {
            return None;
        }
        let at = self.next.checked_add(layout.align() - 1)? & !(layout.align() - 1);
        // A zero-sized request still gets an address of its own.
        let end = at.checked_add(layout.size().max(1))?;
        if end > self.end {
            return None;
        }
        self.next = end;
        self.last = at;
        self.live += 1;
        Some(at)
    }

    /// Frees an allocation carved from the region (the caller checked
    /// [`Arena::owns`]).
    pub(crate) fn free(&mut self) {
        self.live = self.live.saturating_sub(1);
        if self.live == 0 && !self.active {
            self.next = self.start;
            self.last = usize::MAX;
        }
    }

    /// Grows or shrinks the latest allocation in place, if `ptr` is it and
    /// the region has room; `false` when it must move.
    pub(crate) fn resize_in_place(&mut self, ptr: usize, new_size: usize) -> bool {
        if ptr != self.last || !self.active {
            return false;
        }
        match ptr.checked_add(new_size.max(1)) {
            Some(end) if end <= self.end => {
                self.next = end;
                true
            }
            _ => false,
        }
    }
}

/// The module's global allocator: the region during a call, the general
/// allocator otherwise.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub(crate) mod global {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::UnsafeCell;

    use super::{Arena, SIZE};

    /// The allocator every SDK module uses (the crate's docs, "Memory").
    pub struct CallArena(UnsafeCell<Arena>);

    // SAFETY: a wasm32 target without the `atomics` feature has one thread:
    // the cell is never reached from two threads.
    unsafe impl Sync for CallArena {}

    impl CallArena {
        pub const fn new() -> CallArena {
            CallArena(UnsafeCell::new(Arena::new()))
        }

        #[allow(clippy::mut_from_ref)]
        fn arena(&self) -> &mut Arena {
            // SAFETY: one thread (see `Sync`), and no function here calls
            // back into the allocator while it holds this reference.
            unsafe { &mut *self.0.get() }
        }

        /// A call begins. The region is taken from the general allocator
        /// the first time; without it, everything goes there.
        pub fn begin(&self) {
            let arena = self.arena();
            if !arena.has_region()
                && let Ok(layout) = Layout::from_size_align(SIZE, 16)
            {
                // SAFETY: the layout's size is not zero.
                let start = unsafe { System.alloc(layout) };
                if !start.is_null() {
                    arena.set_region(start.expose_provenance(), SIZE);
                }
            }
            arena.begin();
        }

        /// A call ended.
        pub fn end(&self) {
            self.arena().end();
        }
    }

    // SAFETY: every pointer handed out is either from `System` (and goes
    // back to it) or a range of the region no other live allocation
    // overlaps: the region only moves forward while anything carved from it
    // is live, and starts over only when nothing is.
    unsafe impl GlobalAlloc for CallArena {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            match self.arena().alloc(layout) {
                Some(at) => std::ptr::with_exposed_provenance_mut(at),
                // SAFETY: forwarded from this function's contract.
                None => unsafe { System.alloc(layout) },
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            let arena = self.arena();
            if arena.owns(ptr.expose_provenance()) {
                arena.free();
            } else {
                // SAFETY: not from the region, so from `System`.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let at = ptr.expose_provenance();
            if !self.arena().owns(at) {
                // SAFETY: not from the region, so from `System`.
                return unsafe { System.realloc(ptr, layout, new_size) };
            }
            if self.arena().resize_in_place(at, new_size) {
                return ptr;
            }
            let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
                return std::ptr::null_mut();
            };
            // SAFETY: forwarded from this function's contract.
            let moved = unsafe { self.alloc(new_layout) };
            if !moved.is_null() {
                // SAFETY: both are valid for the smaller size and distinct
                // (the old allocation is live until freed below).
                unsafe {
                    std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                }
                self.arena().free();
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena() -> Arena {
        let mut arena = Arena::default();
        arena.set_region(4096, 1024);
        arena
    }

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).expect("layout")
    }

    #[test]
    fn allocations_are_aligned_disjoint_and_inside_the_region() {
        let mut a = arena();
        a.begin();
        let mut taken: Vec<(usize, usize)> = Vec::new();
        for (size, align) in [(1, 1), (8, 8), (3, 2), (16, 16), (0, 4), (100, 8)] {
            let at = a.alloc(layout(size, align)).expect("room");
            assert_eq!(at % align, 0);
            assert!(a.owns(at) && at + size <= 4096 + 1024);
            for &(other, len) in &taken {
                assert!(at >= other + len.max(1) || at + size.max(1) <= other);
            }
            taken.push((at, size));
        }
    }

    #[test]
    fn nothing_is_carved_outside_a_call_or_past_the_end() {
        let mut a = arena();
        assert_eq!(a.alloc(layout(8, 8)), None, "outside a call");
        a.begin();
        assert!(a.alloc(layout(1000, 8)).is_some());
        assert_eq!(a.alloc(layout(100, 8)), None, "full");
        assert!(a.alloc(layout(8, 8)).is_some(), "what still fits");
        let mut empty = Arena::default();
        empty.begin();
        assert_eq!(empty.alloc(layout(8, 8)), None, "no region");
    }

    #[test]
    fn the_region_starts_over_only_when_nothing_carved_is_held() {
        let mut a = arena();
        a.begin();
        let kept = a.alloc(layout(64, 8)).expect("room");
        let dropped = a.alloc(layout(64, 8)).expect("room");
        a.free();
        a.end();
        // `kept` is live: the next call carves after it, never over it.
        a.begin();
        let next = a.alloc(layout(64, 8)).expect("room");
        assert!(next >= kept + 64, "{next} overlaps {kept}");
        assert!(
            next >= dropped + 64,
            "the region moved back while `kept` is held"
        );
        a.free();
        a.end();
        a.free();
        a.begin();
        assert_eq!(a.alloc(layout(64, 8)), Some(4096), "started over");
    }

    #[test]
    fn only_the_latest_allocation_grows_in_place() {
        let mut a = arena();
        a.begin();
        let first = a.alloc(layout(16, 8)).expect("room");
        let second = a.alloc(layout(16, 8)).expect("room");
        assert!(!a.resize_in_place(first, 32), "would run over `second`");
        assert!(a.resize_in_place(second, 512));
        assert!(a.alloc(layout(8, 8)).expect("room") >= second + 512);
        assert!(!a.resize_in_place(second, 10_000), "past the region");
    }
}
