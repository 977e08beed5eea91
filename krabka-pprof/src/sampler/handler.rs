//! The CPU sample's signal handler: [`on_sigprof`], installed for `SIGPROF`, and what it
//! reads. It hands each signal to the running [`Session`], which keeps only its own
//! timers' signals, weighs the sample, takes a scratch slot, unwinds and writes the record
//! (steps 1 and 3 to 11 of the contract in `sampler.rs`). A thread dump's signal has a
//! handler of its own, in `dump.rs`.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::buffer::{FLAG_FILTERED, FLAG_NO_SCRATCH, Records};
use super::published::Published;
use super::scratch::{Scratch, Slot};
use super::signals::{CPU_SIGNAL, Running, is_installed};
use super::thread_table::{Thread, Threads};
use super::timers::{SignalInfo, Source, source};
use super::unwind::{Unwinding, Unwound, registers};
use crate::labels;
use crate::process::current_tid;

/// The running CPU session, if any: the handler's only way to it.
pub(crate) static SESSION: AtomicPtr<Session> = AtomicPtr::new(std::ptr::null_mut());
/// CPU sample handlers running now: a session is freed only once this is zero after its
/// pointer was cleared.
pub(crate) static CPU_HANDLERS: Running = Running::new();

/// Everything the handler reads of a CPU session. Immutable after start, apart from
/// atomics, slots, and what the drain publishes anew.
pub(crate) struct Session {
    /// Matched against each backstop signal's value: only this session's count.
    pub(crate) id: u32,
    /// The unwind tables, blocklist and stack reader; published anew when libraries come
    /// and go.
    pub(crate) unwinding: Published<Unwinding>,
    pub(crate) slots: Box<[Slot]>,
    pub(crate) records: Records,
    pub(crate) foreign: AtomicU64,
    /// Per thread: whether it has a timer of its own (the backstop's signals on it are
    /// dropped), whether a seccomp filter of its own forbids reading its stack with a
    /// system call, and its own stack, learned off the signal path (read without system
    /// calls); published anew when the drain rebuilds it.
    pub(crate) threads: Published<Threads>,
    pub(crate) costs: Costs,
    /// The thread's label word may be read here: this crate's code is in the main
    /// executable, whose thread-locals are reached without a call (`labels/current.rs`).
    pub(crate) labels: bool,
}

/// Handler time per sample: 100 ns buckets up to 20 µs (where the handler's cost lives on
/// an ordinary stack), then 5 µs buckets up to 1 ms (where it goes with stacks read through
/// a system call per frame, or a handler waiting for a scratch slot), the last bucket:
/// longer.
pub(crate) struct Costs {
    buckets: [AtomicU32; Costs::BUCKETS],
    pub(crate) frames: AtomicU64,
    pub(crate) unwound: AtomicU64,
    /// Unwound samples that needed no system call to read the stack.
    pub(crate) direct: AtomicU64,
    /// Unwound samples that reached the stack's outermost frame.
    pub(crate) complete: AtomicU64,
}

impl Costs {
    /// The fine buckets' width, and how many there are.
    const FINE: u64 = 100;
    const FINE_BUCKETS: usize = 200;
    /// The coarse buckets' width, and how many there are after the fine ones.
    const COARSE: u64 = 5_000;
    const COARSE_BUCKETS: usize = 196;
    const BUCKETS: usize = Costs::FINE_BUCKETS + Costs::COARSE_BUCKETS + 1;
    /// Where the fine buckets end and the coarse begin.
    const FINE_END: u64 = Costs::FINE * Costs::FINE_BUCKETS as u64;
    /// Where the coarse buckets end; the last bucket holds everything longer.
    const END: u64 = Costs::FINE_END + Costs::COARSE * Costs::COARSE_BUCKETS as u64;

    pub(crate) fn new() -> Costs {
        Costs {
            buckets: [const { AtomicU32::new(0) }; Costs::BUCKETS],
            frames: AtomicU64::new(0),
            unwound: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            complete: AtomicU64::new(0),
        }
    }

    /// The bucket a handler time of `nanos` is counted in.
    const fn bucket(nanos: u64) -> usize {
        if nanos < Costs::FINE_END {
            (nanos / Costs::FINE) as usize
        } else if nanos < Costs::END {
            Costs::FINE_BUCKETS + ((nanos - Costs::FINE_END) / Costs::COARSE) as usize
        } else {
            Costs::BUCKETS - 1
        }
    }

