//! The drain ([`Sampler::drain`]): off the signal path, every [`DRAIN_EVERY`] while a
//! window is open, it folds the records into a batch; when the threads' work is due
//! ([`thread_work_every`]), and always when a window opens or closes, it judges the batch
//! by the threads' clocks, gives it to the open windows, gives new threads their timers
//! (`following.rs`), and follows libraries loaded or unloaded.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::following::{has_own_filter, learn_stacks, mark_filtered, refresh_threads};
use super::handler::{self, CPU_HANDLERS, Session};
use super::memory::Memory;
use super::timers::Registry;
use super::unwind::Unwinding;
use super::{DRAIN_EVERY, DrainState, Sampler, frames, labels, thread_name};
use crate::objects::{Loaded, Objects};
use crate::process::{blocks_signal, list_threads, process_cpu_time};

impl Sampler {
    /// Folds the records written so far, and when the threads' work is due (see
    /// [`thread_work_every`]) judges them by the threads' clocks, gives them to the open
    /// windows, gives threads that started since their own timers, and follows libraries
    /// loaded or unloaded. If another handler replaced ours, the timers stop: their
    /// signals would only disturb the other profiler.
    ///
    /// Returns how long until the next drain: [`DRAIN_EVERY`], or longer after a drain
    /// that found no record (see [`idle_drain_every`]).
    pub(crate) fn drain(&self) -> Duration {
        let Some(session) = self.session() else {
            return DRAIN_EVERY;
        };
        let mut state = self.state();
        let now = Instant::now();
        // A process that gained or lost threads gets their timers sooner; one whose
        // threads are replaced one for one, at the next due time. The CPU the service's
        // threads used (`ServiceCpu`) is read first, past the early mark: the same as at
        // the last drain, none of them ran, so none started or exited, and the count is
        // not read. Due, the threads' work is put off to the next drain while the
        // service's threads together used less than a period of CPU since the last: none
        // of them can be shown as blocking `SIGPROF` (two periods unsampled) or as a
        // silent timer (five), a sample that came meanwhile waits in the batch, and the
        // clocks read later say the same of the time between. An idle service's drains
        // read no thread's clock. The share compared with is the one read before the
        // threads' work read the clocks.
        let mut due = false;
        if now >= state.thread_work_early {
            let share = state.service.share();
            let ran = share.is_none() || share != state.service_at_drain;
            state.service_at_drain = share;
            let used = match (state.service_at_work, share) {
                (Some(then), Some(now)) if then <= now => now - then,
                _ => Duration::MAX,
            };
            due = (ran && crate::process::thread_count() != Some(state.alive.len()))
                || (now >= state.thread_work_due && used >= self.period());
            if due {
                state.service_at_work = share;
            }
        }
        if self.drain_locked(session, &mut state, due) {
            DRAIN_EVERY
        } else {
            self.idle_drain_every
        }
    }

