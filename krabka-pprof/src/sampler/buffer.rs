//! The sample records: two buffers the signal handler appends to without a lock (step 10
//! of the contract in `sampler.rs`), and the drain that swaps them and folds their
//! records into counts per stack, off the signal path (`windows.rs` hands them to the
//! windows open). A record is a header
//! word `MAGIC << 56 | flags << 48 | depth << 32 | tid`, a weight word (the timer periods
//! the sample stands for), the thread's label word if it had one ([`FLAG_LABELS`]), then
//! the frames, leaf first. The drain turns label words into the sets they name
//! (`labels/table.rs`), before any of them may be freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::labels::table::SampleLabels;

const MAGIC: u64 = 0xA5;
const RECORD_HEADER: usize = 2;
/// The interrupted PC was in a blocklisted library: not unwound.
pub(crate) const FLAG_BLOCKLISTED: u8 = 1;
/// Every scratch slot was busy on other threads: not unwound.
pub(crate) const FLAG_NO_SCRATCH: u8 = 2;
/// The stack could not be read (no reader works here): not unwound.
pub(crate) const FLAG_NO_STACK_READ: u8 = 4;
/// The stack is deeper than `MAX_DEPTH` (`unwind.rs`): its outermost frames are missing.
pub(crate) const FLAG_TRUNCATED: u8 = 8;
/// The thread has a seccomp filter of its own and no pipe was open yet to copy its stack
/// through: not unwound past what plain loads could read.
pub(crate) const FLAG_FILTERED: u8 = 16;
/// Set off the signal path, never by a handler (`frames.rs`): the stack ends at a frame
/// in code no unwind table covers, whose callers the unwinder could only guess (and those
/// it guessed are cut).
pub(crate) const FLAG_CALLERS_UNKNOWN: u8 = 64;
/// The unwind stopped short of the outermost frame: at a switch of stacks (a coroutine's
/// or `stacker`'s segment, whose caller is on the thread's own stack), or where the next
/// frame is in memory it could not read.
pub(crate) const FLAG_STACK_UNREAD: u8 = 128;
/// A label word follows the weight word (never a marker: dropped from the key's flags).
const FLAG_LABELS: u8 = 32;

/// A stack as recorded: the interrupted PC first, then return addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StackKey {
    pub(crate) tid: u32,
    pub(crate) flags: u8,
    /// The labels active on the thread when it was sampled.
    pub(crate) labels: SampleLabels,
    pub(crate) frames: Box<[u64]>,
}

/// How often a stack was sampled, and how many timer periods those samples stand for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) samples: u64,
    pub(crate) periods: u64,
}

/// One of the two sample buffers. `state` is `writers << 40 | cursor` (cursor in words).
struct Buffer {
    state: AtomicU64,
    words: Box<[AtomicU64]>,
}

const WRITER: u64 = 1 << 40;
const CURSOR_MASK: u64 = WRITER - 1;

impl Buffer {
    /// A zeroed buffer whose pages become resident only as samples are written to them.
    fn new(words: usize) -> Buffer {
        const _: () = assert!(
            size_of::<AtomicU64>() == size_of::<u64>()
                && align_of::<AtomicU64>() == align_of::<u64>()
        );
        // calloc'd: large buffers are fresh zero pages the kernel maps on first write.
        let zeroed: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        // SAFETY: AtomicU64 has the size, alignment and bit validity of u64 (checked above
        // for this target), so the allocation is a valid `[AtomicU64]` of the same length,
        // and the `Box` is freed with the same layout.
        let words = unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [AtomicU64]) };
        Buffer {
            state: AtomicU64::new(0),
            words,
        }
    }
}

/// The two buffers and the samples lost when the active one was full. Handlers only
/// [`write`](Records::write); one drainer at a time [`drain`](Records::drain)s (the
/// caller holds the session's drain lock, which handlers never take).
pub(crate) struct Records {
    buffers: [Buffer; 2],
    active: AtomicUsize,
    lost: AtomicU64,
    lost_periods: AtomicU64,
    /// Per buffer: words already drained since its last reset (the drainer's alone).
    done: [AtomicUsize; 2],
}

impl Records {
    /// Two buffers of `words` words each.
    pub(crate) fn new(words: usize) -> Records {
        Records {
            buffers: [Buffer::new(words), Buffer::new(words)],
            active: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
            lost_periods: AtomicU64::new(0),
            done: [AtomicUsize::new(0), AtomicUsize::new(0)],
        }
    }

