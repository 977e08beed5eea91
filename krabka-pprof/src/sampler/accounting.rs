//! The CPU each thread used between two drains, from its own clock, against what its
//! samples say: so that no window is charged CPU from before it opened, a thread that
//! blocks `SIGPROF` shows its CPU under a marker instead of nowhere, a timer that stopped
//! firing is noticed, and what no thread's clock accounts for (threads that lived and
//! died between two drains, where the kernel gives the process-wide backstop's signals to
//! a thread that drops them) is counted rather than lost. Pure bookkeeping, off the signal
//! path; the drain (`sampler.rs`) reads the clocks and hands the results to the windows.

use std::collections::HashMap;
use std::time::Duration;

use super::buffer::{StackKey, Tally};

/// What the drain keeps per timed thread.
#[derive(Clone, Copy, Debug)]
struct Account {
    /// Its CPU clock at the last drain.
    clock: Duration,
    /// CPU of the last drain that no sample used yet: a sample drained a little late
    /// (written just before one drain, drained at the next) still finds its budget.
    carry: u64,
}

/// What one drain found, beyond the samples.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Drain {
    /// Threads that block `SIGPROF`, with the CPU (nanoseconds) they used unsampled.
    pub(crate) blocked: Vec<(u32, u64)>,
    /// Nanoseconds of process CPU that no timed thread's clock and no sample accounts
    /// for (negative: the clocks were read a little apart).
    pub(crate) unattributed: i64,
    /// Timed threads whose CPU advanced: they may have changed since (a seccomp filter).
    pub(crate) ran: Vec<u32>,
    /// Timed threads that used at least [`SILENT_PERIODS`] periods of CPU without a single
    /// sample and do not block `SIGPROF`: their timer measures another thread (the id was
    /// used again), and is made anew.
    pub(crate) silent: Vec<u32>,
}

/// CPU, in periods, a thread may use without a sample before its timer is suspected.
pub(crate) const SILENT_PERIODS: u64 = 5;

pub(crate) struct Accounting {
    /// The sampling period, nanoseconds.
    period: u64,
    threads: HashMap<u32, Account>,
    process: Duration,
}

impl Accounting {
    /// Starts with the process's CPU now.
    pub(crate) fn new(period: Duration, process: Duration) -> Accounting {
        Accounting {
            period: (period.as_nanos() as u64).max(1),
            threads: HashMap::new(),
            process,
        }
    }

    /// Thread `tid` has a timer from now on, its clock reading `clock`.
    pub(crate) fn track(&mut self, tid: u32, clock: Duration) {
        self.threads.insert(tid, Account { clock, carry: 0 });
    }

