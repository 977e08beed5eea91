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
//! short-lived to get one. The handler (`on_sigprof`, `sampler/handler.rs`):
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
//!    plain loads, only from the thread's current stack pointer up to the end of a range of
//!    its stack already proven readable (`thread_table.rs`: memory between a live thread's
//!    stack pointer and its stack's top stays mapped); anywhere else, only through a copy
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
//! not by their length. `sampler/frames.rs` turns a recorded stack into profile frames.
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
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

mod asking;
mod buffer;
mod dump;
mod fork;
mod frames;
mod handler;
mod memory;
mod scratch;
mod signals;
mod thread_table;
mod timers;
mod unwind;

pub(crate) use asking::{ThreadAnswer, ThreadStacks, take_dump};
pub(crate) use buffer::{StackKey, Tally};
pub(crate) use dump::MAX_DUMP_THREADS;
pub(crate) use frames::stack_frames;
pub(crate) use signals::StartError;
pub(crate) use timers::ThreadCpu;

use crate::objects::Objects;
use crate::process::process_cpu_time;
use buffer::{Records, record_words};
use fork::register_fork_handler;
use handler::{CPU_HANDLERS, Costs, SESSION, Session, on_sigprof};
use memory::Memory;
use scratch::{Slot, scratch_slots};
use signals::{CPU_SIGNAL, DUMP_SIGNAL, install, is_free_for};
use thread_table::Threads;
use timers::Timers;
use unwind::{Library, MAX_DEPTH, Unwinding};

/// How often the caller should [`Sampler::drain`] while a profile runs.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// Threads that can have a timer of their own in one session.
const MAX_THREADS: usize = 4096;

/// What one window of a session collected.
pub(crate) struct Collected {
    pub(crate) stacks: HashMap<StackKey, Tally>,
    /// Samples dropped because the buffer was full.
    pub(crate) lost: Tally,
    pub(crate) started: SystemTime,
    pub(crate) duration: Duration,
    /// CPU time the whole process used during the window (user + system).
    pub(crate) cpu_time: Duration,
    pub(crate) frequency: u32,
    pub(crate) objects: Objects,
    /// Each tracked thread's CPU over the window, from its own clock.
    pub(crate) threads: Vec<ThreadCpu>,
    pub(crate) report: Report,
}

/// How the session went, for the response's log line and the profile's comments.
#[derive(Clone, Debug, Default)]
pub(crate) struct Report {
    /// The stack reader, and why it was chosen.
    pub(crate) reader: &'static str,
    pub(crate) reader_why: String,
    /// `SIGPROF`s that were not this session's (another sender, a late timer).
    pub(crate) foreign_signals: u64,
    /// Our handler was replaced by someone else's during the window; counting stopped.
    pub(crate) handler_replaced: bool,
    /// Threads that had a timer of their own.
    pub(crate) threads_timed: usize,
    /// Why some threads had none.
    pub(crate) timer_shortfall: Option<String>,
    /// Handler time per sample: median and 99th percentile, nanoseconds.
    pub(crate) handler_nanos: (u64, u64),
    /// Mean frames per unwound sample.
    pub(crate) mean_depth: f64,
    /// Unwound samples: read without a system call, and unwound to the outermost frame.
    pub(crate) unwound: u64,
    pub(crate) direct: u64,
    pub(crate) complete: u64,
}

/// The session's running counts at one moment; a window's are the difference between
/// its close and its open.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    lost: Tally,
    foreign: u64,
    unwound: u64,
    direct: u64,
    complete: u64,
    frames: u64,
}

impl Counts {
    fn since(self, start: Counts) -> Counts {
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
        }
    }
}

