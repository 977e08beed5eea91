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
//! window is open, further apart after one that found no record (`idle_drain_every` in
//! `drain.rs`: up to a second), and when one opens or closes) swaps the two buffers,
//! waits for handlers still writing to the old one (at most 100 ms: past it, a later
//! drain folds that buffer), and folds its records into a batch. The threads' work (new
//! threads' timers, the clocks that hold each thread's samples to its CPU, the batch into
//! each open window's map from stack to count and weight, `buffer.rs`) is done by the
//! drains that find it due (`drain.rs`'s `thread_work_every`: every drain where it is
//! cheap, up to every 2 s where threads are many; put off while the service's threads
//! used less than a period of CPU since the last, `process::ServiceCpu`) and always when
//! a window opens or closes. A window opened or closed at a swap gets exactly the records written while it was open. Memory
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
//!
//! # Every rule, and the test that holds it
//!
//! | rule | held by |
//! |---|---|
//! | no handler of the application's nests inside ours | `signals::the_handler_runs_with_every_blockable_signal_blocked`; `host::a_handler_of_the_hosts_that_leaves_by_siglongjmp_never_cuts_ours_short` |
//! | only this session's own timer signals are samples | `truth::signals_that_are_not_the_samplers_are_not_samples`; `host::another_sigprof_handler_is_not_replaced` |
//! | plain loads only inside the thread's own stack mapping, learned off the signal path; anything else copied by a call that fails instead of faulting | `thread_table::a_threads_own_stack_is_the_guarded_mapping_below_its_control_block`, `…::every_thread_learns_a_stack_that_holds_its_own_locals`, `…::a_stack_is_learned_once_kept_by_a_rebuild_and_forgotten_with_its_thread`; `memory::both_readers_stop_at_the_first_unmapped_page`, `…::stack_reader_stops_at_unreadable_memory`; `host::stacks_switched_onto_segments_mapped_anew_are_sampled_and_marked` |
//! | a thread with a seccomp filter of its own is read only with calls its filter allows | `host::a_thread_with_a_seccomp_filter_of_its_own_lives_and_is_unwound`, `host::a_seccomp_filter_killing_for_process_vm_readv_kills_nothing` |
//! | a scratch slot has one user; none free: the PC alone, marked; a dump's handler waits for one at most `dump::MAX_SCRATCH_WAIT` | `scratch::a_slot_is_taken_by_one_handler_until_it_is_given_back`; `dump::a_dumps_handler_gives_up_on_a_scratch_slot_within_its_bound` |
//! | about 3 KiB of the interrupted thread's stack | `the_handler_uses_little_of_the_interrupted_threads_stack`; `truth::a_thread_with_little_stack_left_survives_being_profiled` |
//! | a record is folded only once written whole; a full buffer counts lost samples; a drain waits for a handler still writing at most `buffer::MAX_WRITER_WAIT`, then leaves that buffer (and the label sweep) to a later drain | `buffer::a_late_handlers_record_is_folded_only_once_it_is_written_whole`, `buffer::buffer_records_round_trip_and_overflow_is_counted`, `buffer::a_drain_does_not_wait_on_a_handler_stopped_mid_write_and_folds_its_record_later` |
//! | a stack ends with a marker wherever it stops short: depth, no tables, code in no object, a switch of stacks, unreadable memory | `truth::a_stack_deeper_than_recorded_ends_in_truncated`; `frames::a_stack_ends_at_the_first_frame_no_unwind_table_covers`; `host::stacks_switched_onto_segments_mapped_anew_are_sampled_and_marked` |
//! | a sleeping thread's stack is read without a signal, and never from a record not proven its frame's own | `asleep::a_thread_asleep_in_poll_or_on_a_futex_is_read_without_a_signal_and_never_interrupted`, `asleep::a_stack_read_asleep_stops_where_the_frame_pointer_is_needed_and_takes_no_record` |
//! | freeing waits for running handlers, at most `signals::HANDLER_WAIT`; one that never returns leaks what it may read, said once, and the next quiet moment ends that | `signals::a_wait_for_handlers_waits_for_them_and_gives_up_on_one_that_never_returns`; `published::a_replaced_value_is_freed_once_no_handler_runs_and_the_last_with_its_owner` |
//! | every period accounted: held to the thread's CPU, a blocking thread under its marker, a silent timer renewed only for a thread id used again | `accounting::*`; `timers::the_registry_gives_timers_to_the_threads_listed_and_deletes_those_gone`; `truth::weights_add_up_to_the_cpu_used_at_every_frequency` |
//! | nothing survives `exec`; a forked child profiles itself | `host::a_program_execd_during_a_profile_runs`, `host::a_forked_child_profiles_itself` |

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

