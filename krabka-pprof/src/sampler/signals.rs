//! The two signals the sampler takes, their dispositions, and the count of handlers
//! running for each. CPU samples come with `SIGPROF` (POSIX CPU timers send it, and its
//! name is what profilers use); a thread dump asks each thread with `SIGURG`, whose default
//! action is to ignore it, so that a dump's signal still pending on a thread that blocks
//! it, or that calls `execve` meanwhile, can never kill the process or the program it
//! becomes. Each handler blocks the other signal while it runs, so that the two never
//! nest on one thread, and each kind has its own count: stopping a CPU session never waits
//! for a dump's handlers, nor a dump for a CPU sample's.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The signal of CPU samples.
pub(crate) const CPU_SIGNAL: libc::c_int = libc::SIGPROF;
/// The signal of thread dumps.
pub(crate) const DUMP_SIGNAL: libc::c_int = libc::SIGURG;

/// A `SA_SIGINFO` handler.
pub(crate) type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Why sampling (or a dump) could not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Another session is running in this process (another router, or a bug).
    Running,
    /// Another handler is installed for the signal (another profiler, or a runtime that
    /// uses it, in this process).
    ForeignHandler,
    /// A system call failed.
    System(&'static str, std::io::Error),
}

/// The handler installed for `signal` now.
fn installed(signal: libc::c_int) -> usize {
    // SAFETY: sigaction with a null new action only writes the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
            return libc::SIG_DFL;
        }
        old.sa_sigaction
    }
}

/// Whether `handler` is the one installed for `signal`.
pub(crate) fn is_installed(signal: libc::c_int, handler: Handler) -> bool {
    installed(signal) == handler as usize
}

/// Whether `handler` may be installed for `signal`: nobody else's is there.
pub(crate) fn is_free_for(signal: libc::c_int, handler: Handler) -> bool {
    let now = installed(signal);
    now == libc::SIG_DFL || now == libc::SIG_IGN || now == handler as usize
}

