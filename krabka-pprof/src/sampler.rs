//! The CPU sampler: per-thread CPU-time timers that send `SIGPROF`, a signal handler that
//! unwinds the interrupted thread and writes its stack into a pre-allocated buffer, and a
//! drain that aggregates stacks off the signal path; the same handler answers thread
//! dumps. This file holds the safety contract of everything that runs in the handler,
//! the lifecycle of a session (start, windows, drain, stop) and of the fork handler; each
//! step below names the file that does it.
//!
//! # What runs in the signal handler, and why it is safe
//!
//! Each thread's timer (`sampler/timers.rs`) signals that thread once per `1/frequency`
//! seconds of its own CPU time; a process-wide backstop timer covers threads too
//! short-lived to get one. The handler (`on_sigprof`, `sampler/handler.rs`) runs with
//! every blockable signal blocked (`sampler/signals.rs`, as Go's are installed; test
//! `the_handler_runs_with_every_blockable_signal_blocked`): no handler of the
//! application's nests inside it, so none can leave it half done. It:
//!
//! 1. saves `errno`, and registers itself in an atomic counter of running handlers
//!    (`handler.rs`);
//! 2. hands a thread dump's signal (`SI_QUEUE`, a dump's tag in its value) to the dump
//!    (`sampler/dump.rs`: the thread unwinds itself into its reply slot) and returns: a
//!    dump never becomes a sample or a foreign signal, whether or not a session runs;
//! 3. loads the session pointer (null when no profile runs: it returns at once);
//! 4. keeps only this session's own timer signals: `si_code == SI_TIMER` and a signal
//!    value carrying the session's number (`timers.rs`; `kill -PROF`, `raise`, another
//!    profiler's timer and a finished session's late signals are counted as foreign and
//!    dropped); a backstop signal is dropped on a thread that has a timer of its own
//!    (`sampler/thread_table.rs`);
//! 5. weighs the sample by `1 + si_overrun`: the periods the timer could not signal
//!    (it fires at most once per kernel tick) are CPU time this sample stands for;
//! 6. takes a scratch slot with a compare-and-swap (`sampler/scratch.rs`; no lock; if
//!    every slot is in use by handlers on other threads, it records the interrupted PC
//!    alone, marked as such);
//! 7. reads the registers from the `ucontext` the kernel passed (`sampler/unwind.rs`);
//! 8. unwinds with [framehop](https://docs.rs/framehop) with fixed storage (no allocation),
//!    from unwind tables (`.eh_frame_hdr`/`.eh_frame`) located in memory before the timers
//!    started, of objects that cannot be unmapped while the session lives (the executable,
//!    the vDSO, and libraries pinned with `dlopen(RTLD_NOLOAD)` and confirmed by `dlinfo`
//!    to be the copy listed); framehop takes no locks and does not allocate in this mode
//!    (`unwind.rs`);
//! 9. reads the stack in one of two ways that cannot fault (`sampler/memory.rs`): with
//!    plain loads, only where the stack pointer lies in the thread's own stack mapping,
//!    from it up to the mapping's top (`thread_table.rs`: learned off the signal path
//!    from `/proc/self/maps`, never from what an unwind read, so a switched stack, a
//!    coroutine's segment or an alternate signal stack is never read this way; test
//!    `host::stacks_switched_onto_segments_mapped_anew_are_sampled_and_marked`); anywhere
//!    else, only through a copy
//!    made by a system call (`process_vm_readv`, or `pread` of `/proc/self/mem` where a
//!    seccomp filter is installed) that fails instead of faulting. A wrong unwind rule can
//!    at worst end the stack early, never crash the process;
//! 10. reserves space in the active buffer with one `fetch_add` and writes the record with
//!     plain atomic stores; if the buffer is full, it counts a lost sample
//!     (`sampler/buffer.rs`);
//! 11. restores `errno`.
//!
//! Nothing in the handler allocates, locks, formats, logs or can block (a dump's handler
//! may wait for a scratch slot, never past the dump's deadline): it uses atomics,
//! memory owned by the session, and the async-signal-safe `process_vm_readv`, `pread`,
//! `gettid` and `clock_gettime` calls. Its frames and stack copy live in the slot, and
//! framehop's unwind storage is sized to real tables (`FixedStorage` in `unwind.rs`), so
//! it uses about 3 KiB of the interrupted thread's stack besides the kernel's signal
//! frame, whatever the stack's depth (measured by a test below).
//!
//! Off the signal path, a drain ([`Sampler::drain`], called about every 100 ms while a
//! window is open, and when one opens or closes) gives new threads their timers, swaps the
//! two buffers, waits for handlers still writing to the old one, and folds its records
//! into each open window's map from stack to count and weight (`buffer.rs`). A window
//! opened or closed at a swap gets exactly the records written while it was open. Memory
//! is therefore bounded by the buffer size and the distinct stacks of the open windows,
//! not by their length. `sampler/frames.rs` turns a recorded stack into profile frames,
//! and cuts a stack after the first frame no unwind table covers, whose callers could
//! only be guessed.
//!
//! Stopping deletes the timers, clears the session pointer, waits until no handler is
//! running, and only then frees the session. The handler stays installed between
//! profiles (it returns at once when no session exists), so a late `SIGPROF` can never
//! meet the default action, which would kill the process. Nothing survives `execve`
//! (POSIX timers are deleted by it) or `fork` (they are not inherited, and a fork handler
//! in `handler.rs` clears the child's copy of the session so that the child can profile
//! itself). Thread dumps are asked for in `sampler/asking.rs`, off the signal path, and
//! freed the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

