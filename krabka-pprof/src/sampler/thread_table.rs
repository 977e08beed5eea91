//! What the signal handler knows about each thread of the process, in one table it can
//! read without locks: whether the thread has a CPU timer of its own (so the process-wide
//! backstop's signals on it are dropped), and which range of its stack is proven readable
//! (so its stack is read with plain loads instead of system calls).
//!
//! Keys are written only by the drain, the table's one writer, from the list of the
//! process's threads: a thread gets its entry at the first drain that sees it, and a
//! thread that exited is forgotten at the next, so that a thread id used again starts
//! unknown. The handler reads entries, and writes the stack range of its own thread's
//! entry only (a thread never runs two handlers at once: `SIGPROF` is blocked during its
//! own handler).
//!
//! A proven range `[low, high)` was copied whole, by a system call, from the thread's own
//! stack pointer up, in a sample whose unwind reached the stack's outermost frame, so it
//! is this thread's live stack. Memory between a thread's current stack pointer and the
//! top of its stack stays mapped while the thread lives: a later sample whose stack
//! pointer lies inside the range may read `[sp, high)` directly, and cannot fault.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A key no thread has: an entry of a thread that exited, free to be used again.
const FORGOTTEN: u32 = u32::MAX;

/// One thread's entry.
pub(crate) struct Thread {
    tid: AtomicU32,
    timed: AtomicBool,
    low: AtomicU64,
    high: AtomicU64,
}

impl Thread {
    /// Whether the thread has a CPU timer of its own.
    pub(crate) fn is_timed(&self) -> bool {
        self.timed.load(Ordering::Acquire)
    }

    /// The proven range of the thread's stack, if any.
    pub(crate) fn known_stack(&self) -> Option<(u64, u64)> {
        let high = self.high.load(Ordering::Acquire);
        (high != 0).then(|| (self.low.load(Ordering::Relaxed), high))
    }

    /// Records that `[low, high)` of this thread's stack was just copied whole; merges it
    /// with what was known when the two overlap. Only the thread itself, in its handler.
    pub(crate) fn prove_stack(&self, low: u64, high: u64) {
        let (old_low, old_high) = (
            self.low.load(Ordering::Relaxed),
            self.high.load(Ordering::Relaxed),
        );
        let (low, high) = if old_high != 0 && low <= old_high && old_low <= high {
            (low.min(old_low), high.max(old_high))
        } else {
            (low, high)
        };
        self.high.store(0, Ordering::Release);
        self.low.store(low, Ordering::Relaxed);
        self.high.store(high, Ordering::Release);
    }
}

/// The process's threads, by kernel thread id, and the threads each timer signals.
pub(crate) struct Threads {
    entries: Box<[Thread]>,
    /// Keys in use, forgotten ones included (the drain's count; it is the only writer).
    used: AtomicU32,
    /// Indexed by kernel timer id (small integers, allocated from 0 per process).
    owners: Box<[AtomicU32]>,
}

