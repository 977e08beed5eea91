//! The sampler's own tests: sessions, windows, the handler's use of the stack.

use super::drain::{THREAD_WORK_AT_MOST_EVERY, thread_work_every};
use super::following::has_own_filter;
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
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
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
    // Closing the window does the threads' work (a drain in between may only fold).
    let collected = sampler.close_window(window);
    let named: Vec<u32> = sampler.state().names.keys().copied().collect();
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

#[test]
fn the_threads_work_keeps_to_its_share_of_a_core_between_every_drain_and_two_seconds() {
    // Cheap (a service of tens of threads): at every drain.
    assert_eq!(thread_work_every(Duration::from_micros(20)), DRAIN_EVERY);
    // 1,000 threads' worth on this project's machines: 0.1 % of a core.
    assert_eq!(
        thread_work_every(Duration::from_millis(1)),
        Duration::from_secs(1)
    );
    let every = thread_work_every(Duration::from_micros(700));
    assert!(
        Duration::from_micros(700).as_secs_f64() / every.as_secs_f64() <= 0.001 + 1e-9,
        "{every:?}"
    );
    // Never longer than two seconds, however many threads.
    assert_eq!(
        thread_work_every(Duration::from_millis(50)),
        THREAD_WORK_AT_MOST_EVERY
    );
}