mod accounting;
mod asking;
mod asleep;
mod buffer;
mod dump;
mod fork;
mod frames;
mod handler;
mod memory;
mod published;
mod scratch;
mod signals;
mod thread_table;
mod timers;
mod unwind;
mod windows;

pub(crate) use asking::{Canceller, DumpTurn, ThreadAnswer, ThreadStacks, take_dump};
pub(crate) use buffer::{StackKey, Tally};
pub(crate) use dump::{MAX_DUMP_THREADS, Stack};
pub(crate) use frames::stack_frames;
pub(crate) use signals::StartError;
pub(crate) use windows::{Collected, Report};

use crate::labels::table::{self as labels, Resolver};
use crate::objects::{Loaded, Objects};
use crate::process::{ProcThread, blocks_signal, list_threads, process_cpu_time};
use accounting::Accounting;
use buffer::{Records, record_words};
use fork::register_fork_handler;
use handler::{CPU_HANDLERS, Costs, SESSION, Session, on_sigprof};
use memory::Memory;
use published::Published;
use scratch::{Slot, scratch_slots};
use signals::{CPU_SIGNAL, install, is_free_for};
use thread_table::Threads;
use timers::{Backstop, Registry};
use unwind::{MAX_DEPTH, Unwinding};
use windows::Windows;

/// How often the caller should [`Sampler::drain`] while a profile runs.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// The session's running counts at one moment; a window's are the difference between
/// its close and its open.
#[derive(Clone, Debug, Default)]
struct Counts {
    lost: Tally,
    foreign: u64,
    unwound: u64,
    direct: u64,
    complete: u64,
    frames: u64,
    rebuilds: u64,
    /// The handler's cost histogram.
    costs: Vec<u32>,
}

impl Counts {
    /// The session's counts now; read under the drain lock, so that they match what has
    /// been drained.
    fn of(session: &Session, rebuilds: u64) -> Counts {
        Counts {
            lost: session.records.lost(),
            foreign: session.foreign.load(Ordering::Relaxed),
            unwound: session.costs.unwound.load(Ordering::Relaxed),
            direct: session.costs.direct.load(Ordering::Relaxed),
            complete: session.costs.complete.load(Ordering::Relaxed),
            frames: session.costs.frames.load(Ordering::Relaxed),
            rebuilds,
            costs: session.costs.histogram(),
        }
    }

    fn since(&self, start: &Counts) -> Counts {
        Counts {
            lost: Tally {
                samples: self.lost.samples.saturating_sub(start.lost.samples),
                periods: self.lost.periods.saturating_sub(start.lost.periods),
            },
            foreign: self.foreign.saturating_sub(start.foreign),
            unwound: self.unwound.saturating_sub(start.unwound),
            direct: self.direct.saturating_sub(start.direct),
            complete: self.complete.saturating_sub(start.complete),
            frames: self.frames.saturating_sub(start.frames),
            rebuilds: self.rebuilds.saturating_sub(start.rebuilds),
            costs: self
                .costs
                .iter()
                .zip(start.costs.iter().chain(std::iter::repeat(&0)))
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
        }
    }
}

/// Where a window began: what [`Sampler::close_window`] subtracts.
pub(crate) struct WindowStart {
    id: u64,
    started: SystemTime,
    started_at: Instant,
    cpu: Duration,
    counts: Counts,
}

/// What the drain works with, under one lock (the only writer of the session's
/// published tables): the windows, the CPU accounting, the objects last listed.
struct DrainState {
    windows: Windows,
    accounting: Accounting,
    /// One drain's samples, reused.
    batch: HashMap<StackKey, Tally>,
    /// The timed threads' clocks, reused.
    clocks: Vec<(u32, Duration)>,
    /// The loaded objects, and the loader's count of loads and unloads when they were
    /// listed: a change means the unwinder is built anew.
    loaded: Loaded,
    /// Every object seen during the session: what profiles are symbolized with (a library
    /// unloaded before the window ends still names its frames).
    objects: Objects,
    rebuilds: u64,
    /// The timers stopped: another handler replaced ours.
    stopped: bool,
    /// Label words seen this drain, and the sets they name.
    labels: Resolver,
    /// The names of the threads sampled, read when first seen (a thread that exits
    /// before the drain is named `[short-lived thread]`).
    names: HashMap<u32, Arc<str>>,
    /// When each thread that ran was last looked at for a seccomp filter of its own:
    /// at most once per [`SECCOMP_RECHECK`] (a read of its `status` file costs about
    /// 10 µs, and every drain would read one per busy thread: 200 busy threads, 2 % of
    /// a core).
    seccomp_checked: HashMap<u32, Instant>,
    /// The threads whose own stack was looked for in `/proc/self/maps` (found or not):
    /// each is looked for once.
    stacks_looked: std::collections::HashSet<u32>,
}

/// How often a thread that runs is looked at again for a seccomp filter installed since
/// it was first seen.
const SECCOMP_RECHECK: Duration = Duration::from_secs(1);