impl Threads {
    /// Room for `capacity` threads at once.
    pub(crate) fn new(capacity: usize) -> Threads {
        let size = (capacity * 2).next_power_of_two();
        Threads {
            entries: (0..size)
                .map(|_| Thread {
                    tid: AtomicU32::new(0),
                    timed: AtomicBool::new(false),
                    low: AtomicU64::new(0),
                    high: AtomicU64::new(0),
                })
                .collect(),
            used: AtomicU32::new(0),
            owners: (0..size).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn probe(&self, tid: u32) -> impl Iterator<Item = &Thread> {
        let mask = self.entries.len() - 1;
        let start = (tid as usize).wrapping_mul(0x9e37_79b9) & mask;
        (0..self.entries.len()).map(move |i| &self.entries[(start + i) & mask])
    }

    /// Thread `tid`'s entry. Async-signal-safe: loads only.
    pub(crate) fn find(&self, tid: u32) -> Option<&Thread> {
        for entry in self.probe(tid) {
            match entry.tid.load(Ordering::Acquire) {
                0 => return None,
                found if found == tid => return Some(entry),
                _ => {}
            }
        }
        None
    }

    /// Thread `tid`'s entry, made if it has none; `None` when the table is full. For the
    /// drain only.
    pub(crate) fn add(&self, tid: u32) -> Option<&Thread> {
        if tid == 0 || tid == FORGOTTEN {
            return None;
        }
        let mut free = None;
        for entry in self.probe(tid) {
            match entry.tid.load(Ordering::Acquire) {
                found if found == tid => return Some(entry),
                FORGOTTEN => {
                    free.get_or_insert(entry);
                }
                0 => {
                    if free.is_none() {
                        // Keep at least half the table empty, so that lookups stay short
                        // and always end.
                        if self.used.load(Ordering::Relaxed) as usize >= self.entries.len() / 2 {
                            return None;
                        }
                        self.used.fetch_add(1, Ordering::Relaxed);
                        free = Some(entry);
                    }
                    break;
                }
                _ => {}
            }
        }
        let entry = free?;
        entry.timed.store(false, Ordering::Relaxed);
        entry.high.store(0, Ordering::Relaxed);
        entry.tid.store(tid, Ordering::Release);
        Some(entry)
    }

    /// Marks `tid` as having its own timer, `timer`.
    pub(crate) fn set_timed(&self, tid: u32, timer: libc::c_int) {
        if let Some(owner) = usize::try_from(timer).ok().and_then(|t| self.owners.get(t)) {
            owner.store(tid, Ordering::Release);
        }
        if let Some(entry) = self.find(tid) {
            entry.timed.store(true, Ordering::Release);
        }
    }

    /// The thread `timer` signals, if known. Async-signal-safe: one load.
    pub(crate) fn owner(&self, timer: libc::c_int) -> Option<u32> {
        let owner = usize::try_from(timer)
            .ok()
            .and_then(|t| self.owners.get(t))?;
        Some(owner.load(Ordering::Acquire)).filter(|&tid| tid != 0)
    }

    /// Forgets thread `tid`, which exited, and the timer it had.
    pub(crate) fn forget(&self, tid: u32, timer: Option<libc::c_int>) {
        if let Some(owner) = timer
            .and_then(|t| usize::try_from(t).ok())
            .and_then(|t| self.owners.get(t))
        {
            owner.store(0, Ordering::Release);
        }
        if let Some(entry) = self.find(tid) {
            entry.timed.store(false, Ordering::Release);
            entry.high.store(0, Ordering::Release);
            entry.tid.store(FORGOTTEN, Ordering::Release);
        }
    }

    /// Every thread id with an entry.
    pub(crate) fn known(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries
            .iter()
            .map(|e| e.tid.load(Ordering::Acquire))
            .filter(|&tid| tid != 0 && tid != FORGOTTEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_found_timed_forgotten_and_their_entries_reused() {
        let threads = Threads::new(4);
        assert!(threads.find(21).is_none());
        for tid in [5, 21, 37] {
            assert!(threads.add(tid).is_some());
        }
        threads.set_timed(21, 3);
        assert!(threads.find(21).unwrap().is_timed());
        assert!(!threads.find(5).unwrap().is_timed());
        assert_eq!(threads.owner(3), Some(21));
        assert_eq!(
            (threads.owner(4), threads.owner(-1), threads.owner(1 << 20)),
            (None, None, None)
        );
        threads.forget(21, Some(3));
        assert!(threads.find(21).is_none(), "an exited thread is forgotten");
        assert_eq!(threads.owner(3), None);
        assert!(
            threads.find(37).is_some(),
            "others stay findable past the forgotten entry"
        );
        let again = threads.add(21).unwrap();
        assert!(
            !again.is_timed() && again.known_stack().is_none(),
            "a reused id starts unknown"
        );
        assert!(threads.add(8).is_some());
        assert!(threads.add(9).is_none(), "full at half the table");
        let mut known: Vec<u32> = threads.known().collect();
        known.sort_unstable();
        assert_eq!(known, [5, 8, 21, 37]);
    }

    #[test]
    fn stack_ranges_are_proven_merged_and_replaced() {
        let threads = Threads::new(4);
        let thread = threads.add(42).unwrap();
        assert_eq!(thread.known_stack(), None);
        thread.prove_stack(0x1000, 0x3000);
        assert_eq!(thread.known_stack(), Some((0x1000, 0x3000)));
        thread.prove_stack(0x0800, 0x1800);
        assert_eq!(
            thread.known_stack(),
            Some((0x0800, 0x3000)),
            "overlapping: merged"
        );
        thread.prove_stack(0x9000, 0xa000);
        assert_eq!(
            thread.known_stack(),
            Some((0x9000, 0xa000)),
            "elsewhere: replaced"
        );
    }
}
