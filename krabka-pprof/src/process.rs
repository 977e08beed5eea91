//! Facts of this process that the kernel keeps: its threads (listed from
//! `/proc/self/task`, with their names, states, CPU clocks, signal masks, seccomp modes
//! and, for a sleeping one, the registers it entered the kernel with), its CPU time, its
//! command line; and [`PerProcess`], state that belongs to this process and never to its
//! parent. The sampler, the thread dumps and the CPU sessions read them here, so that
//! each fact is read one way.

// The facts of threads are read by the sampler (Linux on x86_64 and aarch64) alone.
#![cfg_attr(not(sampler), allow(dead_code))]

#[cfg(procfs)]
use std::io;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

#[cfg(sampler)]
mod service_cpu;
#[cfg(sampler)]
pub(crate) use service_cpu::ServiceCpu;

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
        // `stat` names the thread as `comm` does (unescaped): one file fewer per thread.
        let name = stat
            .find('(')
            .zip(stat.rfind(')'))
            .and_then(|(open, close)| stat.get(open + 1..close))
            .unwrap_or_default()
            .to_owned();
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

    /// What thread `tid`'s `status` says of its signal mask and seccomp filter, read once
    /// for both; `None` if it is gone.
    #[cfg(procfs)]
    pub(crate) fn status(tid: u32) -> Option<ThreadStatus> {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
        Some(parse_status(&status))
    }

    /// Where thread `tid` is, as its `syscall` file says; `None` if it is gone or the file
    /// cannot be read (a process that is not dumpable, unless the reader is root).
    #[cfg(procfs)]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        allow(dead_code, reason = "sleeping threads are read so on x86_64 alone")
    )]
    pub(crate) fn in_kernel(tid: u32) -> Option<InKernel> {
        // One line of at most 9 fields: "NR" and eight "0x" + 16 hex digits.
        let mut line = [0u8; 256];
        parse_syscall(read_short(
            &format!("/proc/self/task/{tid}/syscall"),
            &mut line,
        )?)
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

/// What a thread's `status` says of its signal mask and seccomp filter.
#[cfg(procfs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ThreadStatus {
    /// `SigBlk`: bit `n - 1` for signal `n`.
    pub(crate) blocked: u64,
    /// `Seccomp` and `Seccomp_filters` (0 before 5.9): see [`ProcThread::seccomp`].
    pub(crate) seccomp: Option<(u32, u32)>,
}

#[cfg(procfs)]
impl ThreadStatus {
    /// Whether the thread blocks `signal`.
    pub(crate) fn blocks(&self, signal: libc::c_int) -> bool {
        self.blocked & (1 << (signal - 1)) != 0
    }
}

#[cfg(procfs)]
fn parse_status(status: &str) -> ThreadStatus {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let number = |name: &str| field(name).and_then(|value| value.parse::<u32>().ok());
    ThreadStatus {
        blocked: field("SigBlk:")
            .and_then(|mask| u64::from_str_radix(mask, 16).ok())
            .unwrap_or(0),
        seccomp: number("Seccomp:").map(|mode| (mode, number("Seccomp_filters:").unwrap_or(0))),
    }
}

/// Where a thread is, as `/proc/self/task/TID/syscall` says (`proc_pid_syscall` in the
/// kernel's `fs/proc/base.c`). The kernel reads it only while the thread is off every CPU
/// (`wait_task_inactive` before and after), so what it shows of a sleeping thread is
/// what that thread's registers were when it entered the kernel. Read on x86_64 alone
/// (`sampler/asleep.rs` says why).
#[cfg(procfs)]
#[cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "sleeping threads are read so on x86_64 alone")
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InKernel {
    /// On a CPU, or ready for one: its registers change as it runs.
    Running,
    /// Asleep (or stopped) in the kernel: in system call `nr`, or with `nr` -1 in the
    /// kernel without one (a page fault); `sp` and `pc` are its user stack pointer and
    /// program counter as they were saved when it entered the kernel (on x86_64 the
    /// address right after the `syscall` instruction).
    Asleep { nr: i64, sp: u64, pc: u64 },
}

