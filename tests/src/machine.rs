//! What this machine can show, measured rather than assumed: the kernel's tick
//! (`CONFIG_HZ`, the most often a thread's CPU-time timer can fire), the cores this
//! process may run on, and the frequencies the truth tests choose from them. A test that
//! the machine cannot make meaningful says so with [`skip`] and returns.

use std::sync::OnceLock;
use std::time::Duration;

use crate::thread_cpu_time;

/// The probe's timer period: shorter than any tick, so that the tick, not the timer, sets
/// how often it fires.
const PROBE_PERIOD: Duration = Duration::from_micros(100);

/// The probe's own CPU time: 100 ticks on a 250 Hz kernel, 40 on a 100 Hz one.
const PROBE_CPU: Duration = Duration::from_millis(400);

/// The kernel's tick, and how often a thread's CPU-time timer fired on it.
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    /// `CONFIG_HZ`: the resolution of `CLOCK_MONOTONIC_COARSE`, which the kernel reports
    /// as one tick.
    pub config_hz: u32,
    /// What caps a thread's timer: `config_hz`, unless the probe's timer fired far more
    /// often than that (a kernel whose CPU timers no longer wait for the tick).
    pub hz: u32,
    /// The probe: signals per second of its thread's CPU time, from a timer every
    /// 100 µs of it (one core, so that no other core's tick checks it out of phase).
    pub fired: f64,
    /// Signals delivered, and periods the kernel folded into them (overruns).
    pub signals: u64,
    pub overruns: u64,
    pub cpu: Duration,
}

/// How often a thread's CPU-time timer can fire, in Hz: the kernel's tick (`CONFIG_HZ`),
/// which caps the sampler's per-thread timers. Read and measured once per process (about
/// 0.4 s of one core): the tick from `clock_getres(CLOCK_MONOTONIC_COARSE)`, then
/// checked by a thread that arms a `CLOCK_THREAD_CPUTIME_ID` timer every 100 µs of its
/// own CPU time and counts its signals, as the sampler's timers are armed. Panics with
/// the figures if the timer did not account for the CPU the thread used: then nothing
/// about the cap can be said. A probe that fired much less often than once per tick
/// shared its core with other work (it is checked only at ticks that find it running):
/// said, not failed.
pub fn kernel_tick_hz() -> u32 {
    kernel_tick().hz
}

/// [`kernel_tick_hz`] with the figures it came from.
pub fn kernel_tick() -> Tick {
    static TICK: OnceLock<Tick> = OnceLock::new();
    *TICK.get_or_init(|| {
        let config_hz = coarse_clock_hz();
        let (signals, overruns, cpu) = std::thread::Builder::new()
            .name("tick-probe".into())
            .spawn(probe_thread_timer)
            .expect("spawn the tick probe")
            .join()
            .expect("the tick probe");
        let fired = signals as f64 / cpu.as_secs_f64();
        let tick = Tick {
            config_hz,
            // A timer that fires more than twice per tick is not held to the tick.
            hz: if fired > 2.0 * f64::from(config_hz) {
                fired.round() as u32
            } else {
                config_hz
            },
            fired,
            signals,
            overruns,
            cpu,
        };
        eprintln!(
            "kernel tick: {config_hz} Hz (CLOCK_MONOTONIC_COARSE); a thread's 10 kHz CPU \
             timer fired {fired:.0} times per CPU second ({signals} signals, {overruns} \
             overruns in {cpu:?}): capped at {} Hz",
            tick.hz
        );
        if fired < 0.6 * f64::from(config_hz) {
            // A thread's timer is checked only at ticks that find it running: sharing
            // its core with other work, the probe was passed over by most. The tick
            // still caps every timer; the tests that need whole cores say so themselves.
            eprintln!(
                "the tick probe shared its core (fired {fired:.0} times per CPU second, \
                 under the {config_hz} Hz tick): the machine is busy"
            );
        }
        tick
    })
}

/// `CONFIG_HZ`, as the resolution of the tick-driven clock.
fn coarse_clock_hz() -> u32 {
    // SAFETY: clock_getres writes into the zeroed timespec we pass.
    let res = unsafe {
        let mut res: libc::timespec = std::mem::zeroed();
        assert_eq!(
            libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res),
            0
        );
        res
    };
    let nanos = res.tv_sec as u64 * 1_000_000_000 + res.tv_nsec as u64;
    assert!(
        (1_000_000..=100_000_000).contains(&nanos),
        "CLOCK_MONOTONIC_COARSE's resolution is {nanos} ns: not a tick of 10 to 1000 Hz"
    );
    (1e9 / nanos as f64).round() as u32
}

