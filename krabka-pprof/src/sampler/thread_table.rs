//! What the signal handler knows about each thread of the process, in one table it can
//! read without locks: whether the thread has a CPU timer of its own (so the process-wide
//! backstop's signals on it are dropped), whether it has a seccomp filter of its own (so
//! its stack is never read with a system call, which the filter might forbid), and which
//! thread's own stack is (so a sample taken on it is read with plain loads instead of system
//! calls).
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
//! A thread's own stack `[low, high)` is learned off the signal path, by the drain, and
//! written once: the handler notes where its thread's control block is (`pthread_self`,
//! which glibc and musl place at the top of the mapping they made for the thread's stack,
//! above the stack itself), and the drain finds, in `/proc/self/maps`, the mapping that
//! holds it, with a guard page right below (so the mapping is the thread's stack alone, not
//! merged with a neighbour); for the main thread, the kernel's `[stack]`. That memory stays
//! mapped as long as the thread lives, whatever the thread does with its stack pointer. A
//! sample whose stack pointer lies inside it reads `[sp, high)` with plain loads; any other
//! sample (a coroutine's or `stacker`'s segment, an alternate signal stack, a thread whose
//! stack is not learned) reads through a system call copy, which cannot fault. Nothing a
//! sample sees widens the range: it depends on nothing the unwinder read.

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
    /// Where the thread's control block is (`pthread_self`), noted by its handler; 0 until
    /// then.
    tcb: AtomicU64,
    /// A system call copying its stack was refused (`EPERM`, `EACCES`, `ENOSYS`: what
    /// seccomp filters answer) since the drain last looked.
    refused: AtomicBool,
    /// The thread's own stack, learned by the drain; `high` is 0 until then, and `low` is
    /// written before it.
    low: AtomicU64,
    high: AtomicU64,
}

