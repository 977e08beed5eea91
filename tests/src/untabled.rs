//! Code without unwind tables on the stack, as musl's libc is in a static binary, built
//! so that the unwinder's guess past it is known to be wrong: `krabka_untabled_trampoline`
//! (assembly with no CFI, so no `.eh_frame` entry covers it) calls a Rust function with
//! its frame pointer aimed at a decoy frame record whose return address lies just after a
//! call in `krabka_decoy`, a function that never runs. An unwinder that goes on past the
//! trampoline by the frame pointer shows `krabka_decoy` as its caller; the trampoline's
//! real caller (`krabka_enters_untabled_code`) is never reachable from the tables.
//! [`parked`] is a thread asleep behind it for good, [`Spinner`] one that burns CPU
//! behind it while held. x86_64 only.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

// The trampoline keeps `rbx` and `rbp` for its caller, pushes the decoy record (a saved
// frame pointer of 0, the outermost, and the decoy's return address), points `rbp` at it,
// aligns the stack and calls `rdi(rsi)`. Neither function has a `.cfi_*` directive.
std::arch::global_asm!(
    ".text",
    ".globl krabka_untabled_trampoline",
    ".type krabka_untabled_trampoline, @function",
    "krabka_untabled_trampoline:",
    "push rbx",
    "push rbp",
    "mov rbx, rsp",
    "lea rax, [rip + krabka_decoy_return]",
    "push rax",
    "push 0",
    "mov rbp, rsp",
    "sub rsp, 8",
    "mov rax, rdi",
    "mov rdi, rsi",
    "call rax",
    "mov rsp, rbx",
    "pop rbp",
    "pop rbx",
    "ret",
    ".size krabka_untabled_trampoline, . - krabka_untabled_trampoline",
    ".globl krabka_decoy",
    ".type krabka_decoy, @function",
    "krabka_decoy:",
    "call krabka_untabled_trampoline",
    "krabka_decoy_return:",
    "ret",
    ".size krabka_decoy, . - krabka_decoy",
);

unsafe extern "C" {
    fn krabka_untabled_trampoline(callee: extern "C" fn(*mut c_void), argument: *mut c_void);
}

/// The name of the code without tables, as a profile's frame shows it.
pub const TRAMPOLINE: &str = "krabka_untabled_trampoline";
/// The function an unwinder that guesses past the trampoline shows as its caller.
pub const DECOY: &str = "krabka_decoy";
/// The trampoline's real caller, which no unwind table can reach.
pub const REAL_CALLER: &str = "krabka_enters_untabled_code";
/// The function the parked thread sleeps in, behind the trampoline.
pub const PARKED_IN: &str = "krabka_asleep_behind_untabled_code";
/// The function the spinner burns CPU in, behind the trampoline.
pub const SPINNING_IN: &str = "krabka_spinning_behind_untabled_code";

/// Calls `run` through the trampoline.
#[inline(never)]
pub fn krabka_enters_untabled_code(run: &mut dyn FnMut()) {
    extern "C" fn call(argument: *mut c_void) {
        // SAFETY: the pointer is to `run`, borrowed for the trampoline's call.
        let run = unsafe { &mut *argument.cast::<&mut dyn FnMut()>() };
        run();
    }
    let mut run = run;
    // SAFETY: the trampoline calls `call` once with the argument and returns, keeping
    // every register the C ABI says a callee keeps.
    unsafe { krabka_untabled_trampoline(call, (&raw mut run).cast()) };
    black_box(());
}

#[inline(never)]
fn krabka_asleep_behind_untabled_code() {
    loop {
        std::thread::park();
    }
}

#[inline(never)]
fn krabka_spinning_behind_untabled_code(stop: &AtomicBool) {
    // At most a minute, a bound on the test that holds it.
    let until = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        black_box(crate::hot::krabka_hot_spin(black_box(2_000)));
    }
}

/// The id of the process's one thread asleep behind the trampoline for its life, started on
/// first use; returns once it is on its way to sleep (wait for it with
/// [`wait_until_asleep`](crate::parked::wait_until_asleep)).
pub fn parked() -> u32 {
    static PARKED: OnceLock<u32> = OnceLock::new();
    *PARKED.get_or_init(|| {
        let (ready, tid) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("krabka-untabled".to_owned())
            .spawn(move || {
                ready.send(crate::parked::gettid()).unwrap();
                krabka_enters_untabled_code(&mut krabka_asleep_behind_untabled_code);
            })
            .expect("spawn the thread behind code without tables");
        tid.recv_timeout(Duration::from_secs(30)).expect("ready")
    })
}

/// A thread burning CPU behind the trampoline until dropped (at most a minute).
pub struct Spinner {
    pub tid: u32,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    pub fn start() -> Spinner {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, tid) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("krabka-untabled-spin".to_owned())
            .spawn(move || {
                ready.send(crate::parked::gettid()).unwrap();
                krabka_enters_untabled_code(&mut || krabka_spinning_behind_untabled_code(&flag));
            })
            .expect("spawn the spinner behind code without tables");
        Spinner {
            tid: tid.recv_timeout(Duration::from_secs(30)).expect("ready"),
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