/// The cores this process may run on: the fewer of `available_parallelism` (which also
/// reads cgroup CPU quotas) and the `sched_getaffinity` mask.
pub fn cores() -> usize {
    let parallelism = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    // SAFETY: an all-zero cpu_set_t is an empty set; sched_getaffinity fills it.
    let affinity = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            usize::try_from(libc::CPU_COUNT(&set)).unwrap_or(1)
        } else {
            parallelism
        }
    };
    parallelism.min(affinity).max(1)
}

/// A frequency just under the tick, as high as the routes take (1000 Hz): a thread's
/// timer at it is not capped, and two busy threads at it need more signals per second
/// than one tick-limited process-wide timer can deliver.
pub fn just_under_the_tick(tick: u32) -> u32 {
    (tick - tick / 25).min(1000)
}

/// Whether burner threads that each had a core for `share` of a window (see
/// `CpuTimeline::least_core_share`) could be sampled once per period. A thread's CPU
/// timer is checked only at ticks that find the thread running, so where other work
/// shares its core (a machine busy with another job) some of its periods arrive folded
/// into one signal: the sample *count* falls short of frequency × CPU time, while
/// `cpu/nanoseconds` still adds up. Where this is false, a test prints why (with
/// [`skip`]) and checks what still holds.
pub fn quiet_cores(share: f64) -> bool {
    share >= 0.95
}

/// Checks a profile's sample count for threads that used `cpu` at `frequency`: not above
/// frequency × CPU time by more than `tolerance` (a foreign or doubled signal would be),
/// and not below it by more, unless the threads did not have quiet cores (`share`, see
/// [`quiet_cores`]): on a machine busy with other work the kernel folds periods into
/// fewer signals, and a count short for that reason is reported, not failed. `what`
/// names the threads in the messages.
pub fn assert_sample_count(
    what: &str,
    samples: f64,
    cpu: Duration,
    frequency: u32,
    share: f64,
    tolerance: f64,
) {
    let expected = cpu.as_secs_f64() * f64::from(frequency);
    assert!(
        samples <= expected * (1.0 + tolerance),
        "{what}: {samples} samples for {cpu:?} of CPU at {frequency} Hz, more than \
         {expected:.0} + {:.0}%",
        tolerance * 100.0
    );
    if samples >= expected * (1.0 - tolerance) {
        return;
    }
    assert!(
        !quiet_cores(share),
        "{what}: {samples} samples for {cpu:?} of CPU at {frequency} Hz, fewer than \
         {expected:.0} - {:.0}%, with each thread on its core for {:.0}% of the window",
        tolerance * 100.0,
        share * 100.0
    );
    skip(
        &format!("{what}: the lower bound of the sample count"),
        &format!(
            "{samples} samples where {expected:.0} periods passed, but a thread had its core \
             for only {:.0}% of the window (the machine is busy with other work): the kernel \
             folds such a thread's periods into fewer signals",
            share * 100.0
        ),
    );
}

/// Checks the `cpu/nanoseconds` of threads that used `cpu`, sampled at `frequency`:
/// within `tolerance` of `cpu` for krabka-pprof's own sampler, which counts the periods
/// the kernel folded into each signal (its overruns), so folded signals lose no
/// nanoseconds. The `pprof` crate's sampler weighs each signal as one period: its
/// nanoseconds are its count's, fold with it where a busy machine folds the signals, and
/// are judged as [`assert_sample_count`] judges a count (`share` as there).
pub fn assert_cpu_nanos(
    what: &str,
    nanos: f64,
    cpu: Duration,
    frequency: u32,
    share: f64,
    tolerance: f64,
) {
    if crate::pprof_rs_sampler() {
        assert_sample_count(
            &format!("{what}: cpu/nanoseconds, in periods"),
            nanos / (1e9 / f64::from(frequency)),
            cpu,
            frequency,
            share,
            tolerance,
        );
        return;
    }
    let truth = cpu.as_nanos() as f64;
    assert!(
        (nanos - truth).abs() <= truth * tolerance,
        "{what}: cpu/nanoseconds {nanos} for {cpu:?} of CPU, not within {:.0}%",
        tolerance * 100.0
    );
}

