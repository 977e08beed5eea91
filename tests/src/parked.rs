//! Threads parked in known functions, for the thread dump tests: two deadlocked on two
//! mutexes, one sleeping, one in a blocking read, one in `poll` counting how often it is
//! interrupted, one burning CPU, one that blocks the signals a profiler sends (`SIGURG`
//! and `SIGPROF`, as librdkafka's threads block them all), and three alike (a group of
//! three in `debug=1`). Each names itself and says its thread id once it is where the
//! dump should find it. [`MaskedSpinner`] is a thread that blocks them while it runs, for
//! as long as a test holds it.

use std::hint::black_box;
use std::io::Read as _;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::Duration;

/// One parked thread: its name and id, and the function the dump must show it in.
#[derive(Clone, Debug)]
pub struct Parked {
    pub name: &'static str,
    pub tid: u32,
    pub function: &'static str,
}

/// The threads of [`cast`], by role.
pub struct Cast {
    pub deadlocked: [Parked; 2],
    pub sleeper: Parked,
    pub reader: Parked,
    /// In `poll` with a minute's timeout, on a pipe nothing is written to.
    pub poller: Parked,
    pub burner: Parked,
    pub masked: Parked,
    pub trio: [Parked; 3],
    /// Keeps the reader's socket open, so that its read never returns.
    _writer: UnixStream,
    burning: Arc<AtomicBool>,
    /// The times the poller's `poll` failed with `EINTR`.
    poll_interrupted: Arc<AtomicU64>,
}

impl Cast {
    /// Every member.
    pub fn all(&self) -> Vec<&Parked> {
        let mut all: Vec<&Parked> = self.deadlocked.iter().collect();
        all.extend([
            &self.sleeper,
            &self.reader,
            &self.poller,
            &self.burner,
            &self.masked,
        ]);
        all.extend(self.trio.iter());
        all
    }

    /// Whether the burner still burns (it stops after 10 minutes, a bound on the test).
    pub fn burning(&self) -> bool {
        self.burning.load(Ordering::Relaxed)
    }

    /// How often the poller's `poll` has been interrupted (`EINTR`) so far: once per
    /// signal it took.
    pub fn poll_interruptions(&self) -> u64 {
        self.poll_interrupted.load(Ordering::SeqCst)
    }
}

pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Spawns a thread named `name` that reports its id on `ready`, then runs `park`.
fn spawn(
    name: &'static str,
    ready: &Sender<(&'static str, u32)>,
    park: impl FnOnce() + Send + 'static,
) {
    let ready = ready.clone();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // Sent before parking; the test waits below until each is in its place.
            ready.send((name, gettid())).unwrap();
            park();
        })
        .expect("spawn a parked thread");
}

#[inline(never)]
pub fn krabka_deadlock_first(mine: &Mutex<()>, theirs: &Mutex<()>, both: &Barrier) {
    let _held = mine.lock().unwrap();
    both.wait();
    // The other thread holds `theirs` and waits for `mine`: neither returns.
    let _never = black_box(theirs.lock().unwrap());
}

#[inline(never)]
pub fn krabka_deadlock_second(mine: &Mutex<()>, theirs: &Mutex<()>, both: &Barrier) {
    let _held = mine.lock().unwrap();
    both.wait();
    let _never = black_box(theirs.lock().unwrap());
}

#[inline(never)]
pub fn krabka_sleeping() {
    loop {
        std::thread::sleep(black_box(Duration::from_secs(3600)));
    }
}

#[inline(never)]
pub fn krabka_blocking_read(mut socket: UnixStream) {
    let mut byte = [0u8; 1];
    // Nothing is ever written: the read blocks until the process ends.
    let _ = black_box(socket.read(&mut byte));
    krabka_sleeping();
}

/// Polls `fd` (nothing is ever written to it) with a minute's timeout, again and again,
/// counting each `EINTR`: a signal that interrupts it (`SA_RESTART` restarts no `poll`).
#[inline(never)]
pub fn krabka_polling(fd: std::os::fd::RawFd, interrupted: &AtomicU64) {
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, black_box(60_000)) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            interrupted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[inline(never)]
pub fn krabka_burning(burning: &AtomicBool) {
    let until = std::time::Instant::now() + Duration::from_secs(600);
    while std::time::Instant::now() < until {
        black_box(crate::hot::krabka_hot_spin(black_box(20_000)));
    }
    burning.store(false, Ordering::Relaxed);
    krabka_sleeping();
}

/// Burns CPU until `stop` is set (for a test's own running threads, which the parked
/// cast's burner, running for the process's life, cannot be).
#[inline(never)]
pub fn krabka_spinning(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        black_box(crate::hot::krabka_hot_spin(black_box(2_000)));
    }
}

/// Blocks, in this thread, the signals profilers and dumps send: `SIGURG` (dumps) and
/// `SIGPROF` (CPU timers).
fn block_profiler_signals() {
    // SAFETY: the set is initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGURG);
        libc::sigaddset(&mut set, libc::SIGPROF);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

#[inline(never)]
pub fn krabka_masked(ready: impl FnOnce()) {
    block_profiler_signals();
    // Ready only once the signals are blocked.
    ready();
    krabka_sleeping();
}

#[inline(never)]
pub fn krabka_masked_spinning(stop: &AtomicBool) {
    // At most a minute, a bound on the test that holds it.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
        black_box(crate::hot::krabka_hot_spin(black_box(2_000)));
    }
}

