//! The off-CPU half of a wall window: a thread of its own (`krabka-wall`) looks at the
//! process's threads at the window's frequency, without a signal, and charges each the
//! real time since its previous look.
//!
//! A look reads the thread's CPU clock (one system call). Unchanged since the previous
//! look, with the thread seen asleep then, it slept there all along: that place is
//! counted again for the time between, and nothing else is read. So a thread that sleeps
//! long costs one clock read a look, and its looks thin out (every 2, 4, ... ticks, at
//! most three seconds apart, on ticks shared with the other quiet threads: the time
//! between is still exact), and the sweep sleeps through ticks no thread is due at. While
//! no thread of the service runs at all (`crate::process::ServiceCpu`), a quiet thread's
//! look is put off without even the clock read. A thread whose clock moved ran
//! meanwhile: its time on the CPU is the CPU
//! sampler's (the running part), its time ready to run comes from its `schedstat`, and
//! the rest it slept. Where it sleeps now is read as a thread dump reads a sleeper
//! (`crate::sampler::SleeperReader`); the time it slept is split between there (half of
//! at most one period) and where it slept at the previous look (the rest), so that an
//! idle thread's long wait is not charged to the next place it waits in. A thread inside
//! labels, or inside a task's poll by tokio's task hooks, is doing work, and its looks
//! never thin out. A thread that runs now and was not
//! seen asleep before slept, if at all, between two looks: that time has a marker of its
//! own. Never a signal: no wait is cut short.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::labels::table::{Resolver, SampleLabels};
use crate::objects::Loaded;
use crate::process::{PerProcess, ServiceCpu};
use crate::sampler::{SleeperReader, Slept};

/// How often, in seconds' worth of ticks, the process's thread count is read (the link
/// count of `/proc/self/task`): the threads are listed (`/proc/self/task`, a millisecond
/// with a thousand of them) when it changed, so a thread that starts meanwhile is looked
/// at from then on... Looks the service's CPU put off ([`ServiceCpu`]) wait for the same
/// tick, so that an idle service wakes the sweep once a second.
const COUNT_EVERY_SECONDS: u64 = 1;

/// ... and at least every this many counts, whatever the count (threads replaced one for
/// one).
const LIST_AT_LEAST_EVERY: u64 = 10;

/// The most ticks between two looks at a thread found unchanged again and again, in
/// seconds' worth: an idle thread costs one clock read per this, and a wait it moves to
/// after one is first charged from the look that finds it (what it slept before that
/// stays where it slept).
const QUIET_SECONDS: u64 = 2;

/// Looks in a row that found a thread unchanged after which the reader closes its files
/// and forgets its last stack (`SleeperReader::keep`): it no longer moves.
const QUIET_FORGOTTEN: u32 = 4;

/// Where the threads a window found asleep at its end slept then, for the next window's
/// first looks: a thread whose CPU clock still reads the same has not run since, so it
/// sleeps at the same place with the same labels, and is not read again (its name, its
/// `schedstat`, its `syscall` file and its stack: three `/proc` files and an unwind, most
/// of what an idle service's window cost). A scraper's windows come one after another:
/// each reads only the threads that ran since the last. Kept until the next window, which
/// drops it if it is older than [`REMEMBERED_FOR`], for at most [`MAX_REMEMBERED`] threads
/// and [`MAX_REMEMBERED_FRAMES`] return addresses in all (about 600 KiB at most), and
/// only while no library was loaded or unloaded and the blocklist is the same (the
/// stacks' addresses would name other code, or be read otherwise).
static REMEMBERED: PerProcess<Mutex<Option<Remembered>>> = PerProcess::new(|| Mutex::new(None));

/// How long a window's places are good for the next: older, its threads are read anew.
const REMEMBERED_FOR: Duration = Duration::from_secs(600);

/// The most threads whose places a window leaves to the next.
const MAX_REMEMBERED: usize = 4096;

/// The most return addresses the places kept hold in all (512 KiB): a window's threads
/// past it are read anew by the next.
const MAX_REMEMBERED_FRAMES: usize = 64 * 1024;

/// What one window left to the next, read with `blocklist`.
struct Remembered {
    loaded: Loaded,
    blocklist: &'static [&'static str],
    at: Instant,
    threads: HashMap<u32, Known>,
}