/// One line of a `syscall` file: `running`, `NR a0 a1 a2 a3 a4 a5 SP PC` (arguments, SP
/// and PC in hex) or `-1 SP PC`.
#[cfg(procfs)]
#[cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "sleeping threads are read so on x86_64 alone")
)]
fn parse_syscall(line: &str) -> Option<InKernel> {
    let line = line.trim();
    if line == "running" {
        return Some(InKernel::Running);
    }
    let fields: Vec<&str> = line.split_ascii_whitespace().collect();
    let nr: i64 = fields.first()?.parse().ok()?;
    let hex = |at: usize| {
        let field = fields.get(at)?.strip_prefix("0x")?;
        u64::from_str_radix(field, 16).ok()
    };
    let (sp, pc) = match (nr, fields.len()) {
        (-1, 3) => (hex(1)?, hex(2)?),
        (0.., 9) => (hex(7)?, hex(8)?),
        _ => return None,
    };
    Some(InKernel::Asleep { nr, sp, pc })
}

/// Clock ticks (`_SC_CLK_TCK`) since boot, as a thread's start time in its `stat` counts
/// them (`CLOCK_BOOTTIME`).
#[cfg(procfs)]
pub(crate) fn boot_ticks() -> u64 {
    clock_time(libc::CLOCK_BOOTTIME).map_or(0, |time| {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u128;
        (time.as_nanos() * hz / 1_000_000_000) as u64
    })
}

/// When thread `tid` of this process started, in clock ticks since boot (field 22 of its
/// `stat`); `None` if it is gone.
#[cfg(procfs)]
pub(crate) fn thread_start_ticks(tid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22, counted from field 3.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
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

/// A system call's name, for what a thread sleeps in (the number a `syscall` file
/// gives): the waits a service's threads sleep in, by name; any other as
/// `system call N`.
pub(crate) fn syscall_name(nr: i64) -> String {
    if nr == -1 {
        return "no system call (a page fault)".to_owned();
    }
    #[cfg(target_os = "linux")]
    {
        let named: &[(i64, &str)] = &[
            (libc::SYS_futex, "futex"),
            (libc::SYS_ppoll, "ppoll"),
            (libc::SYS_epoll_pwait, "epoll_pwait"),
            (libc::SYS_nanosleep, "nanosleep"),
            (libc::SYS_clock_nanosleep, "clock_nanosleep"),
            (libc::SYS_read, "read"),
            (libc::SYS_write, "write"),
            (libc::SYS_recvfrom, "recvfrom"),
            (libc::SYS_recvmsg, "recvmsg"),
            (libc::SYS_accept4, "accept4"),
            (libc::SYS_connect, "connect"),
            (libc::SYS_pselect6, "pselect6"),
            (libc::SYS_wait4, "wait4"),
            (libc::SYS_rt_sigtimedwait, "rt_sigtimedwait"),
            (libc::SYS_restart_syscall, "restart_syscall"),
            (libc::SYS_pread64, "pread64"),
            (libc::SYS_pwrite64, "pwrite64"),
            (libc::SYS_readv, "readv"),
            (libc::SYS_writev, "writev"),
            (libc::SYS_sendto, "sendto"),
            (libc::SYS_sendmsg, "sendmsg"),
            (libc::SYS_epoll_pwait2, "epoll_pwait2"),
            (libc::SYS_io_uring_enter, "io_uring_enter"),
            (libc::SYS_io_getevents, "io_getevents"),
            (libc::SYS_fsync, "fsync"),
            (libc::SYS_fdatasync, "fdatasync"),
            (libc::SYS_openat, "openat"),
            (libc::SYS_flock, "flock"),
            (libc::SYS_fcntl, "fcntl"),
            (libc::SYS_waitid, "waitid"),
            (libc::SYS_msgrcv, "msgrcv"),
            (libc::SYS_semtimedop, "semtimedop"),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_poll, "poll"),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_epoll_wait, "epoll_wait"),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_select, "select"),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_accept, "accept"),
            #[cfg(target_arch = "x86_64")]
            (libc::SYS_pause, "pause"),
        ];
        if let Some((_, name)) = named.iter().find(|(n, _)| *n == nr) {
            return (*name).to_owned();
        }
    }
    format!("system call {nr}")
}