    /// Appends one record to the active buffer, with the thread's label word `labels`
    /// (0: none); async-signal-safe.
    pub(crate) fn write(&self, tid: u32, flags: u8, labels: u64, periods: u64, frames: &[u64]) {
        let buffer = &self.buffers[self.active.load(Ordering::Acquire)];
        let extra = usize::from(labels != 0);
        let flags = if labels != 0 {
            flags | FLAG_LABELS
        } else {
            flags
        };
        let len = RECORD_HEADER + extra + frames.len();
        let previous = buffer
            .state
            .fetch_add(WRITER + len as u64, Ordering::AcqRel);
        let at = (previous & CURSOR_MASK) as usize;
        if at + len <= buffer.words.len() {
            let header =
                MAGIC << 56 | u64::from(flags) << 48 | (frames.len() as u64) << 32 | u64::from(tid);
            buffer.words[at].store(header, Ordering::Relaxed);
            buffer.words[at + 1].store(periods, Ordering::Relaxed);
            if labels != 0 {
                buffer.words[at + RECORD_HEADER].store(labels, Ordering::Relaxed);
            }
            for (word, frame) in buffer.words[at + RECORD_HEADER + extra..at + len]
                .iter()
                .zip(frames)
            {
                word.store(*frame, Ordering::Relaxed);
            }
        } else {
            self.lost.fetch_add(1, Ordering::Relaxed);
            self.lost_periods.fetch_add(periods, Ordering::Relaxed);
        }
        buffer.state.fetch_sub(WRITER, Ordering::Release);
    }

    /// Samples lost so far because the active buffer was full.
    pub(crate) fn lost(&self) -> Tally {
        Tally {
            samples: self.lost.load(Ordering::Relaxed),
            periods: self.lost_periods.load(Ordering::Relaxed),
        }
    }

    /// Swaps the buffers and adds everything the handlers wrote before the swap to
    /// `into`, label words resolved by `labels`. For one drainer at a time (see
    /// [`Records`]). Waits at most [`MAX_WRITER_WAIT`] for handlers still writing into the
    /// buffer drained: past it (a handler stopped mid-write: a debugger, `SIGSTOP`), that
    /// buffer's records stay where they are, folded by a later drain of it once its
    /// writers are done, and until then it fills, its new samples counted as lost.
    /// Whether it folded everything.
    pub(crate) fn drain(
        &self,
        into: &mut HashMap<StackKey, Tally>,
        labels: &mut dyn FnMut(u64) -> SampleLabels,
    ) -> bool {
        let old = self.active.load(Ordering::Acquire);
        self.active.store(1 - old, Ordering::Release);
        let buffer = &self.buffers[old];
        let done = &self.done[old];
        let deadline = std::time::Instant::now() + MAX_WRITER_WAIT;
        loop {
            // Wait for handlers that reserved space before the swap to finish writing.
            let state = loop {
                let state = buffer.state.load(Ordering::Acquire);
                if state & !CURSOR_MASK == 0 {
                    break state;
                }
                if std::time::Instant::now() >= deadline {
                    return false;
                }
                std::thread::yield_now();
            };
            let cursor = (state & CURSOR_MASK) as usize;
            fold(buffer, done.load(Ordering::Relaxed), cursor, into, labels);
            done.store(cursor.min(buffer.words.len()), Ordering::Relaxed);
            // Reset, unless a late handler (one that read `active` before the swap) has
            // reserved more space meanwhile; then fold that too.
            if buffer
                .state
                .compare_exchange(state, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                done.store(0, Ordering::Relaxed);
                return true;
            }
        }
    }
}

/// How long a drain waits for handlers still writing into the buffer it drains. A
/// handler writes its record in well under a microsecond; a wait this long is a handler
/// that cannot run (its thread stopped), and the drain, which holds the session's lock,
/// must not wait on it.
const MAX_WRITER_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Folds records `from..to` of `buffer` into `stacks` and zeroes them. Stops at the first
/// empty header: space reserved by a sample that did not fit is never written.
fn fold(
    buffer: &Buffer,
    from: usize,
    to: usize,
    stacks: &mut HashMap<StackKey, Tally>,
    labels: &mut dyn FnMut(u64) -> SampleLabels,
) {
    let words = &buffer.words;
    let end = to.min(words.len());
    let mut at = from;
    while at < end {
        let header = words[at].swap(0, Ordering::Relaxed);
        if header >> 56 != MAGIC {
            break;
        }
        let depth = ((header >> 32) & 0xffff) as usize;
        let flags = (header >> 48) as u8;
        let extra = usize::from(flags & FLAG_LABELS != 0);
        let first = at + RECORD_HEADER + extra;
        let Some(record) = words.get(first..first + depth) else {
            break;
        };
        let periods = words[at + 1].swap(0, Ordering::Relaxed);
        let word = if extra == 1 {
            words[at + RECORD_HEADER].swap(0, Ordering::Relaxed)
        } else {
            0
        };
        let frames: Box<[u64]> = record
            .iter()
            .map(|w| w.swap(0, Ordering::Relaxed))
            .collect();
        let key = StackKey {
            tid: header as u32,
            flags: flags & !FLAG_LABELS,
            labels: if word == 0 {
                SampleLabels::default()
            } else {
                labels(word)
            },
            frames,
        };
        let tally = stacks.entry(key).or_default();
        tally.samples += 1;
        tally.periods += periods;
        at += RECORD_HEADER + extra + depth;
    }
}