/// Prints why a test cannot show (all or part of) what it guards on this machine, past
/// the test harness's capture of `eprintln!`, so that every run shows it.
pub fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Burns [`PROBE_CPU`] of this thread's CPU under a timer of [`PROBE_PERIOD`]: signals
/// taken, overruns, the CPU it took.
fn probe_thread_timer() -> (u64, u64, Duration) {
    // On one core: each core has a tick of its own, out of phase with the others', so a
    // thread that moves between cores can be checked more often than once per tick.
    // SAFETY: an all-zero cpu_set_t is an empty set; this thread's mask is narrowed to
    // one core it may already run on.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        let first = (0..libc::CPU_SETSIZE as usize)
            .find(|&cpu| libc::CPU_ISSET(cpu, &set))
            .expect("a core to run on");
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(first, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
    let signal = libc::SIGRTMIN() + 5;
    // SAFETY: an all-zero sigset_t is valid; the signal is blocked in this thread only,
    // so its timer's signals stay queued for sigtimedwait below.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
            0
        );
        set
    };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::c_int;
    // SAFETY: sigevent is plain data; every field the kernel reads is set below.
    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
    event.sigev_notify = libc::SIGEV_THREAD_ID;
    event.sigev_signo = signal;
    event.sigev_notify_thread_id = tid;
    let mut timer: libc::c_int = 0;
    // SAFETY: the raw call (the kernel's timer id, not glibc's timer_t): the kernel reads
    // `event` and writes the id into `timer`.
    let created = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            libc::CLOCK_THREAD_CPUTIME_ID,
            &raw mut event,
            &raw mut timer,
        )
    };
    assert_eq!(
        created,
        0,
        "timer_create: {}",
        std::io::Error::last_os_error()
    );
    let period = libc::timespec {
        tv_sec: 0,
        tv_nsec: PROBE_PERIOD.as_nanos() as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: period,
        it_value: period,
    };
    // SAFETY: the timer was created above; the spec is fully initialised.
    let armed = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            timer,
            0,
            &raw const spec,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    assert_eq!(
        armed,
        0,
        "timer_settime: {}",
        std::io::Error::last_os_error()
    );
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Dequeues every signal waiting now; counts them and the overruns they carry.
    let take = |signals: &mut u64, overruns: &mut u64| loop {
        // SAFETY: a zero timeout makes sigtimedwait return at once; `info` is ours.
        let taken = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigtimedwait(&set, &mut info, &zero)
        };
        if taken != signal {
            return;
        }
        *signals += 1;
        // SAFETY: the timer id is ours; the call reads nothing of this process's memory.
        let overrun = unsafe { libc::syscall(libc::SYS_timer_getoverrun, timer) };
        *overruns += u64::try_from(overrun).unwrap_or(0);
    };
    let (mut signals, mut overruns) = (0, 0);
    let started = thread_cpu_time();
    // Polled every few microseconds of CPU, far less than a tick: each signal is taken
    // before the next tick could send another.
    while thread_cpu_time() - started < PROBE_CPU {
        let mut x = std::hint::black_box(1u64);
        for i in 0..2_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
        }
        std::hint::black_box(x);
        take(&mut signals, &mut overruns);
    }
    let cpu = thread_cpu_time() - started;
    // SAFETY: deleting the timer created above, once; then nothing more can be queued.
    unsafe { libc::syscall(libc::SYS_timer_delete, timer) };
    take(&mut signals, &mut overruns);
    let periods = (signals + overruns) as f64;
    let expected = cpu.as_secs_f64() / PROBE_PERIOD.as_secs_f64();
    // Not above it (a doubled signal), and most of it: the CPU since the last tick that
    // found the probe running is in no signal yet, a few ticks' worth on a busy core.
    assert!(
        (expected * 0.5..=expected * 1.2).contains(&periods),
        "the tick probe's timer accounted for {periods} periods of {PROBE_PERIOD:?} in \
         {cpu:?} of its thread's CPU ({signals} signals, {overruns} overruns): nothing can \
         be said of the kernel's tick"
    );
    (signals, overruns, cpu)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    /// `CONFIG_HZ` from the kernel's own config, where this machine has it.
    fn configured_hz() -> Option<u32> {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
        let text = std::fs::read_to_string(format!("/boot/config-{}", release.trim()))
            .ok()
            .or_else(|| {
                let gz = std::fs::read("/proc/config.gz").ok()?;
                let mut text = String::new();
                flate2::read::GzDecoder::new(gz.as_slice())
                    .read_to_string(&mut text)
                    .ok()?;
                Some(text)
            })?;
        text.lines()
            .find_map(|line| line.strip_prefix("CONFIG_HZ="))
            .and_then(|hz| hz.trim().parse().ok())
    }

    #[test]
    fn the_measured_tick_is_the_kernels_config_hz() {
        let tick = super::kernel_tick();
        assert!(
            [100, 250, 300, 1000].contains(&tick.config_hz),
            "{tick:?}: not a CONFIG_HZ value of kernel/Kconfig.hz"
        );
        assert_eq!(
            tick.hz, tick.config_hz,
            "{tick:?}: this kernel's CPU timers are not held to its tick"
        );
        match configured_hz() {
            Some(hz) => assert_eq!(tick.hz, hz, "{tick:?}; the kernel's config says {hz}"),
            None => super::skip(
                "the_measured_tick_is_the_kernels_config_hz (the cross-check)",
                "neither /boot/config-$(uname -r) nor /proc/config.gz is here to compare with",
            ),
        }
    }
}