#[cfg(procfs)]
/// A thread's name while it lives.
pub(crate) fn thread_name(tid: u32) -> Option<String> {
    // At most 15 bytes and a newline: read into the stack, without the size lookup and
    // the second read of `read_to_string` (a wall window names every thread it looks at:
    // a third of its first looks' CPU went there).
    let mut name = [0u8; 64];
    read_short(&format!("/proc/self/task/{tid}/comm"), &mut name)
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
/// How long thread `tid` has waited, ready to run, for a CPU so far: the second field of
/// its `schedstat` (nanoseconds; kernels without scheduler statistics have no such file).
pub(crate) fn thread_run_delay(tid: u32) -> Option<Duration> {
    // Three numbers of at most 20 digits; read into the stack, without the size lookup
    // and allocation of `read_to_string` (a wall window reads it at every move of every
    // thread doing work: a fifth of the sweep's CPU went there).
    let mut line = [0u8; 96];
    parse_run_delay(read_short(
        &format!("/proc/self/task/{tid}/schedstat"),
        &mut line,
    )?)
}

#[cfg(procfs)]
/// The run delay of a `schedstat` line.
fn parse_run_delay(line: &str) -> Option<Duration> {
    let waited = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(waited))
}

/// A short file of one thread's, `/proc/self/task/{tid}/{name}`, kept open and read again
/// from its start at each look: one system call a read instead of an open, a read and a
/// close (the kernel makes such a file's text anew at each read from offset 0). It stays
/// the file of the thread it was opened for: once that thread exits, reads fail, even
/// after a new thread takes its id.
#[cfg(procfs)]
pub(crate) struct ThreadFile(std::fs::File);

#[cfg(procfs)]
impl ThreadFile {
    pub(crate) fn open(tid: u32, name: &str) -> Option<ThreadFile> {
        std::fs::File::open(format!("/proc/self/task/{tid}/{name}"))
            .ok()
            .map(ThreadFile)
    }

    /// Its text now, into `buffer` (as much as fits).
    fn read<'b>(&self, buffer: &'b mut [u8]) -> Option<&'b str> {
        use std::os::unix::fs::FileExt as _;
        let len = loop {
            match self.0.read_at(buffer, 0) {
                Ok(len) => break len,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        };
        std::str::from_utf8(&buffer[..len]).ok()
    }

    /// A `syscall` file's [`ProcThread::in_kernel`].
    pub(crate) fn in_kernel(&self) -> Option<InKernel> {
        let mut line = [0u8; 256];
        parse_syscall(self.read(&mut line)?)
    }

    /// A `schedstat` file's first field: the thread's runtime as the scheduler last
    /// accounted it (its CPU clock, less the moments since if it runs now).
    pub(crate) fn exec_runtime(&self) -> Option<Duration> {
        let mut line = [0u8; 96];
        let ran = self
            .read(&mut line)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(Duration::from_nanos(ran))
    }

    /// A `schedstat` file's [`thread_run_delay`].
    pub(crate) fn run_delay(&self) -> Option<Duration> {
        let mut line = [0u8; 96];
        parse_run_delay(self.read(&mut line)?)
    }
}