/// One thread asleep at a window's end.
struct Known {
    clock: Duration,
    waited: Duration,
    name: Arc<str>,
    asleep: OffCpu,
}

/// What the last window left, if it is still good: taken out (a window running beside
/// this one reads its threads itself).
fn take_remembered(loaded: Loaded, blocklist: &'static [&'static str]) -> HashMap<u32, Known> {
    REMEMBERED
        .get()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .filter(|remembered| {
            remembered.loaded == loaded
                && remembered.blocklist == blocklist
                && remembered.at.elapsed() < REMEMBERED_FOR
        })
        .map(|remembered| remembered.threads)
        .unwrap_or_default()
}

/// Where a thread's time off the CPU went, as a sample's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OffCpu {
    pub(crate) tid: u32,
    pub(crate) state: State,
    pub(crate) labels: SampleLabels,
    /// Inside an async task's poll, by tokio's task hooks (`crate::task_hooks`; false
    /// where the app has not installed them).
    pub(crate) polling: bool,
}

impl OffCpu {
    /// Whether the thread is doing work here: inside labels (a request's poll, a span, a
    /// scope) or, by the task hooks, a task's poll.
    pub(crate) fn working(&self) -> bool {
        self.polling || self.labels != SampleLabels::default()
    }
}

/// What a thread off the CPU was doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Asleep in system call `syscall` at `frames` (the sampler's stack: return
    /// addresses, leaf first), read whole or up to a frame that needs the frame pointer.
    Asleep {
        syscall: i64,
        frames: Vec<u64>,
        flags: u8,
        whole: bool,
    },
    /// Asleep in `syscall`, where its stack cannot be read without a signal.
    AsleepUnread { syscall: i64 },
    /// Ready to run, waiting for a CPU.
    Runnable,
    /// Asleep between two looks that both found it running: where, no look saw.
    AsleepUnseen,
}

/// A state's hash: a stack's length and its innermost and outermost frames, not every
/// frame (each look charges a key, and hashing thirty frames with the standard hasher
/// was a tenth of the sweep's CPU); stacks that differ only between them are told apart
/// by `Eq`.
impl std::hash::Hash for State {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            State::Asleep {
                syscall,
                frames,
                flags,
                whole,
            } => {
                (syscall, flags, whole, frames.len()).hash(state);
                frames.iter().take(4).for_each(|frame| frame.hash(state));
                frames
                    .iter()
                    .rev()
                    .take(2)
                    .for_each(|frame| frame.hash(state));
            }
            State::AsleepUnread { syscall } => syscall.hash(state),
            State::Runnable | State::AsleepUnseen => {}
        }
    }
}

/// Time charged to one key, and the looks that found it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Charged {
    pub(crate) looks: u64,
    pub(crate) nanos: u64,
}

/// What a sweep gathered.
pub(crate) struct Swept {
    pub(crate) off_cpu: HashMap<OffCpu, Charged>,
    /// The name of each thread looked at.
    pub(crate) names: HashMap<u32, Arc<str>>,
    /// Looks taken; of them, stacks read, and looks that counted a place again unread.
    pub(crate) looks: u64,
    pub(crate) stacks_read: u64,
    pub(crate) counted_again: u64,
    /// Of the stacks read, those found where the thread was last read, not unwound again.
    pub(crate) same_again: u64,
    /// Looks at quiet threads put off because no thread of the service ran since.
    pub(crate) put_off: u64,
    /// First looks taken from the last window's end, the thread not having run since.
    pub(crate) remembered: u64,
    /// The sweeping thread's own CPU time.
    pub(crate) cpu: Duration,
    pub(crate) elapsed: Duration,
}

/// A sweep running on its own thread: [`stop`](Self::stop) ends it as its window closes,
/// [`finish`](Self::finish) takes what it gathered; dropped (its request hung up), it is
/// woken to stop at once, and its thread ends by itself.
pub(crate) struct Sweeper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Swept>>,
    /// What it gathered, once [`stop`](Self::stop)ped.
    swept: Option<Swept>,
}