    /// The upper edge of `bucket` (for the last, the end of the coarse ones: "longer").
    const fn upper_edge(bucket: usize) -> u64 {
        if bucket < Costs::FINE_BUCKETS {
            (bucket as u64 + 1) * Costs::FINE
        } else if bucket < Costs::BUCKETS - 1 {
            Costs::FINE_END + (bucket - Costs::FINE_BUCKETS + 1) as u64 * Costs::COARSE
        } else {
            Costs::END
        }
    }

    fn record(&self, nanos: u64) {
        self.buckets[Costs::bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts per bucket now.
    pub(crate) fn histogram(&self) -> Vec<u32> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    /// The upper edge of the bucket holding the `quantile`th sample.
    #[cfg(test)]
    pub(crate) fn quantile(&self, quantile: f64) -> u64 {
        Costs::quantile_of(&self.histogram(), quantile)
    }

    /// The upper edge of the bucket holding the `quantile`th sample of `histogram` (from
    /// [`histogram`](Self::histogram), or the difference of two).
    pub(crate) fn quantile_of(histogram: &[u32], quantile: f64) -> u64 {
        let counts: Vec<u64> = histogram.iter().map(|&b| u64::from(b)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * quantile).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Costs::upper_edge(bucket);
            }
        }
        Costs::END
    }
}