static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// A running sampler. Dropping it stops sampling and frees its memory; it may block for a
/// moment (disarming timers, waiting for handlers), so drop it on a blocking thread.
pub(crate) struct Sampler {
    /// Shared with the handler through [`SESSION`]; null once taken back.
    session: *mut Session,
    drain: Mutex<DrainState>,
    backstop: Option<Backstop>,
    blocklist: &'static [&'static str],
    handler_replaced: AtomicBool,
    reader_why: String,
    /// The reader was chosen as usual ([`memory::Choice::usual`]).
    reader_usual: bool,
    frequency: u32,
    /// The process that started it: a child made by `fork` that drops it touches no
    /// timer (the ids would name the child's own).
    pid: u32,
    /// The seccomp mode and filters of the thread that chose the session's stack reader
    /// (and proved it works): a thread whose own differ has a filter of its own, which may
    /// forbid that reader.
    seccomp: Option<(u32, u32)>,
}

// SAFETY: `Session` is `Sync` (atomics, and slots guarded by their flag), and the sampler
// only hands out shared references to it until it takes it back in `drop`.
unsafe impl Send for Sampler {}
// SAFETY: `&Sampler` only allows `drain` and the window calls, which go through the drain
// lock.
unsafe impl Sync for Sampler {}

impl Sampler {
    /// Arms the timers at `frequency` Hz. Locates unwind tables, allocates every buffer
    /// the handler will use, installs the handler. Takes a millisecond or so.
    pub(crate) fn start(
        frequency: u32,
        blocklist: &'static [&'static str],
    ) -> Result<Sampler, StartError> {
        register_fork_handler();
        if !is_free_for(CPU_SIGNAL, on_sigprof) {
            return Err(StartError::ForeignHandler);
        }
        let loaded = Loaded::now();
        let objects = Objects::current();
        let reader = Memory::choose();
        let unwinding = Unwinding::new(&objects, blocklist, reader.memory);
        let period = Duration::from_nanos(1_000_000_000 / u64::from(frequency.max(1)));

        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let words = buffer_words(frequency, cpus);

        let alive = list_threads();
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let session = Box::new(Session {
            id,
            unwinding: Published::new(unwinding),
            slots: (0..scratch_slots()).map(|_| Slot::new()).collect(),
            records: Records::new(words),
            foreign: AtomicU64::new(0),
            threads: Published::new(Threads::new(alive.len())),
            costs: Costs::new(),
            labels: labels_readable(&objects),
        });
        // Before any record can hold a handle: from here on, sets are freed only at drains.
        labels::set_collecting(true);

        install(CPU_SIGNAL, on_sigprof)?;
        let pointer = Box::into_raw(session);
        if SESSION
            .compare_exchange(
                std::ptr::null_mut(),
                pointer,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            // SAFETY: `pointer` came from `Box::into_raw` above and was never shared.
            drop(unsafe { Box::from_raw(pointer) });
            return Err(StartError::Running);
        }
        let mut sampler = Sampler {
            session: pointer,
            drain: Mutex::new(DrainState {
                windows: Windows::default(),
                accounting: Accounting::new(period, process_cpu_time()),
                batch: HashMap::new(),
                clocks: Vec::new(),
                loaded,
                objects,
                rebuilds: 0,
                stopped: false,
                labels: Resolver::default(),
                names: HashMap::new(),
                seccomp_checked: HashMap::new(),
                stacks_looked: Default::default(),
            }),
            backstop: None,
            blocklist,
            handler_replaced: AtomicBool::new(false),
            reader_why: reader.why,
            reader_usual: reader.usual,
            frequency,
            pid: std::process::id(),
            seccomp: ProcThread::seccomp(crate::process::current_tid()),
        };
        {
            let mut registry = Registry::lock();
            registry.arm(period);
            let state = sampler
                .drain
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            // SAFETY: the session lives until `take_session`, which needs `&mut self`.
            let session = unsafe { &*pointer };
            refresh_threads(session, state, &mut registry, &alive, sampler.seccomp);
        }
        // After the threads' own timers, so that it never samples a thread that has one.
        match Backstop::start(id, period) {
            Ok(backstop) => sampler.backstop = Some(backstop),
            // Dropping the sampler disarms the thread timers and retires the session.
            Err(err) => return Err(StartError::System("timer_create", err)),
        }
        Ok(sampler)
    }

    /// The frequency the timers run at.
    pub(crate) fn frequency(&self) -> u32 {
        self.frequency
    }

    /// The session itself, while it runs.
    fn session(&self) -> Option<&Session> {
        // SAFETY: the session lives until `take_session`, which needs `&mut self`.
        (!self.session.is_null()).then(|| unsafe { &*self.session })
    }

    fn state(&self) -> MutexGuard<'_, DrainState> {
        self.drain.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The code addresses window `id` has gathered so far (drained ones; sorted, unique),
    /// as its profile will name them: each stack's leaf as sampled, its return addresses
    /// minus one. Lets the request symbolize most of its profile before the window ends.
    pub(crate) fn window_addresses(&self, id: u64) -> Vec<u64> {
        self.state().windows.addresses(id)
    }

    /// The objects this session's profiles are built with: every object seen loaded
    /// while it ran.
    pub(crate) fn objects(&self) -> Objects {
        self.state().objects.clone()
    }

    /// Opens window `id`: every sample recorded from now on counts for it, until it
    /// closes. The records before are drained first (for the windows already open).
    pub(crate) fn open_window(&self, id: u64) -> WindowStart {
        let mut counts = Counts::default();
        if let Some(session) = self.session() {
            let mut state = self.state();
            self.drain_locked(session, &mut state);
            counts = Counts::of(session, state.rebuilds);
            state.windows.open(id);
        }
        WindowStart {
            id,
            started: SystemTime::now(),
            started_at: Instant::now(),
            cpu: process_cpu_time(),
            counts,
        }
    }

    /// Closes a window and returns what it collected: every sample recorded while it was
    /// open, and the session's counts, clocks and report over that time.
    pub(crate) fn close_window(&self, start: WindowStart) -> Collected {
        self.close_then_open(start, None).0
    }

    /// Closes a window and opens window `next` at the same drain, so that every sample
    /// counts for exactly one of the two: a recorder's slices follow one another with no
    /// gap and no overlap.
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "for the recorder, which comes with issue 25")
    )]
    pub(crate) fn rotate_window(&self, start: WindowStart, next: u64) -> (Collected, WindowStart) {
        let (collected, next) = self.close_then_open(start, Some(next));
        (collected, next.expect("a window was opened"))
    }

    fn close_then_open(
        &self,
        start: WindowStart,
        next: Option<u64>,
    ) -> (Collected, Option<WindowStart>) {
        let mut drained = None;
        let mut counts = Counts::default();
        let (threads_timed, timer_shortfall);
        let (objects, reader);
        let mut opened = None;
        let closed_at = Instant::now();
        let cpu_now = process_cpu_time();
        {
            let mut state = self.state();
            if let Some(session) = self.session() {
                self.drain_locked(session, &mut state);
                let now = Counts::of(session, state.rebuilds);
                counts = now.since(&start.counts);
                drained = state.windows.close(start.id);
                if let Some(id) = next {
                    state.windows.open(id);
                    opened = Some(WindowStart {
                        id,
                        started: SystemTime::now(),
                        started_at: closed_at,
                        cpu: cpu_now,
                        counts: now,
                    });
                }
            }
            objects = state.objects.clone();
            reader = self.session().map_or("none", |session| {
                // SAFETY: the drain lock is held, under which alone the unwinder is
                // replaced.
                let unwinding = unsafe { session.unwinding.get() };
                unwinding.memory.name()
            });
            let registry = Registry::lock();
            threads_timed = registry.len();
            timer_shortfall = registry.shortfall().map(str::to_owned);
        }
        let duration = closed_at.duration_since(start.started_at);
        let cpu_time = cpu_now.saturating_sub(start.cpu);
        let handler_nanos = (
            Costs::quantile_of(&counts.costs, 0.5),
            Costs::quantile_of(&counts.costs, 0.99),
        );
        let report = Report {
            reader,
            reader_why: self.reader_why.clone(),
            reader_usual: self.reader_usual && reader == "/proc/self/mem",
            foreign_signals: counts.foreign,
            handler_replaced: self.handler_replaced.load(Ordering::Relaxed) || !handler::is_ours(),
            threads_timed,
            timer_shortfall,
            handler_nanos,
            unwound: counts.unwound,
            direct: counts.direct,
            complete: counts.complete,
            mean_depth: if counts.unwound == 0 {
                0.0
            } else {
                counts.frames as f64 / counts.unwound as f64
            },
            unwinder_rebuilds: counts.rebuilds,
            labels: self.session().is_some_and(|session| session.labels),
        };
        let drained = drained.unwrap_or(windows::Drained {
            stacks: HashMap::new(),
            blocked: Vec::new(),
            unattributed: Duration::ZERO,
            names: HashMap::new(),
        });
        let collected = Collected {
            stacks: drained.stacks,
            names: drained.names,
            lost: counts.lost,
            blocked: drained.blocked,
            unattributed: drained.unattributed,
            started: start.started,
            duration,
            cpu_time,
            frequency: self.frequency,
            objects,
            report,
        };
        (collected, opened)
    }

    /// Closes window `id` without collecting it (its client hung up); nothing if it is
    /// not open.
    pub(crate) fn forget_window(&self, id: u64) {
        drop(self.state().windows.close(id));
    }

    /// Folds the records written so far into the open windows' stack counts, gives
    /// threads that started since the last drain their own timers, and follows libraries
    /// loaded or unloaded. If another handler replaced ours, the timers stop: their
    /// signals would only disturb the other profiler.
    pub(crate) fn drain(&self) {
        let Some(session) = self.session() else {
            return;
        };
        let mut state = self.state();
        self.drain_locked(session, &mut state);
    }

    /// [`drain`](Self::drain), under the drain lock.
    fn drain_locked(&self, session: &Session, state: &mut DrainState) {
        let mut registry = Registry::lock();
        let DrainState {
            windows,
            accounting,
            batch,
            clocks,
            labels: resolver,
            names,
            objects,
            ..
        } = &mut *state;
        registry.clocks(clocks);
        labels::drain_begins();
        session
            .records
            .drain(batch, &mut |word| resolver.resolve(word));
        resolver.clear();
        // SAFETY: the drain lock is held: this is the one writer of the published tables.
        let unwinding = unsafe { session.unwinding.get() };
        frames::drop_guessed_callers_of_all(batch, unwinding, objects);
        labels::sweep();
        for key in batch.keys() {
            names
                .entry(key.tid)
                .or_insert_with(|| thread_name(key.tid).into());
        }
        let process = process_cpu_time();
        let drain = accounting.drain(clocks, process, batch, &mut |tid| {
            blocks_signal(tid, libc::SIGPROF)
        });
        for &(tid, _) in &drain.blocked {
            names.entry(tid).or_insert_with(|| thread_name(tid).into());
        }
        windows.add(batch, &drain, names);
        if state.stopped {
            return;
        }
        if !handler::is_ours() {
            self.handler_replaced.store(true, Ordering::Relaxed);
            registry.disarm();
            // The process-wide timer too: its signals would go on reaching the other
            // handler at the session's rate, on whichever thread burns CPU.
            if let Some(backstop) = &self.backstop {
                backstop.disarm();
            }
            state.stopped = true;
            return;
        }
        // SAFETY: the drain lock is held: this is the one writer of the published tables.
        let threads = unsafe { session.threads.get() };
        for tid in drain.silent {
            // Its timer measures a thread that exited; the id is another thread's now.
            if registry.renew(tid)
                && let Ok(clock) = crate::process::thread_cpu_time(tid)
            {
                state.accounting.track(tid, clock);
            }
        }
        // A thread that ran may have installed a seccomp filter of its own since: looked
        // at again once a second, not once a drain.
        let now = Instant::now();
        let mut unlearned = Vec::new();
        for tid in drain.ran {
            if let Some(entry) = threads.find(tid)
                && entry.known_stack().is_none()
                && entry.tcb() != 0
                && state.stacks_looked.insert(tid)
            {
                unlearned.push((tid, entry.tcb()));
            }
            let due = state
                .seccomp_checked
                .get(&tid)
                .is_none_or(|last| now.duration_since(*last) >= SECCOMP_RECHECK);
            if !due {
                continue;
            }
            state.seccomp_checked.insert(tid, now);
            if let Some(entry) = threads.find(tid)
                && !entry.is_filtered()
                && has_own_filter(tid, self.seccomp)
            {
                mark_filtered(session, entry);
            }
        }
        learn_stacks(threads, &unlearned);
        let alive = list_threads();
        state
            .seccomp_checked
            .retain(|tid, _| alive.binary_search(tid).is_ok());
        state
            .stacks_looked
            .retain(|tid| alive.binary_search(tid).is_ok());
        refresh_threads(session, state, &mut registry, &alive, self.seccomp);
        drop(registry);
        if state.loaded.changed() {
            self.follow_libraries(session, state);
        }
    }

    /// Libraries were loaded or unloaded: the unwinder is built anew over the objects
    /// loaded now (copying the tables of new libraries), and published; the objects the
    /// profiles are symbolized with gain the new ones.
    fn follow_libraries(&self, session: &Session, state: &mut DrainState) {
        state.loaded = Loaded::now();
        let objects = Objects::current();
        let unwinding = Unwinding::new(&objects, self.blocklist, Memory::choose().memory);
        session.unwinding.replace(unwinding, &CPU_HANDLERS);
        state.objects = objects.merged_with(&state.objects);
        state.rebuilds += 1;
    }

    /// Disarms the timers and takes the session back from the handler.
    fn take_session(&mut self) -> Option<Session> {
        let pointer = std::mem::replace(&mut self.session, std::ptr::null_mut());
        if pointer.is_null() {
            return None;
        }
        if self.pid == std::process::id() {
            Registry::lock().disarm();
        } else if let Some(backstop) = self.backstop.take() {
            // A child made by `fork`: the ids are not its own.
            std::mem::forget(backstop);
        }
        drop(self.backstop.take());
        let session = retire(pointer).map(|session| *session);
        // No handler writes records any more; those not drained are dropped unread.
        labels::set_collecting(false);
        session
    }
}