    /// One drain: `clocks` are the timed threads' CPU clocks now, `process` the process's
    /// CPU now, `batch` the samples drained. A thread's samples are held to the CPU it
    /// used since the last drain (plus what the one before left unused, and a period of
    /// slack): the one signal a thread that blocked `SIGPROF` gets when it unblocks carries
    /// every period since, most of them from before any window now open. `blocks(tid)` is
    /// asked only of threads whose CPU went largely unsampled.
    pub(crate) fn drain(
        &mut self,
        clocks: &[(u32, Duration)],
        process: Duration,
        batch: &mut HashMap<StackKey, Tally>,
        blocks: &mut dyn FnMut(u32) -> bool,
    ) -> Drain {
        let period = self.period;
        let mut sampled: HashMap<u32, u64> = HashMap::new();
        for (key, tally) in batch.iter() {
            *sampled.entry(key.tid).or_default() += tally.periods;
        }
        let mut drain = Drain::default();
        let mut attributed: u64 = 0;
        let mut alive: HashMap<u32, Account> = HashMap::with_capacity(clocks.len());
        for &(tid, now) in clocks {
            let Some(mut account) = self.threads.get(&tid).copied() else {
                // Timed since the last drain without being tracked: from now on.
                alive.insert(
                    tid,
                    Account {
                        clock: now,
                        carry: 0,
                    },
                );
                continue;
            };
            let delta = now.saturating_sub(account.clock).as_nanos() as u64;
            let available = delta + account.carry;
            let allowed = available / period + 1;
            let mut periods = sampled.remove(&tid).unwrap_or(0);
            if periods > allowed {
                clamp(batch, tid, periods - allowed);
                periods = allowed;
            }
            let used = (periods * period).min(available);
            let unsampled = delta.saturating_sub(used);
            account.carry = available.saturating_sub(used).min(delta);
            if unsampled > 2 * period && blocks(tid) {
                drain.blocked.push((tid, unsampled));
                // Shown under the marker: no later sample of it may count it again.
                account.carry = 0;
            } else if periods == 0 && delta >= SILENT_PERIODS * period {
                drain.silent.push(tid);
            }
            if delta > 0 {
                drain.ran.push(tid);
            }
            attributed += delta;
            account.clock = now;
            alive.insert(tid, account);
        }
        // What timed threads that exited since had used and no sample of theirs had
        // spent yet: CPU their clocks accounted for and no sample stands for.
        let exited_carry: u64 = self
            .threads
            .iter()
            .filter(|(tid, _)| !alive.contains_key(tid))
            .map(|(_, account)| account.carry)
            .sum();
        self.threads = alive;
        let process_delta = process.saturating_sub(self.process).as_nanos() as u64;
        self.process = process;
        // Samples of threads without a timer (the backstop's) or that exited since. A
        // backstop signal carries `1 + overrun` periods of the *process's* CPU: delivered
        // late (the thread it lands on waiting for a core, on a machine busy with other
        // work), its overrun holds CPU that timed threads used and their own timers count.
        // Together they stand for no more than what no timed thread's clock accounts for,
        // the unspent CPU of timed threads gone since, and a period of slack (the clocks
        // are read a little apart).
        let untimed = process_delta.saturating_sub(attributed) + exited_carry;
        let mut untimed_periods: Vec<(u32, u64)> = sampled.into_iter().collect();
        let mut total: u64 = untimed_periods.iter().map(|&(_, periods)| periods).sum();
        let allowed = untimed / period + 1;
        if total > allowed {
            untimed_periods.sort_by_key(|&(tid, periods)| (std::cmp::Reverse(periods), tid));
            for &(tid, _) in &untimed_periods {
                total -= clamp(batch, tid, total - allowed);
                if total <= allowed {
                    break;
                }
            }
        }
        attributed += total * period;
        drain.unattributed = process_delta as i64 - attributed as i64;
        drain
    }
}