    /// [`drain`](Self::drain), under the drain lock; the threads' work done if `threads`
    /// (always when a window opens or closes, so that each gets exactly its samples).
    /// Whether it found records (or left some for a handler still writing them).
    pub(super) fn drain_locked(
        &self,
        session: &Session,
        state: &mut DrainState,
        threads: bool,
    ) -> bool {
        let mut registry = Registry::lock();
        // The thread's own clock: what the threads' work costs decides when it is done
        // next.
        let cost_from = own_cpu_time();
        // Some timed thread's clock could not be read: the thread is gone.
        let mut gone = false;
        if threads {
            // Read before the records: a sample folded now was taken before its thread's
            // clock was read, or in the moment between (a period of slack covers it).
            registry.clocks(&mut state.clocks);
            gone = state.clocks.len() < registry.len();
        }
        let DrainState {
            windows,
            accounting,
            batch,
            fresh,
            clocks,
            labels: resolver,
            names,
            objects,
            alive,
            unlisted,
            ..
        } = &mut *state;
        labels::drain_begins();
        // Whole unless a handler stopped mid-write: its buffer's records wait for a later
        // drain, and so does the sweep, which must not free a set they may carry.
        let whole = session
            .records
            .drain(fresh, &mut |word| resolver.resolve(word));
        let found = !whole || !fresh.is_empty();
        resolver.clear();
        // SAFETY: the drain lock is held: this is the one writer of the published tables.
        let unwinding = unsafe { session.unwinding.get() };
        frames::drop_guessed_callers_of_all(fresh, unwinding, objects);
        if whole {
            labels::sweep();
        }
        // Named at every drain, while they may still live.
        for (key, tally) in fresh.drain() {
            names.entry(key.tid).or_insert_with(|| {
                // First seen: one the last listing missed (it started since, and may be
                // gone) makes the next threads' work list them, and forget its name.
                *unlisted |= alive.binary_search(&key.tid).is_err();
                thread_name(key.tid).into()
            });
            let sum = batch.entry(key).or_default();
            sum.samples += tally.samples;
            sum.periods += tally.periods;
        }
        if !threads {
            if !state.stopped && !handler::is_ours() {
                self.stop_timers(&mut registry, state);
            }
            drop(registry);
            if state.loaded.changed() {
                self.follow_libraries(session, state);
            }
            return found;
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
            return found;
        }
        if !handler::is_ours() {
            self.stop_timers(&mut registry, state);
            return found;
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
        // A thread is looked at for a seccomp filter of its own when it is first listed,
        // before its timer is made (`refresh_threads`), and again only when a system call
        // reading its stack was refused since: a read of its `status` costs about 10 µs,
        // which at every drain for each busy thread would cost 200 busy threads 2 % of a
        // core.
        let mut unlearned = Vec::new();
        for tid in drain.ran {
            if let Some(entry) = threads.find(tid)
                && entry.known_stack().is_none()
                && entry.tcb() != 0
                && state.stacks_looked.insert(tid)
            {
                unlearned.push((tid, entry.tcb()));
            }
            if let Some(entry) = threads.find(tid)
                && entry.take_refused()
                && !entry.is_filtered()
                && has_own_filter(tid, self.seccomp)
            {
                mark_filtered(session, entry);
            }
        }
        learn_stacks(threads, &unlearned);
        // Listing the threads is the costliest part (about 1 ms with 1,000 of them): done
        // when they changed, as a thread gone (its clock), a thread sampled that the last
        // listing did not see, a count that differs, or a thread still without a timer
        // say, and at least every few threads' works (a thread replaced one for one by a
        // new one, all between two of them).
        let relist = gone
            || state.unlisted
            || registry.shortfall().is_some()
            || state.listings_skipped + 1 >= RELIST_AT_LEAST_EVERY
            || crate::process::thread_count() != Some(state.alive.len());
        if relist {
            let alive = list_threads();
            state
                .stacks_looked
                .retain(|tid| alive.binary_search(tid).is_ok());
            refresh_threads(session, state, &mut registry, &alive, self.seccomp);
            state.alive = alive;
            state.listings_skipped = 0;
            state.unlisted = false;
        } else {
            state.listings_skipped += 1;
        }
        drop(registry);
        if state.loaded.changed() {
            self.follow_libraries(session, state);
        }
        let cost = own_cpu_time().saturating_sub(cost_from);
        let every = thread_work_every(cost);
        let now = Instant::now();
        state.thread_work_due = now + every;
        state.thread_work_early = now + every / 2;
        found
    }

    /// Another handler replaced ours: the timers stop.
    fn stop_timers(&self, registry: &mut Registry, state: &mut DrainState) {
        self.handler_replaced.store(true, Ordering::Relaxed);
        registry.disarm();
        // The process-wide timer too: its signals would go on reaching the other handler
        // at the session's rate, on whichever thread burns CPU.
        if let Some(backstop) = &self.backstop {
            backstop.disarm();
        }
        state.stopped = true;
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
}

/// The share of a core the threads' work of the drains may take (as `1 /` this): listing
/// the process's threads (`/proc/self/task`), reading each timed thread's clock, making
/// timers, learning new threads' stacks. With 1,000 threads it costs about 2 ms here
/// (5 ms while new threads' stacks are learnt from `/proc/self/maps`); done at every
/// [`DRAIN_EVERY`], it cost 1 % of a core whatever the threads did (bench figure S).
pub(super) const THREAD_WORK_SHARE: u32 = 1_000; // 1/1,000: 0.1 %

/// The longest the threads' work waits while the service runs: the samples held
/// meanwhile, and a thread that started meanwhile sampled by the backstop only. While
/// the service's threads use less than a period of CPU, it waits longer (`drain`): their
/// samples, if any, wait with it.
pub(super) const THREAD_WORK_AT_MOST_EVERY: Duration = Duration::from_secs(2);

/// How long after threads' work that took `cost` of CPU the next is due: every drain while
/// it is cheap, then as far apart as keeps it under [`THREAD_WORK_SHARE`], up to
/// [`THREAD_WORK_AT_MOST_EVERY`]. The drains between only fold the records (a cost that
/// grows with the samples, not the threads); the windows get their samples at the next
/// threads' work, and always when one opens or closes.
pub(super) fn thread_work_every(cost: Duration) -> Duration {
    (cost * THREAD_WORK_SHARE).clamp(DRAIN_EVERY, THREAD_WORK_AT_MOST_EVERY)
}

/// How long after a drain that found no record the next comes, for a session at
/// `frequency` Hz on `cpus` CPUs whose record buffers hold `words` words each: half the
/// time a buffer takes to fill in the worst case (every CPU sampled at the full rate with
/// full-depth stacks, as [`buffer_words`](super::buffer_words) counts it), from
/// [`DRAIN_EVERY`] to a second. A drain wakes its thread, which costs it 15 to 30 µs of
/// CPU on this project's machines (a tenth of the drain thread's CPU on an idle service);
/// where nothing was sampled since the last drain, the samples a burst brings meanwhile
/// still fit.
pub(super) fn idle_drain_every(words: usize, frequency: u32, cpus: usize) -> Duration {
    let per_second = f64::from(frequency.max(1))
        * cpus.clamp(1, 64) as f64
        * super::buffer::record_words(super::unwind::MAX_DEPTH) as f64;
    Duration::from_secs_f64(words as f64 / per_second / 2.0)
        .clamp(DRAIN_EVERY, Duration::from_secs(1))
}

/// The threads' works of which at least one lists `/proc/self/task`, whatever says the
/// threads did not change.
pub(super) const RELIST_AT_LEAST_EVERY: u32 = 5;

/// The calling thread's CPU time so far.
fn own_cpu_time() -> Duration {
    crate::process::clock_time(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}
