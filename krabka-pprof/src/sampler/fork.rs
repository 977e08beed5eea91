//! What a child made by `fork` must forget: the parent's session and dump, which no
//! timer of the child feeds and no thread of the child will stop, and the parent's
//! handler counts. POSIX timers are not inherited, so the child starts without samples;
//! this lets it take profiles and dumps of its own.

use std::sync::Once;
use std::sync::atomic::Ordering;

use super::dump::{DUMP, DUMP_HANDLERS};
use super::handler::{CPU_HANDLERS, SESSION};

/// In a child made by `fork`, the parent's session and dump are copies that no timer
/// feeds and no thread will ever stop: forget them (leaking the copies), so that the
/// child can profile itself. Registered once, before the first session or dump starts.
pub(crate) fn register_fork_handler() {
    static ONCE: Once = Once::new();
    extern "C" fn in_child() {
        SESSION.store(std::ptr::null_mut(), Ordering::SeqCst);
        DUMP.store(std::ptr::null_mut(), Ordering::SeqCst);
        CPU_HANDLERS.reset();
        DUMP_HANDLERS.reset();
    }
    ONCE.call_once(|| {
        // SAFETY: the child handler only stores to atomics, which is async-signal-safe.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
}