impl Session {
    /// One `SIGPROF`. Runs in the signal handler: see the module docs.
    ///
    /// # Safety
    /// `info` and `context` must be what the kernel passed to a `SA_SIGINFO` handler.
    unsafe fn on_signal(&self, info: *const libc::siginfo_t, context: *mut libc::c_void) {
        let entered = monotonic_nanos();
        if info.is_null() {
            return;
        }
        // SAFETY: the kernel's siginfo is valid for the handler's duration, and at least
        // as large as the timer layout (checked above).
        let info = unsafe { &*info.cast::<SignalInfo>() };
        let source = if info.code == libc::SI_TIMER {
            source(info.value, self.id)
        } else {
            None
        };
        // SAFETY: this handler is counted in CPU_HANDLERS, which the drain waits on before
        // it frees a replaced table.
        let threads = unsafe { self.threads.get() };
        // A thread's own timer names it: no system call needed to learn which it is.
        let (tid, periods) = match source {
            Some(Source::Thread(tid)) => (tid, 1 + info.overrun.max(0) as u64),
            Some(Source::Backstop) => (current_tid(), 1),
            None => {
                self.foreign.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let thread = threads.find(tid);
        // A thread with its own timer is sampled by it; the backstop is for the others.
        if source == Some(Source::Backstop) && thread.is_some_and(Thread::is_timed) {
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.sample(tid, thread, periods, context) };
        self.costs.record(monotonic_nanos().saturating_sub(entered));
    }

    /// Records one sample standing for `periods` timer periods.
    ///
    /// # Safety
    /// `context` must be the `ucontext_t` the kernel passed to the handler.
    unsafe fn sample(
        &self,
        tid: u32,
        thread: Option<&Thread>,
        periods: u64,
        context: *mut libc::c_void,
    ) {
        // SAFETY: this handler is counted in CPU_HANDLERS (see `on_signal`).
        let unwinding = unsafe { self.unwinding.get() };
        // SAFETY: forwarded from the caller.
        let Some((pc, regs)) = (unsafe { registers(context, unwinding.code_mask) }) else {
            return;
        };
        // A thread with a seccomp filter of its own is copied through a pipe, with `write`
        // and `read`: its filter may forbid `pread` and `process_vm_readv`. So is a thread
        // the drain has not listed yet (the backstop's) where such threads exist: its own
        // filter cannot have been looked for.
        let filtered = thread.map_or_else(
            || self.slots.first().is_some_and(|slot| slot.pipe.is_open()),
            Thread::is_filtered,
        );
        let flags = if let Some(flags) = unwinding.refusal(pc) {
            flags
        } else if let Some(slot) = self.take_slot(tid) {
            // SAFETY: `take_slot` gave this handler exclusive use of the slot.
            let Scratch {
                cache,
                stack,
                frames,
            } = unsafe { &mut *slot.scratch.get() };
            let sp = regs.sp();
            // SAFETY: pthread_self reads the thread pointer register: no lock, no call
            // into anything that is not async-signal-safe.
            let tcb = unsafe { libc::pthread_self() } as u64;
            if let Some(thread) = thread {
                thread.note_tcb(tcb);
            }
            // Plain loads only inside the thread's own stack, learned off the signal path
            // (`thread_table.rs`), and only when the entry is this very thread's (the
            // control block the stack was learned for: an id used again by a thread the
            // drain has not seen yet is not); anywhere else, a system call's copy.
            let own = thread.filter(|thread| thread.tcb() == tcb);
            let direct_high = match own.and_then(Thread::known_stack) {
                Some((low, high)) if low <= sp && sp < high => high,
                _ => 0,
            };
            let Unwound {
                depth,
                mut flags,
                complete,
                copied,
                refused,
            } = unwinding.unwind(
                (pc, regs),
                direct_high,
                filtered.then_some(&slot.pipe),
                cache,
                stack,
                frames,
            );
            // A filter installed since the drain last looked: it looks again.
            if refused && let Some(thread) = thread {
                thread.note_refused();
            }
            if filtered && !complete && !slot.pipe.is_open() {
                flags |= FLAG_FILTERED;
            }
            if copied == 0 {
                self.costs.direct.fetch_add(1, Ordering::Relaxed);
            }
            if complete {
                self.costs.complete.fetch_add(1, Ordering::Relaxed);
            }
            self.costs.frames.fetch_add(depth as u64, Ordering::Relaxed);
            self.costs.unwound.fetch_add(1, Ordering::Relaxed);
            self.records
                .write(tid, flags, self.labels(), periods, &frames[..depth]);
            slot.busy.store(false, Ordering::Release);
            return;
        } else {
            FLAG_NO_SCRATCH
        };
        self.records
            .write(tid, flags, self.labels(), periods, &[pc]);
    }

    /// The sampled thread's label word (the handler runs on the thread its timer names),
    /// or 0 where it may not be read.
    #[inline]
    fn labels(&self) -> u64 {
        if self.labels {
            labels::current::word()
        } else {
            0
        }
    }

    fn take_slot(&self, tid: u32) -> Option<&Slot> {
        let n = self.slots.len();
        (0..n)
            .map(|i| &self.slots[(tid as usize + i) % n])
            .find(|slot| slot.try_take())
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds; async-signal-safe (the vDSO answers it).
pub(crate) fn monotonic_nanos() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

/// The `SIGPROF` handler. See the module docs of `sampler.rs` for what it may and may not
/// do.
pub(crate) extern "C" fn on_sigprof(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: errno is thread-local; reading and restoring it is what makes the handler
    // invisible to the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    CPU_HANDLERS.enter();
    let session = SESSION.load(Ordering::SeqCst);
    if !session.is_null() {
        // SAFETY: a non-null session stays alive until CPU_HANDLERS is seen at zero after
        // it was cleared (see `retire` in sampler.rs); `info` and `context` come from the
        // kernel.
        unsafe { (*session).on_signal(info, context) };
    }
    CPU_HANDLERS.leave();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether our handler is the one installed for `SIGPROF`.
pub(crate) fn is_ours() -> bool {
    is_installed(CPU_SIGNAL, on_sigprof)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_costs_give_median_and_tail() {
        let costs = Costs::new();
        for nanos in (0..98).map(|i| 1_000 + i * 10).chain([9_000, 50_000]) {
            costs.record(nanos);
        }
        assert_eq!(costs.quantile(0.5), 1_500);
        assert_eq!(costs.quantile(0.99), 9_100);
        // 50 µs is past the fine buckets: counted in the coarse one ending at 55 µs.
        assert_eq!(costs.quantile(1.0), 55_000);
        assert_eq!(Costs::new().quantile(0.5), 0);
    }

    #[test]
    fn slow_handlers_are_measured_up_to_a_millisecond() {
        let costs = Costs::new();
        for nanos in [
            19_999, 20_000, 24_999, 25_000, 999_999, 1_000_000, 7_000_000,
        ] {
            costs.record(nanos);
        }
        let histogram = costs.histogram();
        let edges: Vec<u64> = histogram
            .iter()
            .enumerate()
            .flat_map(|(bucket, &n)| std::iter::repeat_n(Costs::upper_edge(bucket), n as usize))
            .collect();
        assert_eq!(
            edges,
            [
                20_000, 25_000, 25_000, 30_000, 1_000_000, 1_000_000, 1_000_000
            ]
        );
        assert_eq!(Costs::END, 1_000_000);
        // The "longer" bucket follows the last coarse one, and is the histogram's last.
        assert_eq!(Costs::bucket(Costs::END), Costs::bucket(Costs::END - 1) + 1);
        assert_eq!(Costs::bucket(Costs::END) + 1, costs.histogram().len());
        // Each bucket's edge is above what it holds, and the edges only grow.
        for nanos in (0..1_100_000).step_by(499) {
            let bucket = Costs::bucket(nanos);
            assert!(nanos < Costs::upper_edge(bucket) || bucket == Costs::BUCKETS - 1);
            assert!(
                bucket == 0 || nanos >= Costs::upper_edge(bucket - 1),
                "{nanos}"
            );
        }
    }
}