impl Counts {
    /// The session's running counts now; read under the drained state's lock, so that
    /// they match what has been drained.
    fn of(session: &Session) -> Counts {
        Counts {
            lost: session.records.lost(),
            foreign: session.foreign.load(Ordering::Relaxed),
            unwound: session.costs.unwound.load(Ordering::Relaxed),
            direct: session.costs.direct.load(Ordering::Relaxed),
            complete: session.costs.complete.load(Ordering::Relaxed),
            frames: session.costs.frames.load(Ordering::Relaxed),
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
    /// Each tracked thread's CPU clock.
    threads: HashMap<u32, Duration>,
}

static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// A running sampler. Dropping it stops sampling and frees its memory; it may block for a
/// moment (deleting timers, waiting for handlers, `dlclose`), so drop it on a blocking
/// thread.
pub(crate) struct Sampler {
    /// Shared with the handler through [`SESSION`]; null once taken back.
    session: *mut Session,
    /// A reference to every shared library whose unwind tables the handler reads, so
    /// that a `dlclose` elsewhere cannot unmap them while the session lives.
    libraries: Vec<Library>,
    objects: Objects,
    timers: Mutex<Option<Timers>>,
    handler_replaced: AtomicBool,
    reader_why: String,
    frequency: u32,
}

// SAFETY: `Session` is `Sync` (atomics, a mutex, and slots guarded by their flag), and the
// sampler only hands out shared references to it until it takes it back in `stop`/`drop`.
// The library handles are only passed to `dlclose`, from whichever thread drops them.
unsafe impl Send for Sampler {}
// SAFETY: `&Sampler` only allows `drain` and the window calls, which go through the
// session's and the timers' mutexes.
unsafe impl Sync for Sampler {}

impl Sampler {
    /// Arms the timers at `frequency` Hz. Locates unwind tables, allocates every buffer
    /// the handler will use, installs the handler. Takes about a millisecond.
    pub(crate) fn start(frequency: u32, blocklist: &[&str]) -> Result<Sampler, StartError> {
        register_fork_handler();
        if !is_free_for(CPU_SIGNAL, on_sigprof) {
            return Err(StartError::ForeignHandler);
        }
        let objects = Objects::current();
        let reader = Memory::choose();
        let (unwinding, libraries) = Unwinding::new(&objects, blocklist, reader.memory);

        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        // A buffer holds a quarter second of the worst case (every CPU sampled at the
        // full rate with full-depth stacks), 2.5 drain periods: enough that a drain a
        // little late loses nothing, small enough to stay well under a megabyte at 99 Hz.
        let per_second = frequency as usize * cpus.min(64) * record_words(MAX_DEPTH);
        let words = (per_second / 4).clamp(16 * 1024, 1024 * 1024);

        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let session = Box::new(Session {
            id,
            unwinding,
            slots: (0..scratch_slots()).map(|_| Slot::new()).collect(),
            records: Records::new(words),
            foreign: AtomicU64::new(0),
            threads: Threads::new(MAX_THREADS),
            costs: Costs::new(),
        });

        install(CPU_SIGNAL, on_sigprof, DUMP_SIGNAL)?;
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
        // SAFETY: the session lives until `retire` below or the sampler's `take_session`.
        let threads = unsafe { &(*pointer).threads };
        let timers = match Timers::start(id, frequency, threads) {
            Ok(timers) => timers,
            Err(err) => {
                drop(retire(pointer));
                return Err(StartError::System("timer_create", err));
            }
        };
        Ok(Sampler {
            session: pointer,
            libraries,
            objects,
            timers: Mutex::new(Some(timers)),
            handler_replaced: AtomicBool::new(false),
            reader_why: reader.why,
            frequency,
        })
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

    /// The code addresses window `id` has gathered so far (drained ones; sorted, unique),
    /// as its profile will name them: each stack's leaf as sampled, its return addresses
    /// minus one. Lets the request symbolize most of its profile before the window ends.
    pub(crate) fn window_addresses(&self, id: u64) -> Vec<u64> {
        let Some(session) = self.session() else {
            return Vec::new();
        };
        let drained = session.records.drained();
        let Some((_, stacks)) = drained.windows.iter().find(|(open, _)| *open == id) else {
            return Vec::new();
        };
        let mut addresses: Vec<u64> = stacks
            .keys()
            .flat_map(|key| {
                key.frames
                    .iter()
                    .enumerate()
                    .map(|(i, &address)| if i == 0 { address } else { address - 1 })
            })
            .collect();
        drop(drained);
        addresses.sort_unstable();
        addresses.dedup();
        addresses
    }

    /// The objects this session's profiles are built with (loaded when it started).
    pub(crate) fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Opens window `id`: every sample recorded from now on counts for it, until it
    /// closes. The records before are drained first (for the windows already open).
    pub(crate) fn open_window(&self, id: u64) -> WindowStart {
        let threads = self
            .timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Timers::clocks)
            .unwrap_or_default();
        let mut counts = Counts::default();
        if let Some(session) = self.session() {
            let mut drained = session.records.drain();
            counts = Counts::of(session);
            drained.windows.push((id, HashMap::new()));
        }
        WindowStart {
            id,
            started: SystemTime::now(),
            started_at: Instant::now(),
            cpu: process_cpu_time(),
            counts,
            threads,
        }
    }

    /// Closes a window and returns what it collected: every sample recorded while it was
    /// open, and the session's counts, clocks and report over that time.
    pub(crate) fn close_window(&self, start: WindowStart) -> Collected {
        let duration = start.started_at.elapsed();
        let cpu_time = process_cpu_time().saturating_sub(start.cpu);
        let (threads, threads_timed, timer_shortfall) = {
            let timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
            match timers.as_ref() {
                Some(timers) => (
                    timers.cpu_since(&start.threads),
                    timers.tracked(),
                    timers.shortfall.clone(),
                ),
                None => (Vec::new(), 0, None),
            }
        };
        let mut stacks = HashMap::new();
        let mut counts = Counts::default();
        let mut handler_nanos = (0, 0);
        if let Some(session) = self.session() {
            let mut drained = session.records.drain();
            counts = Counts::of(session).since(start.counts);
            handler_nanos = (session.costs.quantile(0.5), session.costs.quantile(0.99));
            if let Some(at) = drained.windows.iter().position(|(id, _)| *id == start.id) {
                stacks = drained.windows.swap_remove(at).1;
            }
        }
        let report = Report {
            reader: self.session().map_or("none", |s| s.unwinding.memory.name()),
            reader_why: self.reader_why.clone(),
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
        };
        Collected {
            stacks,
            lost: counts.lost,
            started: start.started,
            duration,
            cpu_time,
            frequency: self.frequency,
            objects: self.objects.clone(),
            threads,
            report,
        }
    }

    /// Closes window `id` without collecting it (its client hung up); nothing if it is
    /// not open.
    pub(crate) fn forget_window(&self, id: u64) {
        if let Some(session) = self.session() {
            let mut drained = session.records.drained();
            drained.windows.retain(|(open, _)| *open != id);
        }
    }

    /// Folds the records written so far into the stack counts, and gives threads that
    /// started since the last drain their own timers. If another handler replaced ours,
    /// the timers stop: their signals would only disturb the other profiler.
    pub(crate) fn drain(&self) {
        let Some(session) = self.session() else {
            return;
        };
        drop(session.records.drain());
        let mut timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        if !handler::is_ours() {
            self.handler_replaced.store(true, Ordering::Relaxed);
            drop(timers.take());
        } else if let Some(timers) = timers.as_mut() {
            timers.refresh(&session.threads);
        }
    }

    /// Deletes the timers and takes the session back from the handler.
    fn take_session(&mut self) -> Option<Session> {
        drop(
            self.timers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let pointer = std::mem::replace(&mut self.session, std::ptr::null_mut());
        if pointer.is_null() {
            return None;
        }
        let session = *retire(pointer);
        // Only now that no handler can read their unwind tables.
        self.libraries.clear();
        Some(session)
    }
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
/// hands it back.
fn retire(pointer: *mut Session) -> Box<Session> {
    let _ = SESSION.compare_exchange(
        pointer,
        std::ptr::null_mut(),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    CPU_HANDLERS.wait_until_none();
    // SAFETY: `pointer` came from `Box::into_raw`, and no handler can reach it any more.
    unsafe { Box::from_raw(pointer) }
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
        let deadline = Instant::now() + Duration::from_secs(2);
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
}