/// The words of a session's record buffer, for `frequency` Hz on `cpus` CPUs: a quarter
/// second of the worst case (every CPU sampled at the full rate with full-depth stacks;
/// more than 64 CPUs count as 64), 2.5 drain periods: enough that a drain a little late
/// loses nothing, small enough to stay well under a megabyte at 99 Hz; from 16 Ki to
/// 1 Mi words.
fn buffer_words(frequency: u32, cpus: usize) -> usize {
    let per_second = frequency as usize * cpus.min(64) * record_words(MAX_DEPTH);
    (per_second / 4).clamp(16 * 1024, 1024 * 1024)
}

/// Gives every thread in `alive` (sorted) a timer and an entry in the session's table, and
/// forgets the threads that exited; rebuilds the table when tombstones would fill it.
fn refresh_threads(
    session: &Session,
    state: &mut DrainState,
    registry: &mut Registry,
    alive: &[u32],
    seccomp: Option<(u32, u32)>,
) {
    let changes = registry.refresh(alive);
    // SAFETY: the caller holds the drain lock: this is the one writer of the table.
    let mut threads = unsafe { session.threads.get() };
    for &tid in &changes.exited {
        threads.forget(tid);
    }
    // Every name of a thread gone, not only the timed ones the registry lists: a thread
    // that lived and died between two listings, sampled by the backstop, was named too,
    // and one session of a service that starts 100 threads a second would otherwise
    // keep a name for each of them (and hand a reused id the dead thread's name).
    state
        .names
        .retain(|tid, _| alive.binary_search(tid).is_ok());
    if threads.needs_rebuild(alive.len()) {
        session
            .threads
            .replace(threads.rebuilt(alive.len()), &CPU_HANDLERS);
        // SAFETY: as above; the new table.
        threads = unsafe { session.threads.get() };
    }
    let known: Vec<u32> = threads.known().collect();
    for tid in known {
        if alive.binary_search(&tid).is_err() {
            threads.forget(tid);
        }
    }
    for &tid in alive {
        let Some(entry) = threads.add(tid) else {
            continue;
        };
        let timed = registry.is_timed(tid);
        if timed != entry.is_timed() {
            entry.set_timed(timed);
        }
    }
    for &tid in &changes.timed {
        if let Some(entry) = threads.find(tid)
            && has_own_filter(tid, seccomp)
        {
            mark_filtered(session, entry);
        }
        if let Ok(clock) = crate::process::thread_cpu_time(tid) {
            state.accounting.track(tid, clock);
        }
    }
}

