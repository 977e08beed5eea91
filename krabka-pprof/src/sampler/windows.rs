//! The windows open on a session, each with the stacks drained while it was open, the CPU
//! of threads that blocked `SIGPROF` meanwhile and the CPU no clock accounted for; and
//! what a window hands back when it closes ([`Collected`]). A window opened or closed at a
//! drain gets exactly the records drained while it was open.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::accounting::Drain;
use super::buffer::{StackKey, Tally};
use crate::objects::Objects;

/// One open window.
struct Window {
    id: u64,
    stacks: HashMap<StackKey, Tally>,
    /// Per thread that blocks `SIGPROF`: its CPU, nanoseconds, that no sample covered.
    blocked: HashMap<u32, u64>,
    /// Process CPU no thread's clock nor sample accounted for, nanoseconds.
    unattributed: i64,
    /// The name of each thread it has samples or blocked CPU of.
    names: HashMap<u32, Arc<str>>,
}

/// Every window open on one session.
#[derive(Default)]
pub(crate) struct Windows {
    open: Vec<Window>,
}

/// What a window drained while it was open.
pub(crate) struct Drained {
    pub(crate) stacks: HashMap<StackKey, Tally>,
    pub(crate) blocked: Vec<(u32, Duration)>,
    pub(crate) unattributed: Duration,
    pub(crate) names: HashMap<u32, Arc<str>>,
}

impl Windows {
    /// Opens window `id`: it gets what is drained from now on.
    pub(crate) fn open(&mut self, id: u64) {
        self.open.push(Window {
            id,
            stacks: HashMap::new(),
            blocked: HashMap::new(),
            unattributed: 0,
            names: HashMap::new(),
        });
    }

    /// Closes window `id`, with what it drained; `None` if it is not open.
    pub(crate) fn close(&mut self, id: u64) -> Option<Drained> {
        let at = self.open.iter().position(|w| w.id == id)?;
        let window = self.open.swap_remove(at);
        let mut blocked: Vec<(u32, Duration)> = window
            .blocked
            .into_iter()
            .map(|(tid, nanos)| (tid, Duration::from_nanos(nanos)))
            .collect();
        blocked.sort_unstable();
        Some(Drained {
            stacks: window.stacks,
            blocked,
            unattributed: Duration::from_nanos(window.unattributed.max(0) as u64),
            names: window.names,
        })
    }

    /// Hands one drain's samples (`batch`, emptied) and findings to every open window,
    /// with the names of the threads they name (`names` has each).
    pub(crate) fn add(
        &mut self,
        batch: &mut HashMap<StackKey, Tally>,
        drain: &Drain,
        names: &HashMap<u32, Arc<str>>,
    ) {
        let tids: Vec<u32> = {
            let mut tids: Vec<u32> = batch.keys().map(|key| key.tid).collect();
            tids.extend(drain.blocked.iter().map(|&(tid, _)| tid));
            tids.sort_unstable();
            tids.dedup();
            tids
        };
        for window in &mut self.open {
            for &(tid, nanos) in &drain.blocked {
                *window.blocked.entry(tid).or_default() += nanos;
            }
            window.unattributed += drain.unattributed;
            for &tid in &tids {
                if let Some(name) = names.get(&tid) {
                    window.names.entry(tid).or_insert_with(|| name.clone());
                }
            }
        }
        let Some((last, rest)) = self.open.split_last_mut() else {
            batch.clear();
            return;
        };
        for window in rest {
            for (key, tally) in batch.iter() {
                let sum = window.stacks.entry(key.clone()).or_default();
                sum.samples += tally.samples;
                sum.periods += tally.periods;
            }
        }
        for (key, tally) in batch.drain() {
            let sum = last.stacks.entry(key).or_default();
            sum.samples += tally.samples;
            sum.periods += tally.periods;
        }
    }

    /// Whether window `id` is open.
    pub(crate) fn is_open(&self, id: u64) -> bool {
        self.open.iter().any(|w| w.id == id)
    }

    /// What window `id` has drained so far, if it is open.
    #[cfg(test)]
    pub(crate) fn stacks(&self, id: u64) -> Option<&HashMap<StackKey, Tally>> {
        self.open.iter().find(|w| w.id == id).map(|w| &w.stacks)
    }

    /// The code addresses window `id` has drained so far (sorted, unique), as its profile
    /// will name them: each stack's leaf as sampled, its return addresses minus one.
    pub(crate) fn addresses(&self, id: u64) -> Vec<u64> {
        let Some(window) = self.open.iter().find(|w| w.id == id) else {
            return Vec::new();
        };
        let mut addresses: Vec<u64> = window.stacks.keys().flat_map(addresses_of).collect();
        addresses.sort_unstable();
        addresses.dedup();
        addresses
    }
}

/// The code addresses of a stack as its profile will name them: its leaf as sampled, its
/// return addresses minus one.
pub(crate) fn addresses_of(key: &StackKey) -> impl Iterator<Item = u64> + '_ {
    key.frames
        .iter()
        .enumerate()
        .map(|(i, &address)| if i == 0 { address } else { address - 1 })
}

