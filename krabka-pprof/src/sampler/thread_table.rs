//! What the signal handler knows about each thread of the process, in one table it can
//! read without locks: whether the thread has a CPU timer of its own (so the process-wide
//! backstop's signals on it are dropped), whether it has a seccomp filter of its own (so
//! its stack is never read with a system call, which the filter might forbid), and which
//! range of its stack is proven readable (so its stack is read with plain loads instead of
//! system calls).
//!
//! Keys are written only by the drain, the table's one writer, from the list of the
//! process's threads: a thread gets its entry at the first drain that sees it, and a
//! thread that exited is forgotten at the next, so that a thread id used again starts
//! unknown. The handler reads entries, and writes the stack range of its own thread's
//! entry only (a thread never runs two handlers at once: `SIGPROF` is blocked during its
//! own handler).
//!
//! A forgotten entry stays as a tombstone on its probe path; once tombstones and live
//! entries fill half the table, the drain builds a new table of the live entries (larger,
//! if the threads are many) and publishes it for the handlers ([`Threads::rebuilt`]), so
//! the table never fills however many threads come and go in one session.
//!
//! A proven range `[low, high)` was copied whole, by a system call, from the thread's own
//! stack pointer up, in a sample whose unwind reached the stack's outermost frame, so it
//! is this thread's live stack. Memory between a thread's current stack pointer and the
//! top of its stack stays mapped while the thread lives: a later sample whose stack
//! pointer lies inside the range may read `[sp, high)` directly, and cannot fault.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A key no thread has: an entry of a thread that exited, free to be used again.
const FORGOTTEN: u32 = u32::MAX;
/// The fewest entries a table has.
const MIN_ENTRIES: usize = 64;

/// One thread's entry.
pub(crate) struct Thread {
    tid: AtomicU32,
    timed: AtomicBool,
    filtered: AtomicBool,
    low: AtomicU64,
    high: AtomicU64,
}

impl Thread {
    fn empty() -> Thread {
        Thread {
            tid: AtomicU32::new(0),
            timed: AtomicBool::new(false),
            filtered: AtomicBool::new(false),
            low: AtomicU64::new(0),
            high: AtomicU64::new(0),
        }
    }

    /// Whether the thread has a CPU timer of its own.
    pub(crate) fn is_timed(&self) -> bool {
        self.timed.load(Ordering::Acquire)
    }