/// Installs `handler` for `signal` (again, in case the default came back since), with
/// every blockable signal blocked while it runs (as Go's runtime installs its own): no
/// handler of the application's runs on top of ours, so none can leave ours half done
/// (a `siglongjmp` out of a timeout handler would leave a scratch slot and the buffer's
/// writer count held for good). glibc's `sigfillset` leaves out the two signals its
/// threads library uses internally; the kernel ignores `SIGKILL` and `SIGSTOP` in a mask.
pub(crate) fn install(signal: libc::c_int, handler: Handler) -> Result<(), StartError> {
    // SAFETY: the sigaction struct is fully initialised; the handlers are async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigfillset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return Err(StartError::System(
                if signal == CPU_SIGNAL {
                    "sigaction(SIGPROF)"
                } else {
                    "sigaction(SIGURG)"
                },
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// How many handlers of one kind run now. What a handler reads is freed only once its
/// pointer was cleared and this count has then been seen at zero: a handler that loaded
/// the pointer before it was cleared entered first (both `SeqCst`), so it is counted
/// until it is done.
pub(crate) struct Running(AtomicUsize, AtomicBool);

/// How long a wait for handlers gives them before it concludes one never returns.
pub(crate) const HANDLER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Running {
    pub(crate) const fn new() -> Running {
        Running(AtomicUsize::new(0), AtomicBool::new(false))
    }

    /// A handler starts; async-signal-safe.
    pub(crate) fn enter(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// A handler is done; async-signal-safe.
    pub(crate) fn leave(&self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits until no handler of this kind runs; whether none does. Handlers take
    /// microseconds (a dump's waits for a scratch slot only until its dump expires), so
    /// this returns within one handler's run, except where a handler never ends: a thread
    /// killed inside it (a seccomp filter that kills the thread for a call the handler
    /// made) leaves the count above zero for good. Then this gives up after
    /// [`HANDLER_WAIT`], and at once while the count stays above zero: what the handlers
    /// read must then stay allocated (the callers leak it), never be freed under a
    /// handler, nor wait forever. Once the count is seen at zero again (the stalled
    /// handler did return: a thread stopped by a debugger, a host paused for seconds),
    /// that state ends, and waits are waits again: one stall does not make every later
    /// session leak what it frees.
    pub(crate) fn wait_until_none(&self) -> bool {
        if self.1.load(Ordering::Relaxed) {
            if self.0.load(Ordering::SeqCst) != 0 {
                return false;
            }
            self.1.store(false, Ordering::Relaxed);
            return true;
        }
        let started = std::time::Instant::now();
        while self.0.load(Ordering::SeqCst) != 0 {
            if started.elapsed() >= HANDLER_WAIT {
                self.1.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "a signal handler of krabka-pprof's sampler never returned (a thread was \
                     killed inside it?); what it may still read is kept allocated from now on"
                );
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// In a child made by `fork`: no handler of the parent's runs here.
    pub(crate) fn reset(&self) {
        self.0.store(0, Ordering::SeqCst);
        self.1.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bodies that differ, behind black_box: an optimised build folds identical functions
    // (and ones whose only effect it can drop) into one address.
    extern "C" fn one(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        std::hint::black_box(1u64);
    }
    extern "C" fn another(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        std::hint::black_box(2u64);
    }

    /// A real-time signal nothing in this process uses: installed, it is this handler's and
    /// not free for another's; the default is free for any.
    #[test]
    fn a_signal_is_free_until_another_handler_is_installed() {
        let signal = libc::SIGRTMAX() - 3;
        assert!(is_free_for(signal, one) && is_free_for(signal, another));
        assert!(!is_installed(signal, one));
        install(signal, one).unwrap();
        assert!(is_installed(signal, one));
        assert!(!is_installed(signal, another));
        assert!(
            is_free_for(signal, one),
            "free for the handler already there"
        );
        assert!(!is_free_for(signal, another));
        // SAFETY: puts the default action back; nothing sends this signal.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
        assert!(is_free_for(signal, another));
    }

    /// While our handler runs, every signal a mask can hold is held: an application's
    /// handler never runs on top of it (the sampler review found 1 of 62 blocked). Read
    /// back as a host would, with `sigaction`.
    #[test]
    fn the_handler_runs_with_every_blockable_signal_blocked() {
        let signal = libc::SIGRTMAX() - 4;
        install(signal, one).unwrap();
        // SAFETY: reads the action back into a zeroed struct.
        let action = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(signal, std::ptr::null(), &mut action), 0);
            action
        };
        // SAFETY: sigismember reads the set.
        let blocked = |s: libc::c_int| unsafe { libc::sigismember(&action.sa_mask, s) } == 1;
        // glibc's own two (SIGCANCEL, SIGSETXID: 32 and 33 on Linux) are never in a set
        // it fills; musl's sigfillset leaves out its internal ones too.
        let internal = |s: libc::c_int| (32..libc::SIGRTMIN()).contains(&s);
        let unblocked: Vec<libc::c_int> = (1..=libc::SIGRTMAX())
            .filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP && !internal(s))
            .filter(|&s| !blocked(s))
            .collect();
        assert!(
            unblocked.is_empty(),
            "not blocked while it runs: {unblocked:?}"
        );
        // SAFETY: puts the default action back; nothing sends this signal.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }

    #[test]
    fn a_wait_for_handlers_waits_for_them_and_gives_up_on_one_that_never_returns() {
        let running = std::sync::Arc::new(Running::new());
        assert!(running.wait_until_none(), "none running");
        // A handler that returns after a while is waited for.
        running.enter();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let leaver = {
            let running = running.clone();
            std::thread::spawn(move || {
                started_rx.recv().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                running.leave();
            })
        };
        started_tx.send(()).unwrap();
        assert!(running.wait_until_none(), "waited for the handler to leave");
        leaver.join().unwrap();
        // One that never returns: given up on after HANDLER_WAIT, and not waited for again.
        running.enter();
        assert!(!running.wait_until_none());
        assert!(
            !running.wait_until_none(),
            "still one inside, not waited for again"
        );
        running.leave();
        assert!(running.wait_until_none(), "none inside now");
        // Seen at zero, the stall is over: a handler that takes a while is waited for
        // again, not given up on at once.
        running.enter();
        let leaver = {
            let running = running.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                running.leave();
            })
        };
        assert!(
            running.wait_until_none(),
            "waited for again after the stall ended"
        );
        leaver.join().unwrap();
        // A new sampler starts counting afresh.
        running.enter();
        running.reset();
        assert!(running.wait_until_none());
    }
}