/// The buffer words one record of `depth` frames takes, at most (with a label word).
pub(crate) const fn record_words(depth: usize) -> usize {
    RECORD_HEADER + 1 + depth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_records_round_trip_and_overflow_is_counted() {
        let records = Records::new(10);
        let mut first = HashMap::new();
        let none = &mut |_| SampleLabels::default();
        records.write(7, 0, 0, 1, &[1, 2, 3]);
        records.write(7, 0, 0, 3, &[1, 2, 3]);
        records.write(8, FLAG_BLOCKLISTED, 0, 2, &[9, 9, 9]); // does not fit: 5 + 5 + 5 > 10
        records.drain(&mut first, none);
        // The other buffer from here on; then the first one again.
        let mut second = HashMap::new();
        records.write(9, FLAG_TRUNCATED, 0, 1, &[5]);
        records.drain(&mut second, none);
        records.write(9, FLAG_TRUNCATED, 0, 1, &[5]);
        records.drain(&mut second, none);
        let key = |tid, flags, frames: &[u64]| StackKey {
            tid,
            flags,
            labels: SampleLabels::default(),
            frames: frames.into(),
        };
        assert_eq!(
            first,
            HashMap::from([(
                key(7, 0, &[1, 2, 3]),
                Tally {
                    samples: 2,
                    periods: 4
                }
            )])
        );
        assert_eq!(
            second,
            HashMap::from([(
                key(9, FLAG_TRUNCATED, &[5]),
                Tally {
                    samples: 2,
                    periods: 2
                }
            )]),
            "records of both buffers, each drained once"
        );
        assert_eq!(
            records.lost(),
            Tally {
                samples: 1,
                periods: 2
            }
        );
        assert!(
            records
                .buffers
                .iter()
                .all(|b| b.state.load(Ordering::Relaxed) == 0)
        );
        assert!(
            records
                .buffers
                .iter()
                .all(|b| b.words.iter().all(|w| w.load(Ordering::Relaxed) == 0))
        );
    }

    #[test]
    fn record_words_is_the_most_a_record_takes() {
        for depth in [0, 1, 3, 128] {
            let frames: Vec<u64> = (1..=depth as u64).collect();
            let fits = Records::new(record_words(depth));
            fits.write(7, 0, 0x0102_0000_0300, 1, &frames);
            assert_eq!(
                fits.lost().samples,
                0,
                "a labelled record of {depth} frames"
            );
            let short = Records::new(record_words(depth) - 1);
            short.write(7, 0, 0x0102_0000_0300, 1, &frames);
            assert_eq!(short.lost().samples, 1, "one word short, {depth} frames");
        }
    }

    #[test]
    fn a_late_handlers_record_is_folded_only_once_it_is_written_whole() {
        // A handler that read `active` just before the swap reserves space in the buffer
        // being drained, after the drain read its cursor, and is still writing while the
        // drain folds what came before it. The drain must wait for it, then fold it.
        let records = Records::new(64);
        let old = &records.buffers[0];
        records.write(7, 0, 0x0102_0000_0300, 1, &[1, 2]);
        let mut stacks = HashMap::new();
        let mut whole = false;
        std::thread::scope(|scope| {
            let mut late = Some(scope);
            // Called as the drain folds the first record (the labelled one): the late
            // handler reserves its four words, writes its header and weight, and is
            // descheduled before its frames.
            let mut labels = |_| {
                if let Some(scope) = late.take() {
                    let previous = old.state.fetch_add(WRITER + 4, Ordering::AcqRel);
                    let at = (previous & CURSOR_MASK) as usize;
                    old.words[at].store(MAGIC << 56 | 2 << 32 | 8, Ordering::Relaxed);
                    old.words[at + 1].store(1, Ordering::Relaxed);
                    scope.spawn(move || {
                        // The drain cannot be watched mid-fold: this head start makes a
                        // drain that folded past its cursor read the frames before they
                        // are written. A drain that waits is right however long it is
                        // (past its bound, a later drain of this buffer folds the record).
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        old.words[at + 2].store(5, Ordering::Relaxed);
                        old.words[at + 3].store(6, Ordering::Relaxed);
                        old.state.fetch_sub(WRITER, Ordering::Release);
                    });
                }
                SampleLabels::default()
            };
            whole = records.drain(&mut stacks, &mut labels);
        });
        if !whole {
            // The other buffer, then this one again, its writer done.
            let none = &mut |_| SampleLabels::default();
            assert!(records.drain(&mut stacks, none) && records.drain(&mut stacks, none));
        }
        let mut frames: Vec<(u32, Vec<u64>)> = stacks
            .keys()
            .map(|key| (key.tid, key.frames.to_vec()))
            .collect();
        frames.sort_unstable();
        assert_eq!(frames, [(7, vec![1, 2]), (8, vec![5, 6])]);
        assert_eq!(
            old.state.load(Ordering::Relaxed),
            0,
            "reset once both are folded"
        );
        assert!(old.words.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn a_drain_does_not_wait_on_a_handler_stopped_mid_write_and_folds_its_record_later() {
        // A handler that reserved its words and wrote its header, then stopped (its thread
        // stopped by a debugger): the drain returns, and folds nothing it has not seen
        // written whole; once the handler ends, the buffer's next drain folds everything.
        let records = Records::new(64);
        records.write(7, 0, 0, 1, &[1, 2]);
        let old = &records.buffers[0];
        let previous = old.state.fetch_add(WRITER + 4, Ordering::AcqRel);
        let at = (previous & CURSOR_MASK) as usize;
        old.words[at].store(MAGIC << 56 | 2 << 32 | 8, Ordering::Relaxed);
        old.words[at + 1].store(1, Ordering::Relaxed);
        let none = &mut |_| SampleLabels::default();
        let (returned, drained) = std::sync::mpsc::channel();
        let mut stacks = HashMap::new();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let whole = records.drain(&mut stacks, none);
                returned.send(whole).unwrap();
            });
            // The test's own bound, far past the drain's: a drain that waits for the
            // writer does not return within it (the writer is then let go, so that the
            // test fails rather than hangs).
            let whole = drained.recv_timeout(std::time::Duration::from_secs(60));
            if whole.is_err() {
                old.state.fetch_sub(WRITER, Ordering::Release);
            }
            let whole = whole.expect("the drain returned while a handler was stopped mid-write");
            assert!(!whole, "the drain says it left records behind");
        });
        assert!(
            stacks.is_empty(),
            "nothing folded past a writer: {stacks:?}"
        );
        // The other buffer is drained next, then this one, once its writer has finished.
        records.write(9, 0, 0, 1, &[3]);
        assert!(records.drain(&mut stacks, none));
        old.words[at + 2].store(5, Ordering::Relaxed);
        old.words[at + 3].store(6, Ordering::Relaxed);
        old.state.fetch_sub(WRITER, Ordering::Release);
        assert!(records.drain(&mut stacks, none));
        let mut frames: Vec<(u32, Vec<u64>)> = stacks
            .keys()
            .map(|key| (key.tid, key.frames.to_vec()))
            .collect();
        frames.sort_unstable();
        assert_eq!(frames, [(7, vec![1, 2]), (8, vec![5, 6]), (9, vec![3])]);
        assert_eq!(old.state.load(Ordering::Relaxed), 0, "reset once folded");
    }

    #[test]
    fn a_label_word_rides_with_its_record_and_is_resolved_at_the_drain() {
        let records = Records::new(64);
        records.write(7, FLAG_TRUNCATED, 0x0102_0000_0300, 1, &[4, 5]);
        records.write(7, FLAG_TRUNCATED, 0, 1, &[4, 5]);
        let mut seen = Vec::new();
        let mut stacks = HashMap::new();
        records.drain(&mut stacks, &mut |word| {
            seen.push(word);
            SampleLabels::default()
        });
        assert_eq!(seen, [0x0102_0000_0300], "only the labelled record's word");
        let tally = stacks
            .iter()
            .find(|(key, _)| key.frames[..] == [4, 5])
            .map(|(key, tally)| (key.flags, *tally));
        assert_eq!(
            tally,
            Some((
                FLAG_TRUNCATED,
                Tally {
                    samples: 2,
                    periods: 2
                }
            )),
            "the frames after the label word, and the flag dropped from the key"
        );
    }
}