impl Sweeper {
    /// Starts looking at every thread `frequency` times a second.
    pub(crate) fn start(frequency: u32, blocklist: &'static [&'static str]) -> Sweeper {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("krabka-wall".to_owned())
            .spawn(move || sweep(frequency, blocklist, &stopping))
            .ok();
        Sweeper {
            stop,
            thread,
            swept: None,
        }
    }

    /// Stops the sweep as its window closes: at once (a look under way finishes first,
    /// then a last look at every thread), however long the sweep meant to sleep.
    pub(crate) fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::Release);
        thread.thread().unpark();
        self.swept = thread.join().ok();
    }

    /// What the sweep gathered (stopping it if it still runs).
    pub(crate) fn finish(mut self) -> Option<Swept> {
        self.stop();
        self.swept.take()
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }
}

/// One watched thread.
struct Watched {
    tid: u32,
    /// When it was last looked at, its CPU clock and its time ready to run then.
    looked: Instant,
    clock: Duration,
    waited: Duration,
    /// Where it slept at that look, if it did.
    asleep: Option<OffCpu>,
    /// Looks in a row that found it asleep in the same place, unchanged.
    quiet: u32,
    /// The tick of its next look.
    next: u64,
    /// The sweep's [`Sweep::ran`] when it was last looked at: the same at a later tick,
    /// no thread of the service has run since.
    ran: u64,
}

impl Watched {
    /// Whether it slept at its last look, outside any work (labels, a task's poll): a
    /// quiet thread, whose look the service's CPU may put off.
    fn idle(&self) -> bool {
        self.asleep.as_ref().is_some_and(|place| !place.working())
    }
}

/// The ticks to the next look at a thread found unchanged `quiet` times in a row: 1, 2,
/// 4, ... up to [`QUIET_SECONDS`]' worth.
fn ticks_to_next(quiet: u32, frequency: u32) -> u64 {
    (1u64 << quiet.min(20)).min(u64::from(frequency.max(1)) * QUIET_SECONDS)
}

/// Looks `ticks` or more apart are rounded up to a tick that is a multiple of this, and
/// looks a second or more apart to a whole second's tick (when the sweep also counts the
/// threads), so that quiet threads are looked at together: the sweep sleeps through ticks
/// no thread is due at (a tick that wakes the sweeping thread costs it 15 to 30 µs of CPU
/// on this project's machines), and an idle service's wakes it once a second.
const QUIET_TOGETHER: u64 = 8;

/// The tick of the next look, `ticks` after `tick`, at `per_second` ticks a second.
fn next_look(tick: u64, ticks: u64, per_second: u64) -> u64 {
    let next = tick + ticks;
    if ticks >= per_second {
        next.next_multiple_of(per_second.max(1))
    } else if ticks >= QUIET_TOGETHER {
        next.next_multiple_of(QUIET_TOGETHER)
    } else {
        next
    }
}

/// The watched threads, each in the slot of the tick of its next look (a wheel of
/// [`QUIET_SECONDS`]' worth of ticks): a tick touches only the threads due then.
struct Wheel {
    slots: Vec<Vec<Watched>>,
    /// The ids watched, sorted.
    tids: Vec<u32>,
}

impl Wheel {
    fn new(frequency: u32) -> Wheel {
        let ticks = (u64::from(frequency.max(1)) * QUIET_SECONDS + 1) as usize;
        Wheel {
            slots: (0..ticks).map(|_| Vec::new()).collect(),
            tids: Vec::new(),
        }
    }

    fn put(&mut self, thread: Watched) {
        let slot = (thread.next % self.slots.len() as u64) as usize;
        self.slots[slot].push(thread);
    }

    /// The first tick from `tick` on with a thread in its slot (at most a turn of the
    /// wheel on).
    fn next_busy(&self, tick: u64) -> u64 {
        let turn = self.slots.len() as u64;
        (tick..tick + turn)
            .find(|&t| !self.slots[(t % turn) as usize].is_empty())
            .unwrap_or(tick + turn)
    }

    /// The threads due at `tick`, taken out.
    fn due(&mut self, tick: u64) -> Vec<Watched> {
        let slot = (tick % self.slots.len() as u64) as usize;
        std::mem::take(&mut self.slots[slot])
    }