/// Takes up to `excess` periods off thread `tid`'s samples in `batch`, from its heaviest
/// stack down, never below one period per sample; returns how many it took.
fn clamp(batch: &mut HashMap<StackKey, Tally>, tid: u32, excess: u64) -> u64 {
    let wanted = excess;
    let mut excess = excess;
    let mut heaviest: Vec<(&StackKey, &mut Tally)> =
        batch.iter_mut().filter(|(key, _)| key.tid == tid).collect();
    heaviest.sort_by_key(|(_, tally)| std::cmp::Reverse(tally.periods - tally.samples));
    for (_, tally) in heaviest {
        let spare = tally.periods - tally.samples;
        let taken = spare.min(excess);
        tally.periods -= taken;
        excess -= taken;
        if excess == 0 {
            break;
        }
    }
    wanted - excess
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_millis(10);
    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn key(tid: u32, frame: u64) -> StackKey {
        StackKey {
            tid,
            labels: Default::default(),
            flags: 0,
            frames: vec![frame].into_boxed_slice(),
        }
    }

    fn tally(samples: u64, periods: u64) -> Tally {
        Tally { samples, periods }
    }

    #[test]
    fn samples_within_the_cpu_their_thread_used_are_kept_as_they_are() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        let mut batch = HashMap::from([(key(7, 1), tally(6, 6)), (key(7, 2), tally(4, 4))]);
        let mut asked = Vec::new();
        let drain = accounting.drain(&[(7, MS(100))], MS(100), &mut batch, &mut |tid| {
            asked.push(tid);
            false
        });
        assert_eq!(batch[&key(7, 1)], tally(6, 6));
        assert_eq!(batch[&key(7, 2)], tally(4, 4));
        assert_eq!(drain.unattributed, 0);
        assert_eq!(drain.ran, [7]);
        assert!(drain.blocked.is_empty() && drain.silent.is_empty());
        assert!(
            asked.is_empty(),
            "its samples cover its CPU: not asked if it blocks"
        );
        // Its samples spent all of it: nothing carried to the next drain, where a signal
        // that stands for more is held to that drain's CPU and a period of slack.
        let mut batch = HashMap::from([(key(7, 1), tally(1, 50))]);
        accounting.drain(&[(7, MS(130))], MS(130), &mut batch, &mut |_| false);
        assert_eq!(batch[&key(7, 1)], tally(1, 4));
    }

    #[test]
    fn late_samples_of_a_thread_that_exited_spend_what_its_clock_left_unspent() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        accounting.track(8, MS(0));
        // Thread 7 used 100 ms and 5 of its samples were drained: 50 ms carried.
        let mut batch = HashMap::from([(key(7, 1), tally(5, 5))]);
        accounting.drain(
            &[(7, MS(100)), (8, MS(0))],
            MS(100),
            &mut batch,
            &mut |_| false,
        );
        // It exited; its last signal (5 periods: its timer's overrun), written just before
        // that drain, comes now: the CPU its clock counted and no sample spent yet is
        // its. Thread 8, alive, has none to give.
        let mut batch = HashMap::from([(key(7, 2), tally(1, 5))]);
        accounting.drain(&[(8, MS(0))], MS(100), &mut batch, &mut |_| false);
        assert_eq!(batch[&key(7, 2)], tally(1, 5));
    }

    #[test]
    fn a_clamp_takes_first_from_the_stack_with_the_most_periods_beyond_its_samples() {
        // Not the stack with the most samples, nor the most periods per sample.
        for (a, b, after) in [
            (tally(20, 22), tally(1, 5), (tally(20, 22), tally(1, 4))),
            (tally(2, 10), tally(1, 6), (tally(2, 9), tally(1, 6))),
        ] {
            let mut batch = HashMap::from([(key(7, 1), a), (key(7, 2), b), (key(8, 1), b)]);
            assert_eq!(clamp(&mut batch, 7, 1), 1);
            assert_eq!((batch[&key(7, 1)], batch[&key(7, 2)]), after);
            assert_eq!(batch[&key(8, 1)], b, "another thread's stack is untouched");
        }
    }

    #[test]
    fn a_thread_is_asked_whether_it_blocks_only_past_two_unsampled_periods() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        accounting.track(8, MS(0));
        let two_periods = 2 * PERIOD;
        let mut asked = Vec::new();
        accounting.drain(
            &[(7, two_periods), (8, two_periods + Duration::from_nanos(1))],
            MS(40),
            &mut HashMap::new(),
            &mut |tid| {
                asked.push(tid);
                false
            },
        );
        assert_eq!(asked, [8]);
    }

    #[test]
    fn a_thread_is_silent_from_five_unsampled_periods_on() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        accounting.track(8, MS(0));
        let five = SILENT_PERIODS as u32 * PERIOD;
        let drain = accounting.drain(
            &[(7, five - Duration::from_nanos(1)), (8, five)],
            MS(100),
            &mut HashMap::new(),
            &mut |_| false,
        );
        assert_eq!(drain.silent, [8]);
        assert_eq!(drain.ran, [7, 8]);
    }

    #[test]
    fn a_signal_that_stands_for_cpu_from_before_the_drain_is_held_to_what_the_thread_used() {
        // A thread that blocked SIGPROF for 30 s unblocks: its one signal carries 3,000
        // periods, but it used 100 ms since the last drain.
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(29_900));
        let mut batch = HashMap::from([(key(7, 1), tally(1, 3_000)), (key(7, 2), tally(2, 2))]);
        accounting.drain(&[(7, MS(30_000))], MS(30_000), &mut batch, &mut |_| false);
        let total: u64 = batch.values().map(|t| t.periods).sum();
        assert_eq!(total, 11, "100 ms at 10 ms, and one period of slack");
        assert_eq!(batch[&key(7, 2)], tally(2, 2), "the heaviest stack pays");
        assert!(batch[&key(7, 1)].periods >= 1);
    }

    #[test]
    fn a_thread_that_blocks_sigprof_shows_its_cpu_once_under_a_marker() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        let mut asked = Vec::new();
        let mut batch = HashMap::new();
        let drain = accounting.drain(&[(7, MS(100))], MS(100), &mut batch, &mut |tid| {
            asked.push(tid);
            true
        });
        assert_eq!(asked, [7], "asked only because its CPU went unsampled");
        assert_eq!(drain.blocked, [(7, 100_000_000)]);
        assert!(drain.silent.is_empty(), "blocked, not silent");
        // It unblocks: its pending signal stands for everything since it blocked; only
        // what it used since this drain counts, the rest is under the marker already.
        let mut batch = HashMap::from([(key(7, 1), tally(1, 20))]);
        accounting.drain(&[(7, MS(150))], MS(150), &mut batch, &mut |_| false);
        assert_eq!(
            batch[&key(7, 1)].periods,
            6,
            "50 ms and a period of slack, no carry"
        );
    }

    #[test]
    fn a_busy_thread_without_samples_that_does_not_block_is_silent() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        accounting.track(8, MS(0));
        let mut batch = HashMap::from([(key(8, 1), tally(3, 3))]);
        let drain = accounting.drain(&[(7, MS(60)), (8, MS(30))], MS(90), &mut batch, &mut |_| {
            false
        });
        assert_eq!(drain.silent, [7]);
        let mut batch = HashMap::new();
        let idle = accounting.drain(&[(7, MS(61)), (8, MS(30))], MS(91), &mut batch, &mut |_| {
            false
        });
        assert!(
            idle.silent.is_empty(),
            "1 ms without a sample is not suspicious"
        );
        assert_eq!(idle.ran, [7]);
    }

    #[test]
    fn cpu_no_clock_accounts_for_is_unattributed_and_backstop_samples_count() {
        let mut accounting = Accounting::new(PERIOD, MS(1_000));
        accounting.track(7, MS(0));
        // The process used 300 ms: 100 ms on thread 7, 50 ms sampled by the backstop on a
        // thread without a timer (tid 9), 150 ms on threads nobody saw.
        let mut batch = HashMap::from([(key(7, 1), tally(10, 10)), (key(9, 1), tally(5, 5))]);
        let drain = accounting.drain(&[(7, MS(100))], MS(1_300), &mut batch, &mut |_| false);
        assert_eq!(drain.unattributed, 150_000_000);
        // Thread 7 exited: its samples of the next drain still count, its clock is gone.
        let mut batch = HashMap::from([(key(7, 2), tally(2, 2))]);
        let drain = accounting.drain(&[], MS(1_320), &mut batch, &mut |_| false);
        assert_eq!(drain.unattributed, 0);
    }

    #[test]
    fn backstop_samples_stand_for_no_more_than_what_no_timed_thread_used() {
        let mut accounting = Accounting::new(PERIOD, MS(0));
        accounting.track(7, MS(0));
        // 200 ms of process CPU: 150 ms on timed thread 7 (its 15 samples), 50 ms on
        // short-lived threads 8 and 9. Their backstop signals came late, with overruns
        // holding thread 7's CPU too: 12 and 8 periods in 2 samples each, where 5 (and a
        // period of slack) is all that no timed clock accounts for.
        let mut batch = HashMap::from([
            (key(7, 1), tally(15, 15)),
            (key(8, 1), tally(1, 7)),
            (key(8, 2), tally(1, 5)),
            (key(9, 1), tally(2, 8)),
        ]);
        let drain = accounting.drain(&[(7, MS(150))], MS(200), &mut batch, &mut |_| false);
        assert_eq!(
            batch[&key(7, 1)],
            tally(15, 15),
            "the timed thread is untouched"
        );
        let untimed: u64 = [key(8, 1), key(8, 2), key(9, 1)]
            .iter()
            .map(|k| batch[k].periods)
            .sum();
        assert_eq!(untimed, 6, "5 periods of untimed CPU, and one of slack");
        for k in [key(8, 1), key(8, 2), key(9, 1)] {
            assert!(
                batch[&k].periods >= batch[&k].samples,
                "one period per sample at least"
            );
        }
        assert_eq!(drain.unattributed, 50_000_000 - 60_000_000);
        // Where the backstop's periods fit, nothing is taken.
        let mut batch = HashMap::from([(key(7, 2), tally(10, 10)), (key(9, 2), tally(1, 4))]);
        accounting.drain(&[(7, MS(250))], MS(340), &mut batch, &mut |_| false);
        assert_eq!(batch[&key(9, 2)], tally(1, 4));
    }
}
