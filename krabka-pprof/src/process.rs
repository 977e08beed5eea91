//! Facts of this process that the kernel keeps: its threads (listed from
//! `/proc/self/task`, with their names, states, CPU clocks, signal masks and seccomp
//! modes), its CPU time, its command line; and [`PerProcess`], state that belongs to this
//! process and never to its parent. The sampler, the thread dumps and the CPU sessions
//! read them here, so that each fact is read one way.

// The facts of threads are read by the sampler (Linux on x86_64 and aarch64) alone.
#![cfg_attr(not(sampler), allow(dead_code))]

#[cfg(procfs)]
use std::io;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

/// State of this process, never of its parent: a child made by `fork` gets a fresh one
/// the first time it looks, because it inherits the parent's memory as it was, a lock
/// taken by one of the parent's threads included, and that thread does not exist in the
/// child. The parent's copy is left alone (leaked) in the child.
pub(crate) struct PerProcess<T> {
    current: AtomicPtr<(u32, T)>,
    init: fn() -> T,
}

impl<T: Sync> PerProcess<T> {
    pub(crate) const fn new(init: fn() -> T) -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            init,
        }
    }

    /// This process's state.
    pub(crate) fn get(&self) -> &T {
        let pid = std::process::id();
        loop {
            let current = self.current.load(Ordering::Acquire);
            // SAFETY: a published state is never freed (see below).
            if let Some((owner, state)) = unsafe { current.as_ref() }
                && *owner == pid
            {
                return state;
            }
            let fresh = Box::into_raw(Box::new((pid, (self.init)())));
            match self
                .current
                .compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The state replaced, if any, was the parent's: it stays allocated, so a
                // reference the parent's threads held before `fork` can never dangle.
                // SAFETY: just published, and never freed.
                Ok(_) => return unsafe { &(*fresh).1 },
                // Another thread of this process published first; this one was never
                // shared.
                // SAFETY: `fresh` came from `Box::into_raw` above.
                Err(_) => drop(unsafe { Box::from_raw(fresh) }),
            }
        }
    }
}

/// `/cmdline`: the command line, arguments separated by NUL bytes, as Go's.
pub(crate) fn cmdline() -> Vec<u8> {
    let mut line = Vec::new();
    for (i, argument) in std::env::args_os().enumerate() {
        if i > 0 {
            line.push(0);
        }
        line.extend_from_slice(argument.as_encoded_bytes());
    }
    line
}

#[cfg(procfs)]
/// Every thread of this process, by thread id (sorted).
pub(crate) fn list_threads() -> Vec<u32> {
    let mut tids: Vec<u32> = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

/// One thread as `/proc/self/task/<tid>` describes it, read just before it is asked for
/// its stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcThread {
    pub(crate) tid: u32,
    pub(crate) name: String,
    /// The state letter of `stat`: `R`, `S`, `D`, `T`, `t`, `Z`, `X`, `I`.
    pub(crate) state: char,
    /// User and system CPU time so far.
    pub(crate) cpu: Duration,
    /// The kernel function it sleeps in, where the kernel tells.
    pub(crate) wchan: Option<String>,
}

impl ProcThread {
    /// Reads thread `tid` of this process; `None` if it is gone.
    #[cfg(procfs)]
    pub(crate) fn read(tid: u32) -> Option<ProcThread> {
        let dir = format!("/proc/self/task/{tid}");
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        let (state, ticks) = parse_stat(&stat)?;
        let cpu = thread_cpu_time(tid).unwrap_or(ticks);
        let name = std::fs::read_to_string(format!("{dir}/comm"))
            .map(|name| name.trim_end().to_owned())
            .unwrap_or_default();
        let wchan = std::fs::read_to_string(format!("{dir}/wchan"))
            .ok()
            .map(|w| w.trim().to_owned())
            .filter(|w| !w.is_empty() && w != "0");
        Some(ProcThread {
            tid,
            name,
            state,
            cpu,
            wchan,
        })
    }

    /// Thread `tid`'s seccomp mode and number of filters (`Seccomp:`, `Seccomp_filters:`
    /// in its own status: a filter installed by one thread without `TSYNC` shows there,
    /// not in the process's). Mode 0 none, 1 strict, 2 filter; the count is 0 on kernels
    /// before 5.9, which do not show it. `None` if the thread is gone.
    #[cfg(procfs)]
    pub(crate) fn seccomp(tid: u32) -> Option<(u32, u32)> {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|value| value.trim().parse::<u32>().ok())
        };
        Some((field("Seccomp:")?, field("Seccomp_filters:").unwrap_or(0)))
    }

    /// The state as a word.
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state {
            'R' => "running",
            'S' => "sleeping",
            'D' => "disk sleep",
            'T' => "stopped",
            't' => "tracing stop",
            'Z' => "zombie",
            'X' => "dead",
            'I' => "idle",
            _ => "unknown state",
        }
    }
}