    /// Forgets the threads not in `alive` (sorted); returns those forgotten, and those of
    /// `alive` not watched.
    fn follow(&mut self, alive: &[u32]) -> (Vec<u32>, Vec<u32>) {
        for slot in &mut self.slots {
            slot.retain(|thread| alive.binary_search(&thread.tid).is_ok());
        }
        let gone = self
            .tids
            .iter()
            .copied()
            .filter(|tid| alive.binary_search(tid).is_err())
            .collect();
        self.tids.retain(|tid| alive.binary_search(tid).is_ok());
        let new = alive
            .iter()
            .copied()
            .filter(|tid| self.tids.binary_search(tid).is_err())
            .collect();
        (gone, new)
    }

    /// Watches `thread` from now on.
    fn watch(&mut self, thread: Watched) {
        if let Err(at) = self.tids.binary_search(&thread.tid) {
            self.tids.insert(at, thread.tid);
        }
        self.put(thread);
    }

    /// Thread `tid` is gone: a new thread with its id is watched from the next listing.
    fn forget(&mut self, tid: u32) {
        if let Ok(at) = self.tids.binary_search(&tid) {
            self.tids.remove(at);
        }
    }

    /// Every thread watched, taken out.
    fn drain(&mut self) -> Vec<Watched> {
        self.slots.iter_mut().flat_map(std::mem::take).collect()
    }
}

/// Sweeps until `stop`. A tick at which quiet threads are due first reads whether the
/// service ran ([`ServiceCpu`]): a quiet thread due whose last look came after the last
/// reading that found it had run is where that look found it, and its look is put off as
/// a look that found it there would put the next (its time since is charged at the look
/// that comes). This profiler's own threads (`crate::process::OwnThread`: the
/// drain, the worker, the recorder, this one) are not looked at: their waits are the
/// profiler's, not the service's (the drain's stack words change at every wake, so each
/// of its ten wakes a second was a full read); their time on a CPU is in the running
/// part.
fn sweep(frequency: u32, blocklist: &'static [&'static str], stop: &AtomicBool) -> Swept {
    let _own = crate::process::OwnThread::register();
    let cpu_at_start = own_cpu();
    let loaded = Loaded::now();
    let mut reader = SleeperReader::new(blocklist);
    // A request that hung up meanwhile: nothing to look at.
    let stopped_early = stop.load(Ordering::Acquire);
    let period = Duration::from_secs(1) / frequency.max(1);
    let started = Instant::now();
    let own = crate::process::current_tid();
    let mut sweep = Sweep {
        reader: &mut reader,
        period,
        frequency,
        labels: Resolver::default(),
        off_cpu: HashMap::new(),
        names: HashMap::new(),
        looks: 0,
        stacks_read: 0,
        counted_again: 0,
        service: ServiceCpu::new(),
        ran: 0,
        put_off: 0,
        known: if stopped_early {
            HashMap::new()
        } else {
            take_remembered(loaded, blocklist)
        },
        remembered: 0,
    };
    let mut wheel = Wheel::new(frequency);
    let count_every = u64::from(frequency.max(1)) * COUNT_EVERY_SECONDS;
    // Counts on whole seconds' ticks, where the quiet threads' looks are gathered.
    let (mut count_tick, mut counts_unlisted) = (0, 0);
    let mut count = None;
    let mut tick: u64 = 0;
    while !stopped_early && !stop.load(Ordering::Acquire) {
        if tick >= count_tick {
            count_tick = (tick + 1).next_multiple_of(count_every);
            let counted = crate::process::thread_count();
            counts_unlisted += 1;
            if counted != count || counted.is_none() || counts_unlisted >= LIST_AT_LEAST_EVERY {
                count = counted;
                counts_unlisted = 0;
                let mut alive = crate::process::list_threads();
                alive.retain(|&tid| tid != own);
                let (gone, new) = wheel.follow(&alive);
                for tid in gone {
                    sweep.reader.forget(tid);
                }
                for tid in new {
                    // The first look sets where it is: no time before it is charged.
                    if let Some(first) = sweep.first_look(tid, tick) {
                        wheel.watch(first);
                    }
                }
            }
        }
        let due = wheel.due(tick);
        if due
            .iter()
            .any(|thread| thread.next <= tick && thread.idle())
            && sweep.service.ran()
        {
            sweep.ran += 1;
        }
        for mut thread in due {
            if thread.next > tick {
                // Due in a later turn of the wheel.
                wheel.put(thread);
            } else if thread.idle() && thread.ran == sweep.ran {
                // Asleep where its last look found it: no thread of the service ran since.
                // Its look is put off as a look that found it there would put the next
                // (its time since is charged at the look that comes).
                sweep.put_off += 1;
                sweep.quieter(&mut thread, tick);
                wheel.put(thread);
            } else if sweep.look(&mut thread, tick) {
                wheel.put(thread);
            } else {
                wheel.forget(thread.tid);
            }
        }
        tick += 1;
        // Ticks at fixed times from the start, without drifting: one that comes late
        // (a busy machine) is followed at once by the next, each taking only the threads
        // due then, and the weights are the real time between looks whenever they come.
        // Ticks no thread is due at are slept through, up to the next count.
        tick = wheel.next_busy(tick).min(count_tick.max(tick));
        let due = started + period * u32::try_from(tick).unwrap_or(u32::MAX);
        let now = Instant::now();
        if due > now {
            // Woken early by `finish` (or spuriously: the loop looks at the flag first,
            // and a tick taken early only looks sooner).
            std::thread::park_timeout(due - now);
        }
    }
    // The window ends now: every thread's time since its last look is charged (a quiet
    // one's last look may be two seconds back).
    // Where each thread asleep now sleeps is the next window's first look at it.
    if !stopped_early {
        let (mut known, mut frames) = (HashMap::new(), 0);
        for mut thread in wheel.drain() {
            if sweep.look(&mut thread, tick)
                && known.len() < MAX_REMEMBERED
                && frames < MAX_REMEMBERED_FRAMES
                && let (Some(asleep), Some(name)) = (thread.asleep, sweep.names.get(&thread.tid))
            {
                if let State::Asleep { frames: stack, .. } = &asleep.state {
                    frames += stack.len();
                }
                let name = name.clone();
                let (clock, waited) = (thread.clock, thread.waited);
                known.insert(
                    thread.tid,
                    Known {
                        clock,
                        waited,
                        name,
                        asleep,
                    },
                );
            }
        }
        if Loaded::now() == loaded {
            *REMEMBERED
                .get()
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Remembered {
                loaded,
                blocklist,
                at: Instant::now(),
                threads: known,
            });
        }
    }
    let Sweep {
        off_cpu,
        names,
        looks,
        stacks_read,
        counted_again,
        put_off,
        remembered,
        ..
    } = sweep;
    Swept {
        off_cpu,
        names,
        looks,
        stacks_read,
        counted_again,
        put_off,
        remembered,
        same_again: reader.same_again,
        cpu: own_cpu().saturating_sub(cpu_at_start),
        elapsed: started.elapsed(),
    }
}