/// A thread that blocks `SIGURG` and `SIGPROF` and runs (spins in
/// [`krabka_masked_spinning`]) until dropped: one that can be neither read while it sleeps
/// nor asked.
pub struct MaskedSpinner {
    pub tid: u32,
    pub function: &'static str,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MaskedSpinner {
    /// Starts it; returns once it blocks the signals and spins.
    pub fn start() -> MaskedSpinner {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, started) = channel();
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("krabka-masked-spin".to_owned())
                .spawn(move || {
                    block_profiler_signals();
                    ready.send(gettid()).unwrap();
                    krabka_masked_spinning(&stop);
                })
                .expect("spawn the masked spinner")
        };
        let tid = started
            .recv_timeout(Duration::from_secs(30))
            .expect("the masked spinner starts");
        MaskedSpinner {
            tid,
            function: "krabka_masked_spinning",
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for MaskedSpinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[inline(never)]
pub fn krabka_one_of_three() {
    krabka_sleeping();
}

/// The process's one cast, started on first use. Returns once every member is in its
/// function (the deadlocked pair past their first lock, the others about to park).
pub fn cast() -> &'static Cast {
    static CAST: OnceLock<Cast> = OnceLock::new();
    CAST.get_or_init(|| {
        let (ready, arrived) = channel();
        let first = Arc::new(Mutex::new(()));
        let second = Arc::new(Mutex::new(()));
        let both = Arc::new(Barrier::new(3));
        for (name, a, b) in [
            ("krabka-dl-one", first.clone(), second.clone()),
            ("krabka-dl-two", second.clone(), first.clone()),
        ] {
            let both = both.clone();
            spawn(name, &ready, move || {
                if name == "krabka-dl-one" {
                    krabka_deadlock_first(&a, &b, &both)
                } else {
                    krabka_deadlock_second(&a, &b, &both)
                }
            });
        }
        spawn("krabka-sleeper", &ready, krabka_sleeping);
        let (writer, reader) = UnixStream::pair().expect("a socket pair");
        spawn("krabka-reader", &ready, move || {
            krabka_blocking_read(reader)
        });
        let mut pipe = [0; 2];
        // SAFETY: pipe writes two descriptors; both stay open for the process's life, and
        // nothing is ever written to the write end.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "a pipe");
        let poll_interrupted = Arc::new(AtomicU64::new(0));
        let counted = poll_interrupted.clone();
        spawn("krabka-poller", &ready, move || {
            krabka_polling(pipe[0], &counted)
        });
        let burning = Arc::new(AtomicBool::new(true));
        let flag = burning.clone();
        spawn("krabka-burner", &ready, move || krabka_burning(&flag));
        let masked_ready = ready.clone();
        std::thread::Builder::new()
            .name("krabka-masked".to_owned())
            .spawn(move || {
                krabka_masked(|| masked_ready.send(("krabka-masked", gettid())).unwrap())
            })
            .expect("spawn the masked thread");
        for name in ["krabka-trio", "krabka-trio", "krabka-trio"] {
            spawn(name, &ready, krabka_one_of_three);
        }
        // Both deadlocked threads hold their first lock once the barrier opens.
        both.wait();
        let mut tids: Vec<(&'static str, u32)> = (0..10)
            .map(|_| {
                arrived
                    .recv_timeout(Duration::from_secs(30))
                    .expect("ready")
            })
            .collect();
        let mut take = |name: &'static str, function: &'static str| {
            let at = tids.iter().position(|(n, _)| *n == name).expect(name);
            let (name, tid) = tids.remove(at);
            Parked {
                name,
                tid,
                function,
            }
        };
        Cast {
            deadlocked: [
                take("krabka-dl-one", "krabka_deadlock_first"),
                take("krabka-dl-two", "krabka_deadlock_second"),
            ],
            sleeper: take("krabka-sleeper", "krabka_sleeping"),
            reader: take("krabka-reader", "krabka_blocking_read"),
            poller: take("krabka-poller", "krabka_polling"),
            burner: take("krabka-burner", "krabka_burning"),
            masked: take("krabka-masked", "krabka_masked"),
            trio: [
                take("krabka-trio", "krabka_one_of_three"),
                take("krabka-trio", "krabka_one_of_three"),
                take("krabka-trio", "krabka_one_of_three"),
            ],
            _writer: writer,
            burning,
            poll_interrupted,
        }
    })
}

/// The fields of a `/proc/…/stat` line after the command's name (in parentheses, and
/// free to hold spaces or parentheses itself): the state first; `utime` and `stime`,
/// in clock ticks, at indexes 11 and 12.
pub fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rfind(')').map_or_else(Vec::new, |at| {
        stat[at + 1..].split_ascii_whitespace().collect()
    })
}

/// Waits (at most 10 s) until thread `tid` of this process is asleep in the kernel (state
/// `S` or `D` in its `stat`): parked where the test expects it, not on its way there.
pub fn wait_until_asleep(tid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stat =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
        let state = stat_fields(&stat).first().copied().unwrap_or("");
        if state == "S" || state == "D" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thread {tid} never went to sleep (state {state:?})"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Thread `tid`'s CPU time so far, from its CPU clock (the id glibc's
/// `pthread_getcpuclockid` computes for a thread id).
pub fn thread_cpu_of(tid: u32) -> Duration {
    let clock = ((!(tid as libc::clockid_t)) << 3) | 4 | 2;
    // SAFETY: clock_gettime writes into the zeroed timespec we pass.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        assert_eq!(
            libc::clock_gettime(clock, &mut time),
            0,
            "thread {tid}'s clock"
        );
        time
    };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}