    /// Whether the thread has a seccomp filter of its own: its handler makes no system
    /// call that reads memory.
    pub(crate) fn is_filtered(&self) -> bool {
        self.filtered.load(Ordering::Acquire)
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

    /// Marks the thread as having its own timer, or not. For the drain only.
    pub(crate) fn set_timed(&self, timed: bool) {
        self.timed.store(timed, Ordering::Release);
    }

    /// Marks the thread as having a seccomp filter of its own. For the drain only; a
    /// filter is never removed.
    pub(crate) fn set_filtered(&self) {
        self.filtered.store(true, Ordering::Release);
    }
}

/// The process's threads, by kernel thread id.
pub(crate) struct Threads {
    entries: Box<[Thread]>,
    /// Keys in use, forgotten ones included (the drain's count; it is the only writer).
    used: AtomicU32,
}

impl Threads {
    /// Room for `capacity` threads at once.
    pub(crate) fn new(capacity: usize) -> Threads {
        let size = (capacity * 2).max(MIN_ENTRIES).next_power_of_two();
        Threads {
            entries: (0..size).map(|_| Thread::empty()).collect(),
            used: AtomicU32::new(0),
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

    /// Thread `tid`'s entry, made if it has none; `None` when the table is full (the
    /// drain then rebuilds it, see [`needs_rebuild`](Self::needs_rebuild)). For the drain
    /// only.
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
        entry.filtered.store(false, Ordering::Relaxed);
        entry.high.store(0, Ordering::Relaxed);
        entry.tid.store(tid, Ordering::Release);
        Some(entry)
    }

    /// Forgets thread `tid`, which exited.
    pub(crate) fn forget(&self, tid: u32) {
        if let Some(entry) = self.find(tid) {
            entry.timed.store(false, Ordering::Release);
            entry.filtered.store(false, Ordering::Release);
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

    /// Whether the table should be rebuilt before `alive` threads are added: tombstones
    /// and live entries would pass half of it.
    pub(crate) fn needs_rebuild(&self, alive: usize) -> bool {
        let used = self.used.load(Ordering::Relaxed) as usize;
        let half = self.entries.len() / 2;
        used >= half * 3 / 4 || alive >= half
    }

    /// A new table holding the live entries of this one, with room for `alive` threads
    /// twice over: no tombstones, and a table that grows with the threads alive, never
    /// with the threads ever seen.
    pub(crate) fn rebuilt(&self, alive: usize) -> Threads {
        let table = Threads::new(alive.max(self.known().count()) * 2);
        for old in self.entries.iter() {
            let tid = old.tid.load(Ordering::Acquire);
            if tid == 0 || tid == FORGOTTEN {
                continue;
            }
            if let Some(new) = table.add(tid) {
                new.timed.store(old.is_timed(), Ordering::Relaxed);
                new.filtered.store(old.is_filtered(), Ordering::Relaxed);
                if let Some((low, high)) = old.known_stack() {
                    new.low.store(low, Ordering::Relaxed);
                    new.high.store(high, Ordering::Release);
                }
            }
        }
        table
    }

    /// Entries this table has room for.
    #[cfg(test)]
    fn size(&self) -> usize {
        self.entries.len()
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
        threads.find(21).unwrap().set_timed(true);
        threads.find(37).unwrap().set_filtered();
        assert!(threads.find(21).unwrap().is_timed());
        assert!(!threads.find(5).unwrap().is_timed());
        assert!(threads.find(37).unwrap().is_filtered());
        threads.forget(21);
        assert!(threads.find(21).is_none(), "an exited thread is forgotten");
        assert!(
            threads.find(37).is_some(),
            "others stay findable past the forgotten entry"
        );
        let again = threads.add(21).unwrap();
        assert!(
            !again.is_timed() && !again.is_filtered() && again.known_stack().is_none(),
            "a reused id starts unknown"
        );
        let mut known: Vec<u32> = threads.known().collect();
        known.sort_unstable();
        assert_eq!(known, [5, 21, 37]);
    }

    #[test]
    fn every_probe_visits_each_entry_once_from_wherever_it_starts() {
        // A lookup ends at an empty entry or after the whole table, and an entry can be
        // anywhere a thread's probe leads, the table's last included (probes wrap).
        for capacity in [4, 100] {
            let threads = Threads::new(capacity);
            let size = threads.size();
            let mut starts = std::collections::HashSet::new();
            for tid in 1..=2_000u32 {
                let mut seen: Vec<usize> = threads
                    .probe(tid)
                    .map(|entry| {
                        (entry as *const Thread as usize - threads.entries.as_ptr() as usize)
                            / size_of::<Thread>()
                    })
                    .collect();
                starts.insert(seen[0]);
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    (0..size).collect::<Vec<_>>(),
                    "thread {tid}'s probe in a table of {size}"
                );
            }
            assert_eq!(starts.len(), size, "probes start at every entry");
        }
    }

    #[test]
    fn ids_no_thread_has_get_no_entry() {
        let threads = Threads::new(4);
        for tid in [5, 21] {
            assert!(threads.add(tid).is_some());
        }
        threads.forget(21);
        assert!(threads.add(0).is_none(), "0 marks an empty entry");
        assert!(
            threads.add(FORGOTTEN).is_none(),
            "FORGOTTEN marks a tombstone"
        );
        assert!(threads.find(0).is_none(), "an empty entry is nobody's");
        assert_eq!(threads.known().collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn a_table_at_its_limit_takes_a_thread_again_in_the_place_it_left() {
        let threads = Threads::new(4);
        let half = threads.size() / 2;
        for tid in 1..=half as u32 {
            assert!(threads.add(tid).is_some(), "thread {tid} of {half}");
        }
        assert!(
            threads.add(half as u32 + 1).is_none(),
            "half the table stays empty"
        );
        let known = threads
            .add(1)
            .expect("a thread with an entry is found at the limit too");
        assert!(
            std::ptr::eq(known, threads.find(1).unwrap()),
            "its own entry"
        );
        threads.forget(3);
        let again = threads
            .add(3)
            .expect("its tombstone is on its own probe path");
        assert!(std::ptr::eq(again, threads.find(3).unwrap()));
        assert_eq!(
            threads.used.load(Ordering::Relaxed) as usize,
            half,
            "the tombstone reused, no empty entry taken"
        );
    }

    #[test]
    fn a_table_asks_to_be_rebuilt_before_its_entries_pass_half_of_it() {
        let threads = Threads::new(4);
        let half = threads.size() / 2;
        assert_eq!(half, 32);
        assert!(!threads.needs_rebuild(1), "a fresh table");
        assert!(
            !threads.needs_rebuild(half - 1),
            "31 threads fit in 64 entries"
        );
        assert!(threads.needs_rebuild(half), "32 would fill half of it");
        // Entries used, tombstones included: three quarters of the half is the limit, so
        // that the threads a drain adds still fit before the next rebuild.
        for tid in 1..=23 {
            assert!(threads.add(tid).is_some());
        }
        assert!(!threads.needs_rebuild(23), "23 entries used");
        assert!(threads.add(24).is_some());
        for tid in 1..=20 {
            threads.forget(tid);
        }
        assert!(
            threads.needs_rebuild(4),
            "24 entries used, 20 of them tombstones"
        );
    }

    #[test]
    fn a_table_that_fills_with_tombstones_is_rebuilt_with_its_live_entries() {
        let mut threads = Threads::new(4);
        let first_size = threads.size();
        // Threads come and go by the thousand: each drain forgets the exited ones and
        // adds the new, rebuilding whenever the table asks for it.
        let mut rebuilds = 0;
        for generation in 0..1000u32 {
            let tids = [generation * 3 + 1, generation * 3 + 2, generation * 3 + 3];
            if threads.needs_rebuild(tids.len() + 1) {
                threads = threads.rebuilt(tids.len() + 1);
                rebuilds += 1;
            }
            for tid in tids {
                assert!(threads.add(tid).is_some(), "thread {tid} gets an entry");
            }
            threads.find(tids[0]).unwrap().set_timed(true);
            for tid in tids {
                if generation % 2 == 0 || tid != tids[0] {
                    threads.forget(tid);
                }
            }
        }
        assert!(rebuilds > 10, "{rebuilds} rebuilds");
        // The survivors of odd generations are still there, with their facts.
        let survivors: Vec<u32> = threads.known().collect();
        assert_eq!(survivors.len(), 500);
        assert!(
            survivors
                .iter()
                .all(|&tid| threads.find(tid).unwrap().is_timed())
        );
        assert!(
            threads.size() <= 4096,
            "the table grows with the threads alive ({}), not with those ever seen: {} entries \
             (it started with {first_size})",
            survivors.len(),
            threads.size()
        );
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
        let rebuilt = threads.rebuilt(1);
        assert_eq!(
            rebuilt.find(42).unwrap().known_stack(),
            Some((0x9000, 0xa000)),
            "a rebuilt table keeps what was proven"
        );
    }
}