/// The sweep's working state.
struct Sweep<'r> {
    reader: &'r mut SleeperReader,
    period: Duration,
    frequency: u32,
    labels: Resolver,
    off_cpu: HashMap<OffCpu, Charged>,
    names: HashMap<u32, Arc<str>>,
    looks: u64,
    stacks_read: u64,
    counted_again: u64,
    /// Whether the service ran, read at ticks where quiet threads are due...
    service: ServiceCpu,
    /// ... and the readings so far that found it had, or could not tell.
    ran: u64,
    put_off: u64,
    /// Where the last window left its threads asleep, until each is first looked at.
    known: HashMap<u32, Known>,
    remembered: u64,
}

impl Sweep<'_> {
    /// Watches thread `tid` from now on, unless it is gone or one of this profiler's own.
    fn first_look(&mut self, tid: u32, tick: u64) -> Option<Watched> {
        if crate::process::is_own_thread(tid) {
            return None;
        }
        if let Some(known) = self.known.remove(&tid) {
            let clock = crate::process::thread_cpu_time(tid).ok()?;
            if clock == known.clock {
                // It has not run since the last window's end: asleep there still.
                self.remembered += 1;
                self.names.insert(tid, known.name);
                return Some(Watched {
                    tid,
                    looked: Instant::now(),
                    clock,
                    waited: known.waited,
                    asleep: Some(known.asleep),
                    quiet: 0,
                    next: tick + 1,
                    ran: self.ran,
                });
            }
        }
        // Whatever was kept under its id was another thread's (or its own, before it was
        // watched afresh): its files and stack are read anew.
        self.reader.forget(tid);
        self.names
            .insert(tid, crate::process::thread_name(tid)?.into());
        let clock = crate::process::thread_cpu_time(tid).ok()?;
        let waited = self.reader.run_delay(tid).unwrap_or_default();
        let looked = Instant::now();
        let asleep = self.asleep_as_labelled(tid, clock);
        Some(Watched {
            tid,
            looked,
            clock,
            waited,
            asleep,
            quiet: 0,
            next: tick + 1,
            ran: self.ran,
        })
    }

    /// Thread `thread`, quiet, was found (or is known) asleep where it was once more: its
    /// looks thin out, and after [`QUIET_FORGOTTEN`] the reader forgets its files.
    fn quieter(&mut self, thread: &mut Watched, tick: u64) {
        thread.quiet += 1;
        if thread.quiet == QUIET_FORGOTTEN {
            self.reader.forget(thread.tid);
        }
        let per_second = u64::from(self.frequency.max(1));
        thread.next = next_look(
            tick,
            ticks_to_next(thread.quiet, self.frequency),
            per_second,
        );
    }

    /// Looks at `thread` at `tick`; false once it is gone.
    fn look(&mut self, thread: &mut Watched, tick: u64) -> bool {
        let tid = thread.tid;
        let Ok(clock) = crate::process::thread_cpu_time(tid) else {
            self.reader.forget(tid);
            return false;
        };
        if clock < thread.clock {
            // Another thread with the same id (the one watched exited between two
            // looks): looked at afresh, nothing charged for the time before.
            self.reader.forget(tid);
            return match self.first_look(tid, tick) {
                Some(first) => {
                    *thread = first;
                    true
                }
                None => false,
            };
        }
        let now = Instant::now();
        let elapsed = now.duration_since(thread.looked);
        thread.looked = now;
        thread.ran = self.ran;
        self.looks += 1;
        if clock == thread.clock
            && let Some(place) = &thread.asleep
        {
            // It did not run: asleep there since the last look, and now. A thread inside
            // labels (a request's poll, a span, a scope) or, by the task hooks, a task's
            // poll is doing work: looked at every
            // tick, so that where it sleeps next is charged from when it got there.
            self.counted_again += 1;
            charge(&mut self.off_cpu, place, elapsed, 1);
            if place.working() {
                thread.next = tick + 1;
            } else {
                self.quieter(thread, tick);
            }
            return true;
        }
        // It ran: doing work, read at each move from now on.
        self.reader.keep(tid);
        let ran = clock.saturating_sub(thread.clock);
        let waited_now = self.reader.run_delay(tid).unwrap_or(thread.waited);
        // A wait for a CPU that began before the last look (or before the window: a
        // thread woken then and not yet run) is counted when the thread gets a CPU:
        // never more of it than the time since the last look leaves.
        let waited = waited_now
            .saturating_sub(thread.waited)
            .min(elapsed.saturating_sub(ran));
        let slept = elapsed.saturating_sub(ran).saturating_sub(waited);
        let (labels, polling) = self.labels_of(tid);
        if !waited.is_zero() {
            let key = OffCpu {
                tid,
                state: State::Runnable,
                labels: labels.clone(),
                polling,
            };
            charge(&mut self.off_cpu, &key, waited, 1);
        }
        let before = thread.asleep.take();
        let now_asleep = self.asleep_as_labelled(tid, clock);
        match (&before, &now_asleep) {
            // Asleep here now, and elsewhere at the last look: it moved at a moment no look
            // saw. Half of at most a period of the sleep is charged here, the rest where
            // it slept before: even between two looks a period apart (each place's
            // expected share), and a long wait seen from afar (a thread whose looks had
            // thinned out) stays where it was, not charged to the place it went to.
            (_, Some(here)) => {
                let here_part = slept.min(self.period) / 2;
                let rest = slept - here_part;
                match &before {
                    Some(there) => {
                        charge(&mut self.off_cpu, there, rest, 0);
                        charge(&mut self.off_cpu, here, here_part, 1);
                    }
                    None => charge(&mut self.off_cpu, here, slept, 1),
                }
            }
            // Running now: its sleep was where it slept before, or no look saw it.
            (Some(there), None) => charge(&mut self.off_cpu, there, slept, 0),
            (None, None) if !slept.is_zero() => {
                let key = OffCpu {
                    tid,
                    state: State::AsleepUnseen,
                    labels,
                    polling,
                };
                charge(&mut self.off_cpu, &key, slept, 1);
            }
            (None, None) => {}
        }
        thread.clock = clock;
        thread.waited = waited_now;
        thread.asleep = now_asleep;
        thread.quiet = 0;
        thread.next = tick + 1;
        true
    }

    /// Where thread `tid` sleeps now, with the labels active on it, if it sleeps: both
    /// read while it did not run (its CPU clock `clock` before the labels, the same after
    /// the stack), so that a thread that left a labelled poll and slept elsewhere, or
    /// entered one and blocked there, between the two reads is not given the other's
    /// labels. Read again if it ran, a few times, then taken as running.
    fn asleep_as_labelled(&mut self, tid: u32, mut clock: Duration) -> Option<OffCpu> {
        for _try in 0..3 {
            let (labels, polling) = self.labels_of(tid);
            let state = match self.reader.look(tid, clock) {
                Slept::Read {
                    stack,
                    syscall,
                    whole,
                } => {
                    self.stacks_read += 1;
                    State::Asleep {
                        syscall,
                        frames: stack.frames,
                        flags: stack.flags,
                        whole,
                    }
                }
                Slept::Unread { syscall } => State::AsleepUnread { syscall },
                // Running, or gone: nothing to match.
                Slept::NotAsleep => return None,
                Slept::Ran { clock: now } => {
                    clock = now;
                    continue;
                }
            };
            return Some(OffCpu {
                tid,
                state,
                labels,
                polling,
            });
        }
        None
    }

    /// The labels active on thread `tid` now, and whether the task hooks say it is inside
    /// a task's poll.
    fn labels_of(&mut self, tid: u32) -> (SampleLabels, bool) {
        let words = crate::labels::current::words_of(tid).unwrap_or_default();
        let labels = match words.labels {
            0 => SampleLabels::default(),
            word => self.labels.resolve(word),
        };
        (labels, words.polling)
    }
}