#[cfg(procfs)]
/// The state letter and CPU time (`utime + stime`) of a `stat` line. The name (field 2)
/// may hold spaces and `)`, so the fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(char, Duration)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // Fields 14 and 15 of stat, counted from field 3.
    let ticks = ticks(11)?.saturating_add(ticks(12)?);
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&t| t > 0)
        .unwrap_or(100);
    Some((
        state,
        Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / per_second)),
    ))
}

#[cfg(procfs)]
/// A thread's name while it lives.
pub(crate) fn thread_name(tid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .ok()
        .map(|name| name.trim_end().to_owned())
}

#[cfg(procfs)]
/// The kernel's clock id for thread `tid`'s CPU time (what glibc's `pthread_getcpuclockid`
/// computes): `~tid << 3 | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`.
pub(crate) fn thread_cpu_clock(tid: u32) -> libc::clockid_t {
    ((!(tid as libc::clockid_t)) << 3) | 4 | 2
}

#[cfg(procfs)]
/// Thread `tid`'s CPU time so far (to the nanosecond; `/proc`'s `stat` counts ticks).
pub(crate) fn thread_cpu_time(tid: u32) -> io::Result<Duration> {
    clock_time(thread_cpu_clock(tid))
}

#[cfg(procfs)]
pub(crate) fn clock_time(clock: libc::clockid_t) -> io::Result<Duration> {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::new(time.tv_sec as u64, time.tv_nsec as u32))
}

#[cfg(procfs)]
/// CPU time used by this process so far.
pub(crate) fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

#[cfg(procfs)]
/// This thread's kernel id; async-signal-safe (one system call).
pub(crate) fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

#[cfg(procfs)]
/// Whether thread `tid` currently blocks `signal` (`SigBlk` in its status).
pub(crate) fn blocks_signal(tid: u32, signal: libc::c_int) -> bool {
    status_field(tid, "SigBlk:")
        .and_then(|mask| u64::from_str_radix(&mask, 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// One field of thread `tid`'s `status`, trimmed.
#[cfg(procfs)]
fn status_field(tid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .map(|value| value.trim().to_owned())
}

#[cfg(procfs)]
/// `Seccomp:` from `/proc/self/status`: 0 none, 1 strict, 2 filter. Unknown counts as
/// filtered, the careful side.
pub(crate) fn seccomp_mode() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Seccomp:"))
                .and_then(|mode| mode.trim().parse().ok())
        })
        .unwrap_or(2)
}

#[cfg(all(test, procfs))]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let stat = "42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        let (state, cpu) = parse_stat(stat).expect("parses");
        assert_eq!(state, 'S');
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        assert_eq!(
            cpu,
            Duration::from_nanos(300 * (1_000_000_000 / per_second))
        );
        assert_eq!(parse_stat("42 (no fields)"), None);
    }

    #[test]
    fn this_thread_is_listed_with_its_name_and_state() {
        std::thread::Builder::new()
            .name("krabka-listed".to_owned())
            .spawn(|| {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
                assert!(list_threads().contains(&tid));
                let me = ProcThread::read(tid).expect("readable");
                assert_eq!(me.name, "krabka-listed");
                assert_eq!(me.state, 'R', "it is running while it reads itself");
            })
            .expect("spawns")
            .join()
            .expect("passes");
    }

    #[test]
    fn this_threads_clock_id_is_the_kernels() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_self is this thread; the clock id is written to `clock`.
        let found = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
        assert_eq!(found, 0);
        assert_eq!(thread_cpu_clock(tid), clock);
    }

    #[test]
    fn a_thread_that_blocks_sigprof_is_seen_to() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: blocking one signal in this thread's own mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGPROF);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as u32)
                .unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert!(blocks_signal(tid, libc::SIGPROF));
        // SAFETY: gettid has no preconditions.
        let here = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        assert!(!blocks_signal(here, libc::SIGPROF));
        done_tx.send(()).unwrap();
        thread.join().unwrap();
    }
}