/// Learns the own stacks of `threads` (id, control block) from one read of
/// `/proc/self/maps`, so that their later samples on them are read with plain loads.
fn learn_stacks(table: &Threads, threads: &[(u32, u64)]) {
    if threads.is_empty() {
        return;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let pid = std::process::id();
    for &(tid, tcb) in threads {
        if let Some(entry) = table.find(tid)
            && let Some((low, high)) = thread_table::own_stack(&maps, tcb, tid == pid)
        {
            entry.set_stack(low, high);
        }
    }
}

/// Whether the handler may read a thread's label word: this crate's code is in the main
/// executable (a shared library's thread-locals may be set up lazily, with `malloc`, on a
/// thread's first access: not in a signal handler).
fn labels_readable(objects: &Objects) -> bool {
    objects
        .find(crate::labels::current::code_address())
        .is_some_and(|(_, object)| {
            object.file.as_deref() == Some(std::path::Path::new("/proc/self/exe"))
        })
}

/// The name a profile gives a thread that exited before its name was read.
pub(crate) const UNNAMED_THREAD: &str = "[short-lived thread]";

/// A sampled thread's name while it lives, [`UNNAMED_THREAD`] once it has exited (never
/// its id: a profile's thread names are few, its threads' ids are many).
fn thread_name(tid: u32) -> String {
    crate::process::thread_name(tid).unwrap_or_else(|| UNNAMED_THREAD.to_owned())
}

/// Whether thread `tid` has a seccomp filter the thread that chose the stack reader
/// (`chooser`: its mode and filter count) does not: one it installed itself.
fn has_own_filter(tid: u32, chooser: Option<(u32, u32)>) -> bool {
    match ProcThread::seccomp(tid) {
        Some((0, _)) | None => false,
        theirs => theirs != chooser,
    }
}

/// Marks a thread as having a seccomp filter of its own: from now on its stack is copied
/// through the scratch slots' pipes, opened first.
fn mark_filtered(session: &Session, entry: &thread_table::Thread) {
    for slot in session.slots.iter() {
        slot.pipe.open();
    }
    entry.set_filtered();
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // A request that was cancelled: stop and free everything; the handler never sees
        // the session again.
        if let Some(session) = self.take_session() {
            #[cfg(test)]
            tests::note_teardown();
            drop(session);
        }
    }
}

