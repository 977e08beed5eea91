//! A cache in front of the registry for `on_enter`: span id → the handle of its set, so
//! an enter costs a few loads instead of a registry lookup and an extensions read lock
//! (together 40–65 ns on the benchmark's machine, more than the layer's whole budget).
//! The span's extension stays the truth; a slot is only a copy of its handle.
//!
//! Why a span id is a safe key here when it is not as a label: the registry reuses an id
//! only after the span closed, and `on_close` empties the span's slot before the
//! registry frees the id. One table per layer (its registry's ids), direct-mapped: two
//! live spans on one slot take turns, and a miss falls back to the extension.
//!
//! A slot is a small seqlock with the id as its version: a writer claims the slot by
//! swapping its id for [`WRITING`], stores the handle, then publishes the id; a reader
//! takes the handle only if it saw the same id before and after reading it. Every handle
//! a slot ever held for an id is one that span's extension keeps alive (the current set,
//! or one of the few it superseded), so a reader racing a rewrite for the same span gets
//! a valid handle either way.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use crate::labels::table::Handle;

const BITS: u32 = 10;

/// An id no span has while a writer fills the slot (span ids are never 0; the registry's
/// never reach this one in practice, and a span that had it would just never be cached).
const WRITING: u64 = u64::MAX;

#[derive(Default)]
struct Slot {
    id: AtomicU64,
    handle: AtomicU32,
}

pub(crate) struct Slots {
    slots: Box<[Slot]>,
}

impl Slots {
    pub(crate) fn new() -> Slots {
        Slots {
            slots: (0..1 << BITS).map(|_| Slot::default()).collect(),
        }
    }

    fn slot(&self, id: u64) -> &Slot {
        // The registry's ids differ mostly in their low bits (a slab index) and in a
        // generation in the high ones: a multiply mixes both into the top bits.
        &self.slots[(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BITS)) as usize]
    }

    /// The handle cached for span `id`, if its slot holds it.
    #[inline]
    pub(crate) fn get(&self, id: u64) -> Option<Handle> {
        let slot = self.slot(id);
        if slot.id.load(Ordering::Acquire) != id {
            return None;
        }
        let handle = slot.handle.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        (slot.id.load(Ordering::Relaxed) == id).then_some(handle)
    }

    /// Caches `handle` for span `id` (a live span), evicting whichever span had the slot.
    /// Skipped if another writer holds the slot: it is only a cache.
    pub(crate) fn put(&self, id: u64, handle: Handle) {
        if id == WRITING {
            return;
        }
        let slot = self.slot(id);
        let current = slot.id.load(Ordering::Relaxed);
        if current == WRITING
            || slot
                .id
                .compare_exchange(current, WRITING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        slot.handle.store(handle, Ordering::Relaxed);
        slot.id.store(id, Ordering::Release);
    }

    /// Span `id` closes: its id may go to another span now, so its slot no longer names it.
    pub(crate) fn forget(&self, id: u64) {
        let slot = self.slot(id);
        // A writer holding the slot is writing another span's id (this one is closing,
        // so nobody enters it): either way the slot will not name this span.
        let _ = slot
            .id
            .compare_exchange(id, 0, Ordering::Release, Ordering::Relaxed);
    }
}