/// What one window of a session collected.
pub(crate) struct Collected {
    pub(crate) stacks: HashMap<StackKey, Tally>,
    /// The name of each thread the stacks and `blocked` name.
    pub(crate) names: HashMap<u32, Arc<str>>,
    /// Samples dropped because the buffer was full.
    pub(crate) lost: Tally,
    /// Threads that blocked `SIGPROF`, with the CPU no sample covered.
    pub(crate) blocked: Vec<(u32, Duration)>,
    /// Process CPU no thread's clock accounted for (threads that lived and died between
    /// two drains, on a kernel that gives the backstop's signals to other threads).
    pub(crate) unattributed: Duration,
    pub(crate) started: SystemTime,
    pub(crate) duration: Duration,
    /// CPU time the whole process used during the window (user + system).
    pub(crate) cpu_time: Duration,
    pub(crate) frequency: u32,
    pub(crate) objects: Objects,
    pub(crate) report: Report,
}

/// How the session went, for the response's log line and the profile's comments.
#[derive(Clone, Debug, Default)]
pub(crate) struct Report {
    /// The stack reader, and why it was chosen.
    pub(crate) reader: &'static str,
    pub(crate) reader_why: String,
    /// The reader is the one chosen first, for the usual reason: not news for a log.
    pub(crate) reader_usual: bool,
    /// `SIGPROF`s that were not this crate's (another sender, a late timer).
    pub(crate) foreign_signals: u64,
    /// Our handler was replaced by someone else's during the window; counting stopped.
    pub(crate) handler_replaced: bool,
    /// Threads that had a timer of their own.
    pub(crate) threads_timed: usize,
    /// Why some threads had none.
    pub(crate) timer_shortfall: Option<String>,
    /// Handler time per sample over the window: median and 99th percentile, nanoseconds.
    pub(crate) handler_nanos: (u64, u64),
    /// Mean frames per unwound sample.
    pub(crate) mean_depth: f64,
    /// Unwound samples: read without a system call, and unwound to the outermost frame.
    pub(crate) unwound: u64,
    pub(crate) direct: u64,
    pub(crate) complete: u64,
    /// Times the unwinder was built anew because libraries were loaded or unloaded.
    pub(crate) unwinder_rebuilds: u64,
    /// Samples carry the labels active on their thread (`labels.rs`): false where this
    /// crate is not in the main executable.
    pub(crate) labels: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tid: u32) -> StackKey {
        StackKey {
            tid,
            flags: 0,
            labels: Default::default(),
            frames: vec![0x1000 + u64::from(tid), 0x2001 + 0x10 * u64::from(tid)]
                .into_boxed_slice(),
        }
    }

    #[test]
    fn each_window_gets_what_was_drained_while_it_was_open() {
        let mut windows = Windows::default();
        let one = Tally {
            samples: 1,
            periods: 2,
        };
        let names: HashMap<u32, Arc<str>> =
            [(1, "one".into()), (2, "two".into()), (5, "blocker".into())].into();
        // Drained while no window is open: counts for none.
        windows.add(
            &mut HashMap::from([(key(1), one)]),
            &Drain::default(),
            &names,
        );
        windows.open(1);
        windows.add(
            &mut HashMap::from([(key(1), one)]),
            &Drain {
                blocked: vec![(5, 30)],
                unattributed: 40,
                ..Drain::default()
            },
            &names,
        );
        windows.open(2);
        let mut later = HashMap::from([(key(2), one)]);
        windows.add(
            &mut later,
            &Drain {
                blocked: vec![(5, 7)],
                unattributed: -10,
                ..Drain::default()
            },
            &names,
        );
        assert!(later.is_empty(), "the batch is handed over");
        assert_eq!(
            windows.addresses(2),
            [0x1002, 0x2020],
            "the leaf as sampled, a return address minus one"
        );
        assert_eq!(windows.addresses(1), [0x1001, 0x1002, 0x2010, 0x2020]);
        assert!(windows.addresses(3).is_empty(), "not open");
        let first = windows.close(1).expect("open");
        assert_eq!(first.stacks, HashMap::from([(key(1), one), (key(2), one)]));
        assert_eq!(first.blocked, [(5, Duration::from_nanos(37))]);
        assert_eq!(first.unattributed, Duration::from_nanos(30));
        let mut named: Vec<(u32, &str)> = first.names.iter().map(|(&t, n)| (t, &**n)).collect();
        named.sort_unstable();
        assert_eq!(named, [(1, "one"), (2, "two"), (5, "blocker")]);
        let second = windows.close(2).expect("open");
        assert_eq!(second.stacks, HashMap::from([(key(2), one)]));
        assert_eq!(second.blocked, [(5, Duration::from_nanos(7))]);
        assert_eq!(second.unattributed, Duration::ZERO, "never negative");
        assert!(
            !second.names.contains_key(&1),
            "thread 1 had no sample in window 2"
        );
        assert!(windows.close(2).is_none());
    }
}