impl Thread {
    fn empty() -> Thread {
        Thread {
            tid: AtomicU32::new(0),
            timed: AtomicBool::new(false),
            filtered: AtomicBool::new(false),
            tcb: AtomicU64::new(0),
            refused: AtomicBool::new(false),
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

    /// The thread's own stack, if it was learned: memory that stays mapped while the
    /// thread lives. Async-signal-safe.
    pub(crate) fn known_stack(&self) -> Option<(u64, u64)> {
        let high = self.high.load(Ordering::Acquire);
        (high != 0).then(|| (self.low.load(Ordering::Relaxed), high))
    }

    /// Notes where the thread's control block is, the first time. Only the thread itself,
    /// in its handler: async-signal-safe.
    pub(crate) fn note_tcb(&self, tcb: u64) {
        if self.tcb.load(Ordering::Relaxed) == 0 {
            self.tcb.store(tcb, Ordering::Release);
        }
    }

    /// Notes that a system call copying the thread's stack was refused. Only the thread
    /// itself, in its handler: async-signal-safe.
    pub(crate) fn note_refused(&self) {
        self.refused.store(true, Ordering::Release);
    }

    /// Whether a copy was refused since the last call. For the drain only.
    pub(crate) fn take_refused(&self) -> bool {
        self.refused.load(Ordering::Acquire) && self.refused.swap(false, Ordering::AcqRel)
    }

    /// Where the thread's control block is, once its handler ran (0 before).
    pub(crate) fn tcb(&self) -> u64 {
        self.tcb.load(Ordering::Acquire)
    }

    /// Records the thread's own stack, once. For the drain only.
    pub(crate) fn set_stack(&self, low: u64, high: u64) {
        if self.high.load(Ordering::Relaxed) == 0 && low < high {
            self.low.store(low, Ordering::Relaxed);
            self.high.store(high, Ordering::Release);
        }
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
        entry.tcb.store(0, Ordering::Relaxed);
        entry.refused.store(false, Ordering::Relaxed);
        entry.high.store(0, Ordering::Relaxed);
        entry.tid.store(tid, Ordering::Release);
        Some(entry)
    }

    /// Forgets thread `tid`, which exited.
    pub(crate) fn forget(&self, tid: u32) {
        if let Some(entry) = self.find(tid) {
            entry.timed.store(false, Ordering::Release);
            entry.filtered.store(false, Ordering::Release);
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
                new.tcb.store(old.tcb(), Ordering::Relaxed);
                if let Some((low, high)) = old.known_stack() {
                    new.set_stack(low, high);
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

/// [`Mappings::own_stack`] of `maps` (the text of `/proc/self/maps`) parsed for one
/// thread.
#[cfg(test)]
pub(crate) fn own_stack(maps: &str, tcb: u64, main: bool) -> Option<(u64, u64)> {
    Mappings::parse(maps).own_stack(tcb, main)
}

/// The process's mappings as one read of `/proc/self/maps` lists them (in address order),
/// parsed once for the stacks of many threads: with 1,000 threads the file has about
/// 2,000 lines, and parsing it again for each thread learnt cost a drain 10 ms.
pub(crate) struct Mappings {
    /// Start, end, writable, no access.
    areas: Vec<(u64, u64, bool, bool)>,
    /// The main thread's, `[stack]`.
    main: Option<(u64, u64)>,
}

impl Mappings {
    pub(crate) fn parse(maps: &str) -> Mappings {
        let mut areas = Vec::new();
        let mut main = None;
        for line in maps.lines() {
            let mut fields = line.split_ascii_whitespace();
            let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
                continue;
            };
            let Some((start, end)) = range.split_once('-').and_then(|(start, end)| {
                Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                ))
            }) else {
                continue;
            };
            let writable = perms.starts_with("rw");
            if writable && main.is_none() && fields.nth(3) == Some("[stack]") {
                main = Some((start, end));
            }
            areas.push((start, end, writable, perms.starts_with("---")));
        }
        Mappings { areas, main }
    }

    /// A thread's own stack: for the main thread, the kernel's `[stack]`; for another,
    /// `[start, tcb)` of the writable mapping that holds its control block `tcb`, if a
    /// guard page (no access) lies right below it, so that the mapping is the one the
    /// thread library made for this thread alone. `None` where that cannot be told (a
    /// stack the application supplied, with no guard): the thread's samples are then
    /// copied by system calls.
    pub(crate) fn own_stack(&self, tcb: u64, main: bool) -> Option<(u64, u64)> {
        if main {
            return self.main;
        }
        let at = self.areas.partition_point(|&(start, ..)| start <= tcb);
        let (start, end, writable, _) = *self.areas.get(at.checked_sub(1)?)?;
        if tcb >= end {
            return None;
        }
        let guarded = at
            .checked_sub(2)
            .and_then(|below| self.areas.get(below))
            .is_some_and(|&(_, below_end, _, no_access)| below_end == start && no_access);
        (writable && guarded).then_some((start, tcb))
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
    fn a_threads_own_stack_is_the_guarded_mapping_below_its_control_block() {
        let maps = "\
5555a000-5555b000 r-xp 00000000 08:01 42 /usr/bin/app
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000200000 rw-p 00000000 00:00 0
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
7ffc0000-7ffd0000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(
            own_stack(maps, 0x7f00001ff000, false),
            Some((0x7f0000001000, 0x7f00001ff000)),
            "from the guard up to the control block"
        );
        assert_eq!(
            own_stack(maps, 0x7f0000250000, false),
            None,
            "no guard right below: perhaps merged with a neighbour, not told"
        );
        assert_eq!(
            own_stack(maps, 0x7f0000350000, false),
            None,
            "in no mapping"
        );
        assert_eq!(own_stack(maps, 0x7f0000000800, false), None, "in the guard");
        assert_eq!(own_stack(maps, 0, true), Some((0x7ffc0000, 0x7ffd0000)));
        assert_eq!(own_stack("", 0, true), None);
    }

    #[test]
    fn every_thread_learns_a_stack_that_holds_its_own_locals() {
        let maps_of = || std::fs::read_to_string("/proc/self/maps").unwrap();
        let local = 7u64;
        // SAFETY: pthread_self has no preconditions.
        let tcb = unsafe { libc::pthread_self() } as u64;
        let main = crate::process::current_tid() == std::process::id();
        let (low, high) = own_stack(&maps_of(), tcb, main).expect("this thread's stack");
        let here = &local as *const u64 as u64;
        assert!(
            (low..high).contains(&here),
            "{here:#x} in {low:#x}..{high:#x}"
        );
        std::thread::spawn(move || {
            let local = 7u64;
            // SAFETY: as above.
            let tcb = unsafe { libc::pthread_self() } as u64;
            let (low, high) = own_stack(&maps_of(), tcb, false).expect("a spawned thread's");
            let here = &local as *const u64 as u64;
            assert!(
                (low..high).contains(&here),
                "{here:#x} in {low:#x}..{high:#x}"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_stack_is_learned_once_kept_by_a_rebuild_and_forgotten_with_its_thread() {
        let threads = Threads::new(4);
        let thread = threads.add(42).unwrap();
        assert_eq!((thread.known_stack(), thread.tcb()), (None, 0));
        thread.note_tcb(0x2f00);
        thread.note_tcb(0x7700);
        assert_eq!(thread.tcb(), 0x2f00, "the first note stays");
        thread.set_stack(0x1000, 0x2f00);
        assert_eq!(thread.known_stack(), Some((0x1000, 0x2f00)));
        thread.set_stack(0x9000, 0xa000);
        assert_eq!(
            thread.known_stack(),
            Some((0x1000, 0x2f00)),
            "a learned stack is never replaced while its thread lives"
        );
        let rebuilt = threads.rebuilt(1);
        let kept = rebuilt.find(42).unwrap();
        assert_eq!(
            (kept.known_stack(), kept.tcb()),
            (Some((0x1000, 0x2f00)), 0x2f00)
        );
        threads.forget(42);
        let again = threads.add(42).unwrap();
        assert_eq!(
            (again.known_stack(), again.tcb()),
            (None, 0),
            "a reused id learns its stack anew"
        );
    }
}