mod accounting;
mod asking;
mod asleep;
mod buffer;
mod drain;
mod dump;
mod following;
mod fork;
mod frames;
mod handler;
mod memory;
mod prologue;
mod published;
mod scratch;
mod signals;
mod sleepers;
mod thread_table;
mod timers;
mod unwind;
mod windows;

pub(crate) use asking::{Canceller, DumpTurn, ThreadAnswer, ThreadStacks, take_dump};
pub(crate) use buffer::{StackKey, Tally};
pub(crate) use dump::{MAX_DUMP_THREADS, Stack};
pub(crate) use frames::stack_frames;
pub(crate) use signals::StartError;
pub(crate) use sleepers::{SleeperReader, Slept};
pub(crate) use windows::{Collected, Report};

use crate::labels::table::{self as labels, Resolver};
use crate::objects::{Loaded, Objects};
use crate::process::{ProcThread, list_threads, process_cpu_time};
use accounting::Accounting;
use buffer::{Records, record_words};
use following::refresh_threads;
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
    /// The samples drained since the threads' work was last done (see
    /// [`thread_work_every`](drain::thread_work_every)): held until then, when the
    /// threads' clocks judge them and the open windows get them.
    batch: HashMap<StackKey, Tally>,
    /// One drain's samples, reused.
    fresh: HashMap<StackKey, Tally>,
    /// When the threads' work is due next: a drain before it only folds the records...
    thread_work_due: Instant,
    /// ... unless it is past this (half way there) and the process has another number of
    /// threads than `alive`, those of the last listing of `/proc/self/task` (sorted). Due,
    /// it waits while the service's threads used less than a period of CPU since the last
    /// (`drain`).
    thread_work_early: Instant,
    alive: Vec<u32>,
    /// The threads' works since that listing, which each skipped: nothing said the threads
    /// changed (see [`RELIST_AT_LEAST_EVERY`](drain::RELIST_AT_LEAST_EVERY)).
    listings_skipped: u32,
    /// A thread the last listing did not see was sampled since: the threads changed.
    unlisted: bool,
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
    /// The threads whose own stack was looked for in `/proc/self/maps` (found or not):
    /// each is looked for once.
    stacks_looked: std::collections::HashSet<u32>,
    /// The CPU the service's threads used, read by the drain thread past the early mark,
    /// what it read then last, and what it read before the last threads' work it did.
    service: crate::process::ServiceCpu,
    service_at_drain: Option<Duration>,
    service_at_work: Option<Duration>,
}

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
    /// How long after a drain that found no record the next comes.
    idle_drain_every: Duration,
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
                fresh: HashMap::new(),
                thread_work_due: Instant::now(),
                thread_work_early: Instant::now(),
                alive: alive.clone(),
                listings_skipped: 0,
                unlisted: false,
                clocks: Vec::new(),
                loaded,
                objects,
                rebuilds: 0,
                stopped: false,
                labels: Resolver::default(),
                names: HashMap::new(),
                stacks_looked: Default::default(),
                service: crate::process::ServiceCpu::new(),
                service_at_drain: None,
                service_at_work: None,
            }),
            backstop: None,
            blocklist,
            handler_replaced: AtomicBool::new(false),
            reader_why: reader.why,
            reader_usual: reader.usual,
            frequency,
            idle_drain_every: drain::idle_drain_every(words, frequency, cpus),
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

    /// The timers' period.
    fn period(&self) -> Duration {
        Duration::from_nanos(1_000_000_000 / u64::from(self.frequency.max(1)))
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
        let state = self.state();
        // The samples held for the next threads' work are every open window's.
        let mut addresses = state.windows.addresses(id);
        if state.windows.is_open(id) {
            addresses.extend(state.batch.keys().flat_map(windows::addresses_of));
            addresses.sort_unstable();
            addresses.dedup();
        }
        addresses
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
            self.drain_locked(session, &mut state, true);
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
                self.drain_locked(session, &mut state, true);
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
/// loses nothing (a drain after one that found no record waits half of it at most), small enough to stay well under a megabyte at 99 Hz; from 16 Ki to
/// 1 Mi words.
fn buffer_words(frequency: u32, cpus: usize) -> usize {
    let per_second = frequency as usize * cpus.min(64) * record_words(MAX_DEPTH);
    (per_second / 4).clamp(16 * 1024, 1024 * 1024)
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
pub(crate) mod tests;