fn charge(off_cpu: &mut HashMap<OffCpu, Charged>, key: &OffCpu, time: Duration, looks: u64) {
    if time.is_zero() && looks == 0 {
        return;
    }
    let charged = match off_cpu.get_mut(key) {
        Some(charged) => charged,
        None => off_cpu.entry(key.clone()).or_default(),
    };
    charged.looks += looks;
    charged.nanos += time.as_nanos() as u64;
}

/// The calling thread's CPU time so far.
fn own_cpu() -> Duration {
    crate::process::clock_time(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{next_look, ticks_to_next};

    #[test]
    fn a_quiet_thread_is_looked_at_less_often_up_to_every_two_seconds() {
        assert_eq!(ticks_to_next(0, 99), 1);
        assert_eq!(ticks_to_next(1, 99), 2);
        assert_eq!(ticks_to_next(3, 99), 8);
        assert_eq!(ticks_to_next(7, 99), 128);
        assert_eq!(ticks_to_next(8, 99), 198);
        assert_eq!(ticks_to_next(40, 99), 198);
        assert_eq!(ticks_to_next(40, 1), 2);
    }

    #[test]
    fn quiet_looks_are_gathered_on_common_ticks_and_busy_ones_are_not() {
        assert_eq!(next_look(5, 1, 99), 6);
        assert_eq!(next_look(5, 4, 99), 9);
        assert_eq!(next_look(5, 8, 99), 16);
        assert_eq!(next_look(16, 8, 99), 24);
        assert_eq!(next_look(17, 64, 99), 88);
        // A second or more: on a whole second's tick, where the threads are counted.
        assert_eq!(next_look(17, 128, 99), 198);
        assert_eq!(next_look(17, 198, 99), 297);
        assert_eq!(next_look(0, 2, 1), 2);
    }
}