/// Clears the session pointer, waits until no handler can still use the session, and
/// hands it back; `None` if a handler never returned (then it stays allocated).
fn retire(pointer: *mut Session) -> Option<Box<Session>> {
    let _ = SESSION.compare_exchange(
        pointer,
        std::ptr::null_mut(),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    // SAFETY: `pointer` came from `Box::into_raw`, and no handler can reach it any more.
    CPU_HANDLERS
        .wait_until_none()
        .then(|| unsafe { Box::from_raw(pointer) })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    /// One sampler per process: the tests that start one take this first.
    pub(crate) static ONE_SAMPLER: Mutex<()> = Mutex::new(());

    /// The thread that last tore a cancelled session down.
    pub(crate) static TORN_DOWN_ON: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);

    pub(super) fn note_teardown() {
        *TORN_DOWN_ON.lock().unwrap() = Some(std::thread::current().id());
    }

    /// How far below the interrupted code's stack pointer the kernel's signal frame and the
    /// handler reach, measured by painting the stack below a spinning thread and sampling it.
    #[test]
    fn the_handler_uses_little_of_the_interrupted_threads_stack() {
        const PAINT: usize = 48 * 1024;
        const COLOUR: u8 = 0xa7;

        #[inline(never)]
        fn paint_and_spin(stop: &AtomicBool, spins: &AtomicU64) -> usize {
            let marker = 0u8;
            let sp = std::hint::black_box(&raw const marker) as usize;
            // Below the red zone, down to PAINT bytes below this frame.
            let low = sp - 256 - PAINT;
            for at in low..sp - 256 {
                // SAFETY: this thread's own stack, below the current frame and within its
                // 1 MiB; nothing else uses it.
                unsafe { std::ptr::write_volatile(at as *mut u8, COLOUR) };
            }
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                spins.store(x, Ordering::Relaxed);
            }
            // The lowest byte that is no longer the paint: how deep the signal frames went.
            let lowest = (low..sp - 256)
                // SAFETY: as above.
                .find(|&at| unsafe { std::ptr::read_volatile(at as *const u8) } != COLOUR)
                .unwrap_or(sp);
            sp - lowest
        }

        let _one = ONE_SAMPLER.lock().unwrap_or_else(PoisonError::into_inner);
        let stop = Arc::new(AtomicBool::new(false));
        let spins = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, spins) = (stop.clone(), spins.clone());
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || paint_and_spin(&stop, &spins))
                .unwrap()
        };
        while spins.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let sampler = Sampler::start(1000, &[]).expect("a sampler");
        let window = sampler.open_window(1);
        // Until 200 samples are in (a virtual machine's vCPU can miss the kernel's ticks, at
        // which CPU timers fire, for 100 ms of CPU at a stretch, and a busy machine gives
        // the spinner less than a core), for at most a minute.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut samples = 0;
        while samples < 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            sampler.drain();
            // SAFETY: the session lives until `stop` below.
            let session = unsafe { &*sampler.session };
            samples = session.costs.unwound.load(Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
        let used = thread.join().unwrap();
        let collected = sampler.close_window(window);
        drop(sampler);
        assert!(samples >= 100, "{samples} samples to judge by");
        eprintln!(
            "signal frame + handler: {used} bytes below the interrupted sp; handler {:?} ns",
            collected.report.handler_nanos
        );
        // The kernel's own signal frame (its size depends on the CPU's vector registers),
        // plus 4 KiB for the handler.
        // SAFETY: getauxval has no preconditions; 51 is AT_MINSIGSTKSZ.
        let kernel_frame = unsafe { libc::getauxval(51) } as usize;
        let bound = kernel_frame.max(2048) + 4096;
        assert!(
            used < bound,
            "{used} bytes of the interrupted thread's stack (bound {bound}, the kernel's \
             frame {kernel_frame})"
        );
    }

    #[test]
    fn rotated_windows_follow_one_another_without_a_gap_and_a_forgotten_one_gathers_nothing() {
        let _one = ONE_SAMPLER.lock().unwrap_or_else(PoisonError::into_inner);
        let stop = Arc::new(AtomicBool::new(false));
        // The spinner's own CPU clock (the kernel's), in nanoseconds: each slice grows by
        // 10 ms more of the spinner's CPU at a time, however busy the machine is.
        let spun = Arc::new(AtomicU64::new(0));
        let thread_cpu = || {
            let mut time = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: writes the calling thread's CPU clock into `time`.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
            time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
        };
        let spinner = {
            let (stop, spun) = (stop.clone(), spun.clone());
            std::thread::spawn(move || {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..10_000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                    spun.store(thread_cpu(), Ordering::Relaxed);
                }
            })
        };
        let spin_more = |nanos: u64| {
            let from = spun.load(Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_secs(60);
            while spun.load(Ordering::Relaxed) < from + nanos {
                assert!(
                    Instant::now() < deadline,
                    "the spinner got no CPU for a minute"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let sampler = Sampler::start(1000, &[]).expect("a sampler");
        // A window whose client hung up at once: forgotten, it gathers nothing more.
        let forgotten = sampler.open_window(99);
        sampler.forget_window(99);
        let first = sampler.open_window(1);
        let opened = first.started_at;
        let mut start = first;
        let mut slices = Vec::new();
        let samples_in = |id: u64| -> u64 {
            sampler
                .state()
                .windows
                .stacks(id)
                .map_or(0, |stacks| stacks.values().map(|tally| tally.samples).sum())
        };
        for next in 2..=4 {
            // CPU timers fire at the kernel's ticks, which a virtual machine's vCPU can miss
            // for 100 ms of CPU at a stretch: a slice lasts until its window has drained two
            // samples of the spinner, in steps of 10 ms of its CPU, for at most a minute.
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut seen = 0;
            while seen < 2 {
                assert!(
                    Instant::now() < deadline,
                    "slice {} drained {seen} samples in a minute",
                    next - 2
                );
                spin_more(10_000_000);
                sampler.drain();
                seen = samples_in(start.id);
            }
            let (collected, following) = sampler.rotate_window(start, next);
            let kept: u64 = collected.stacks.values().map(|t| t.samples).sum();
            assert!(
                kept >= seen,
                "the slice lost samples it had: {kept} of {seen}"
            );
            assert_eq!(
                samples_in(next),
                0,
                "the next window starts with nothing: the rotation's drain was the slice's"
            );
            assert_eq!(
                following.started_at - opened,
                slices
                    .iter()
                    .map(|c: &Collected| c.duration)
                    .sum::<Duration>()
                    + collected.duration,
                "each slice starts where the last ended"
            );
            slices.push(collected);
            start = following;
        }
        let last = sampler.close_window(start);
        let after_forgetting = sampler.close_window(forgotten);
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        drop(sampler);
        assert!(last.duration > Duration::ZERO);
        // Each slice holds its own samples, not its neighbour's.
        for (i, slice) in slices.iter().enumerate() {
            let samples: u64 = slice.stacks.values().map(|t| t.samples).sum();
            assert!(samples >= 2, "slice {i} has {samples} samples");
        }
        assert!(
            after_forgetting.stacks.is_empty(),
            "a forgotten window gathered {} stacks",
            after_forgetting.stacks.len()
        );
    }

    #[test]
    fn a_buffer_holds_a_quarter_second_of_the_worst_case_within_its_bounds() {
        let record = record_words(MAX_DEPTH);
        // Inside the bounds: 1000 Hz on 8 CPUs, and 100 Hz on 64.
        for (frequency, cpus) in [(1000, 8), (100, 64)] {
            let quarter = frequency * cpus * record / 4;
            assert!((16 * 1024..1024 * 1024).contains(&quarter), "{quarter}");
            assert_eq!(buffer_words(frequency as u32, cpus), quarter);
        }
        // More CPUs count as 64.
        assert_eq!(buffer_words(100, 256), buffer_words(100, 64));
        // 99 Hz on 2 CPUs is under the floor; 10 kHz on 64 over the ceiling (8 MiB).
        assert_eq!(buffer_words(99, 2), 16 * 1024);
        assert_eq!(buffer_words(10_000, 64), 1024 * 1024);
    }

    /// Whether the running kernel is older than `major.minor`, and its release.
    fn kernel_before(major: u32, minor: u32) -> (bool, String) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut numbers = release
            .trim()
            .split(['.', '-'])
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        (version < (major, minor), release.trim().to_owned())
    }

    #[test]
    fn the_names_of_threads_gone_are_forgotten_by_the_session() {
        let _one = ONE_SAMPLER.lock().unwrap_or_else(PoisonError::into_inner);
        // Before 6.4 the backstop's signals go to the main thread: threads no listing saw
        // are counted, not sampled, and so never named (docs/platforms.md).
        let (old_kernel, release) = kernel_before(6, 4);
        let sampler = Sampler::start(1000, &[]).expect("a sampler");
        let window = sampler.open_window(1);
        // Threads that start and end between two drains, no listing sees them: the
        // backstop samples them. Its timer fires at the kernel's ticks, which a virtual
        // machine's vCPU can miss for 100 ms of CPU at a stretch: rounds of ten threads
        // (5 ms of CPU each) until one of them was sampled, for at most a minute.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut short: Vec<u32> = Vec::new();
        loop {
            short.extend((0..10).map(|_| {
                std::thread::spawn(|| {
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() as u32 };
                    let clock = || crate::process::thread_cpu_time(tid).expect("own clock");
                    let until = clock() + Duration::from_millis(5);
                    while clock() < until {
                        std::hint::black_box((0..1_000u64).sum::<u64>());
                    }
                    tid
                })
                .join()
                .unwrap()
            }));
            sampler.drain();
            let sampled_one = sampler
                .state()
                .windows
                .stacks(window.id)
                .is_some_and(|stacks| stacks.keys().any(|key| short.contains(&key.tid)));
            if sampled_one || old_kernel || Instant::now() >= deadline {
                break;
            }
        }
        let named: Vec<u32> = sampler.state().names.keys().copied().collect();
        let collected = sampler.close_window(window);
        drop(sampler);
        let sampled: Vec<u32> = collected
            .stacks
            .keys()
            .map(|key| key.tid)
            .filter(|tid| short.contains(tid))
            .collect();
        if sampled.is_empty() {
            assert!(
                old_kernel,
                "none of {} short-lived threads was sampled in a minute on {release}",
                short.len()
            );
            eprintln!("kernel {release}: short-lived threads are not sampled; nothing to show");
            return;
        }
        assert!(
            sampled.iter().all(|tid| collected.names.contains_key(tid)),
            "the window keeps the names of the threads it sampled"
        );
        let kept: Vec<&u32> = named.iter().filter(|tid| short.contains(tid)).collect();
        assert!(
            kept.is_empty(),
            "the session still names {} threads gone: {kept:?}",
            kept.len()
        );
    }

    #[test]
    fn labels_are_read_where_this_crate_is_in_the_executable() {
        // The test binary holds this crate: the handler may read its label word.
        assert!(labels_readable(&Objects::current()));
        // Where this crate's code is in no object known (or a library), it may not.
        assert!(!labels_readable(&Objects::default()));
    }

    #[test]
    fn a_thread_is_named_while_it_lives_and_unnamed_where_there_is_none() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let named = std::thread::Builder::new()
            .name("krabka-named".to_owned())
            .spawn(move || {
                tid_tx.send(crate::process::current_tid()).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        let tid = tid_rx.recv().unwrap();
        assert_eq!(thread_name(tid), "krabka-named");
        stop_tx.send(()).unwrap();
        named.join().unwrap();
        // A thread id no thread has (pid_max is at most 2^22).
        assert_eq!(thread_name(u32::MAX), UNNAMED_THREAD);
    }

    #[test]
    fn only_a_filter_the_chooser_does_not_share_is_a_threads_own() {
        let here = crate::process::current_tid();
        let chooser = ProcThread::seccomp(here);
        assert!(!has_own_filter(here, chooser), "the chooser's own filters");
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let filtered = std::thread::spawn(move || {
            crate::process::tests::install_allow_all_seccomp_filter();
            tid_tx.send(crate::process::current_tid()).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let own = has_own_filter(tid, chooser);
        let theirs = has_own_filter(tid, ProcThread::seccomp(tid));
        stop_tx.send(()).unwrap();
        filtered.join().unwrap();
        assert!(own, "a filter this thread installed is its own");
        assert!(!theirs, "a chooser with the same filters does not count it");
    }
}