#[cfg(procfs)]
/// The text of a short `/proc` file, read into `buffer` (as much of it as fits). The
/// kernel gives such a file's one record whole in the first read that has room for it:
/// a read that leaves room is the last (no second read to be told the end).
fn read_short<'b>(path: &str, buffer: &'b mut [u8]) -> Option<&'b str> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = 0;
    while len < buffer.len() {
        match file.read(&mut buffer[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < buffer.len() {
                    break;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    std::str::from_utf8(&buffer[..len]).ok()
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

/// This profiler's own threads (`krabka-drain`, `krabka-worker`, `krabka-recorder`,
/// `krabka-wall`), by id, while they run: what a wall window does not look at. Fixed slots,
/// not a list that allocates: an allocation site more would take a place in heap
/// profiles' bounded table of allocation stacks. A thread that finds every slot taken is
/// not told apart (a wall window looks at it like any thread).
#[cfg(procfs)]
static OWN_THREADS: [std::sync::atomic::AtomicU32; 128] =
    [const { std::sync::atomic::AtomicU32::new(0) }; 128];

/// The calling thread is one of this profiler's own until this is dropped.
#[cfg(procfs)]
pub(crate) struct OwnThread(Option<&'static std::sync::atomic::AtomicU32>);

#[cfg(procfs)]
impl OwnThread {
    pub(crate) fn register() -> OwnThread {
        let tid = current_tid();
        OwnThread(OWN_THREADS.iter().find(|slot| {
            slot.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }))
    }
}

#[cfg(procfs)]
impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            slot.store(0, Ordering::Release);
        }
    }
}

/// Whether thread `tid` is one of this profiler's own, running now.
#[cfg(procfs)]
pub(crate) fn is_own_thread(tid: u32) -> bool {
    OWN_THREADS
        .iter()
        .any(|slot| slot.load(Ordering::Acquire) == tid)
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
/// How many threads the process has now: the link count of `/proc/self/task`, which the
/// kernel gives as the threads + 2 (one `statx`, about 1.5 µs here whatever the threads,
/// against 11 µs for `Threads:` of `/proc/self/status` with 600 of them, which also walks
/// the memory map, and 550 µs for listing `/proc/self/task` with 1,000). A drain and a
/// wall sweep ask it several times a second. `Threads:` where the count looks wrong.
pub(crate) fn thread_count() -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(task) = std::fs::metadata("/proc/self/task")
        && task.nlink() > 2
    {
        return usize::try_from(task.nlink() - 2).ok();
    }
    status_thread_count()
}

#[cfg(procfs)]
/// `Threads:` of `/proc/self/status`.
fn status_thread_count() -> Option<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
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

#[cfg(test)]
#[cfg(procfs)]
pub(crate) mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn system_calls_are_named_where_threads_wait_and_numbered_elsewhere() {
        assert_eq!(syscall_name(libc::SYS_futex), "futex");
        assert_eq!(syscall_name(libc::SYS_ppoll), "ppoll");
        assert_eq!(syscall_name(-7), "system call -7");
    }

    use super::*;

    /// The threads counted by the link count of `/proc/self/task` are those
    /// `/proc/self/status` counts, read while the test's process did not start or end a
    /// thread (the same `Threads:` before and after), with 8 threads more than usual.
    #[cfg(procfs)]
    #[test]
    fn the_thread_count_is_the_one_the_status_gives() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let stopped = std::sync::Arc::new(std::sync::Mutex::new(stopped));
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let stopped = stopped.clone();
                std::thread::spawn(move || {
                    let _ = stopped.lock().map(|stopped| stopped.recv());
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // A thread that starts and another that ends between the two reads leave the same
        // `Threads:` around another count: read again, until the deadline.
        let mut last = None;
        loop {
            let before = status_thread_count().expect("Threads: in the status");
            let counted = thread_count();
            if status_thread_count() == Some(before) {
                assert!(before >= 9, "{before}");
                if counted == Some(before) {
                    break;
                }
                last = Some((counted, before));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the threads never settled; the last count and status read: {last:?}"
            );
        }
        drop(stop);
        waiting
            .into_iter()
            .for_each(|thread| thread.join().unwrap());
    }

    /// Installs a seccomp filter that allows every call on the calling thread alone (no
    /// `TSYNC`), after `no_new_privs` on it: a thread with a filter of its own.
    pub(crate) fn install_allow_all_seccomp_filter() {
        install_seccomp_filter(&mut [libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        }]);
    }

    /// Installs `filter`, a seccomp program, on the calling thread alone (no `TSYNC`),
    /// after `no_new_privs` on it.
    pub(crate) fn install_seccomp_filter(filter: &mut [libc::sock_filter]) {
        let program = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_mut_ptr(),
        };
        // SAFETY: no_new_privs on this thread, then a filter program that lives through
        // the call; without TSYNC, on this thread alone.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &raw const program,
                ),
                0,
                "installing a seccomp filter"
            );
        }
    }

    #[test]
    fn the_command_line_is_the_arguments_each_ended_by_a_nul_but_the_last() {
        // The test binary's own arguments, as the kernel keeps them (each ended by a NUL):
        // `/cmdline` is that without the last NUL, as Go's.
        let kernel = std::fs::read("/proc/self/cmdline").unwrap();
        let expected = kernel.strip_suffix(b"\0").unwrap_or(&kernel);
        assert_eq!(cmdline(), expected);
    }

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
    fn syscall_lines_give_where_a_sleeping_thread_entered_the_kernel() {
        assert_eq!(parse_syscall("running\n"), Some(InKernel::Running));
        assert_eq!(
            parse_syscall("7 0x0 0x0 0xea60 0x0 0x0 0x0 0x7fed2d273ea0 0x7fed2d37426f\n"),
            Some(InKernel::Asleep {
                nr: 7,
                sp: 0x7fed_2d27_3ea0,
                pc: 0x7fed_2d37_426f
            })
        );
        assert_eq!(
            parse_syscall("-1 0x7ffc10 0x5555aa\n"),
            Some(InKernel::Asleep {
                nr: -1,
                sp: 0x7f_fc10,
                pc: 0x55_55aa
            })
        );
        assert_eq!(parse_syscall("7 0x0 0x0\n"), None, "cut short");
        assert_eq!(parse_syscall(""), None);
    }

    #[test]
    fn a_sleeping_thread_shows_its_system_call_and_a_spinning_one_runs() {
        use std::sync::atomic::AtomicBool;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            tx.send(current_tid()).unwrap();
            let _ = done_rx.recv();
        });
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, spinner_tid) = std::sync::mpsc::channel();
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                tx.send(current_tid()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let tid = rx.recv().unwrap();
        let spinner_tid = spinner_tid.recv().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let asleep = loop {
            match ProcThread::in_kernel(tid) {
                Some(InKernel::Asleep { nr, sp, pc }) => break (nr, sp, pc),
                _ if std::time::Instant::now() < deadline => std::thread::yield_now(),
                other => panic!("never asleep: {other:?}"),
            }
        };
        // It waits on a futex (the channel).
        assert_eq!(asleep.0, libc::SYS_futex);
        assert!(asleep.1 != 0 && asleep.2 != 0, "{asleep:?}");
        // Running, or ready to run: never a register set that is changing.
        assert_eq!(ProcThread::in_kernel(spinner_tid), Some(InKernel::Running));
        stop.store(true, Ordering::Relaxed);
        done_tx.send(()).unwrap();
        sleeper.join().unwrap();
        spinner.join().unwrap();
    }

    #[test]
    fn a_kept_thread_file_reads_the_thread_as_it_is_now_and_fails_once_it_is_gone() {
        use std::sync::atomic::AtomicBool;
        let spin = std::sync::Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let thread = {
            let spin = spin.clone();
            std::thread::spawn(move || {
                tid_tx.send(current_tid()).unwrap();
                // Asleep on the channel, then spinning until told, then asleep again.
                let _ = go_rx.recv();
                while spin.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
                let _ = go_rx.recv();
            })
        };
        let tid = tid_rx.recv().unwrap();
        let syscall = ThreadFile::open(tid, "syscall").expect("its syscall file");
        let schedstat = ThreadFile::open(tid, "schedstat").expect("its schedstat file");
        let until = |want: &dyn Fn(Option<InKernel>) -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let now = syscall.in_kernel();
                if want(now) {
                    return now;
                }
                assert!(std::time::Instant::now() < deadline, "never so: {now:?}");
                std::thread::yield_now();
            }
        };
        let asleep = |now: Option<InKernel>| matches!(now, Some(InKernel::Asleep { .. }));
        until(&asleep);
        let waited = schedstat.run_delay().expect("its run delay");
        // The same descriptor, read again: it runs now.
        spin.store(true, Ordering::Relaxed);
        go_tx.send(()).unwrap();
        until(&|now| now == Some(InKernel::Running));
        spin.store(false, Ordering::Relaxed);
        until(&asleep);
        assert!(schedstat.run_delay().expect("read again") >= waited);
        drop(go_tx);
        thread.join().unwrap();
        // Gone: its files read nothing, whichever thread takes its id next. (A join
        // returns once the kernel has cleared the thread's id, early in its exit: its
        // files still read until the exit ends.)
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while syscall.in_kernel().is_some() || schedstat.run_delay().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "a gone thread's files still read"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn status_gives_the_mask_and_the_filter_at_once() {
        let status =
            parse_status("Name:\tx\nSigBlk:\t0000000000400000\nSeccomp:\t2\nSeccomp_filters:\t1\n");
        assert!(status.blocks(libc::SIGURG) && !status.blocks(libc::SIGPROF));
        assert_eq!(status.seccomp, Some((2, 1)));
        let old = parse_status("SigBlk:\t0000000000001000\nSeccomp:\t0\n");
        assert!(old.blocks(libc::SIGPIPE));
        assert_eq!(old.seccomp, Some((0, 0)), "no filter count before 5.9");
        let here = ProcThread::status(current_tid()).expect("this thread's status");
        assert_eq!(
            here.seccomp.map(|(mode, _)| mode),
            ProcThread::seccomp(current_tid()).map(|(mode, _)| mode)
        );
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
                assert_eq!(thread_name(tid).as_deref(), Some("krabka-listed"));
                assert_eq!(me.state, 'R', "it is running while it reads itself");
            })
            .expect("spawns")
            .join()
            .expect("passes");
    }

    #[test]
    fn the_process_cpu_time_is_the_kernels_to_the_microsecond() {
        let kernel = || {
            let mut time = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid clock id and a timespec to write.
            let read = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut time) };
            assert_eq!(read, 0);
            Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
        };
        // Some CPU time first, by the kernel's clock (a busy machine gives less per wall
        // second): user time spun, system time from system calls; at most 10 s.
        let spin = std::time::Instant::now();
        while kernel() < Duration::from_millis(30) && spin.elapsed() < Duration::from_secs(10) {
            std::hint::black_box(std::fs::metadata("/proc/self/stat").is_ok());
        }
        let before = kernel();
        let read = process_cpu_time();
        let after = kernel();
        // getrusage's user and system times add up to the process's CPU clock, each cut
        // to the microsecond: within it of the two readings around (and 1 ms of slack).
        let slack = Duration::from_millis(1);
        assert!(
            read + slack >= before && read <= after + slack,
            "{before:?} <= {read:?} <= {after:?}"
        );
        assert!(
            before >= Duration::from_millis(30),
            "the spin ran: {before:?}"
        );
    }

    #[test]
    fn every_state_letter_has_its_word() {
        let words = [
            ('R', "running"),
            ('S', "sleeping"),
            ('D', "disk sleep"),
            ('T', "stopped"),
            ('t', "tracing stop"),
            ('Z', "zombie"),
            ('X', "dead"),
            ('I', "idle"),
            ('?', "unknown state"),
        ];
        for (state, word) in words {
            let thread = ProcThread {
                tid: 1,
                name: String::new(),
                state,
                cpu: Duration::ZERO,
                wchan: None,
            };
            assert_eq!(thread.state_name(), word, "{state}");
        }
    }

    #[test]
    fn a_sleeping_threads_wchan_is_kept_and_a_running_ones_zero_is_not() {
        // The reading thread runs: the kernel's `wchan` says "0", which is no place.
        assert_eq!(ProcThread::read(current_tid()).unwrap().wchan, None);
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            tid_tx.send(current_tid()).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        // Until the kernel has it asleep in `recv`'s futex wait (bounded: 10 s).
        let start = std::time::Instant::now();
        let asleep = loop {
            let thread = ProcThread::read(tid).unwrap();
            if thread.state == 'S' || start.elapsed() > Duration::from_secs(10) {
                break thread;
            }
            std::thread::yield_now();
        };
        let kernel = std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")).unwrap();
        stop_tx.send(()).unwrap();
        sleeper.join().unwrap();
        assert_eq!(asleep.state, 'S');
        if kernel.trim() == "0" || kernel.trim().is_empty() {
            // Kernels that hide it (kptr_restrict, some containers) say "0" for every thread.
            assert_eq!(asleep.wchan, None);
        } else {
            assert!(asleep.wchan.is_some_and(|w| w != "0" && !w.is_empty()));
        }
    }

    #[test]
    fn a_thread_with_a_seccomp_filter_of_its_own_shows_it_and_the_others_do_not() {
        let (mode_here, filters_here) =
            ProcThread::seccomp(current_tid()).expect("this thread's status");
        // SAFETY: PR_GET_SECCOMP has no arguments and no preconditions.
        assert_eq!(mode_here as i32, unsafe {
            libc::prctl(libc::PR_GET_SECCOMP)
        });
        let (mode, filters, kernel_mode) = std::thread::spawn(|| {
            install_allow_all_seccomp_filter();
            let (mode, filters) = ProcThread::seccomp(current_tid()).expect("its status");
            // SAFETY: as above.
            (mode, filters, unsafe { libc::prctl(libc::PR_GET_SECCOMP) })
        })
        .join()
        .unwrap();
        assert_eq!((mode, kernel_mode), (2, 2), "mode 2: a filter");
        let counted = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .contains("Seccomp_filters:");
        assert_eq!(
            filters,
            filters_here + u32::from(counted),
            "one filter more, where the kernel counts them"
        );
        assert_eq!(
            ProcThread::seccomp(current_tid()).unwrap().0,
            mode_here,
            "not this one"
        );
    }

    /// The process's mode is its main thread's (the thread `/proc/self/status`
    /// describes), whichever thread asks: here also one with a filter of its own.
    #[test]
    fn the_processs_seccomp_mode_is_its_main_threads() {
        let main = ProcThread::seccomp(std::process::id())
            .expect("the main thread's status")
            .0;
        assert_eq!(seccomp_mode(), main);
        let asked_by_a_filtered_thread = std::thread::spawn(|| {
            install_allow_all_seccomp_filter();
            seccomp_mode()
        })
        .join()
        .unwrap();
        assert_eq!(asked_by_a_filtered_thread, main, "not the asking thread's");
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
