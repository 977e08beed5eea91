//! The thread's label word: what the signal handler reads when it samples this thread.
//! Its low half is the handle of the user's label set (`scope`, `with_labels`), its high
//! half the handle of the span's (the tracing layer); 0 is none. The handler reads it
//! with one load (a `const`-initialised, destructor-free thread-local compiles to a plain
//! thread-pointer-relative load in an executable: no lazy initialisation, no allocation,
//! no registration), and never touches the table the handles index (`table.rs`).
//!
//! Writers are the thread itself (a scope entered, a future polled, a span entered);
//! the reader is a signal handler on the same thread, so a store and a compiler fence
//! suffice: no read-modify-write.

use std::sync::atomic::{AtomicU64, Ordering, compiler_fence};

use super::table::Handle;

thread_local! {
    static WORD: AtomicU64 = const { AtomicU64::new(0) };
}

const LOW: u64 = 0xffff_ffff;

/// The thread's label word now. Async-signal-safe in the main executable (see the module
/// docs); `Session::start` checks that this code is there before the handler uses it.
#[inline]
pub(crate) fn word() -> u64 {
    WORD.with(|word| word.load(Ordering::Relaxed))
}

/// The user half of the thread's word.
#[inline]
pub(crate) fn user() -> Handle {
    word() as u32
}

/// Sets the user half; returns the whole word before, for [`restore`].
#[inline]
pub(crate) fn set_user(handle: Handle) -> u64 {
    WORD.with(|word| {
        let old = word.load(Ordering::Relaxed);
        word.store(old & !LOW | u64::from(handle), Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        old
    })
}

/// Sets the span half; returns the whole word before, for [`restore`].
#[inline]
pub(crate) fn set_span(handle: Handle) -> u64 {
    WORD.with(|word| {
        let old = word.load(Ordering::Relaxed);
        word.store(old & LOW | u64::from(handle) << 32, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        old
    })
}

/// Puts back the word [`set_user`] or [`set_span`] returned.
#[inline]
pub(crate) fn restore(old: u64) {
    compiler_fence(Ordering::SeqCst);
    WORD.with(|word| word.store(old, Ordering::Relaxed));
}

/// Puts the word back when dropped (a scope that returns or unwinds, a poll that ends).
pub(crate) struct Restore(pub(crate) u64);

impl Drop for Restore {
    fn drop(&mut self) {
        restore(self.0);
    }
}

/// The two handles of a word: user, span.
pub(crate) fn halves(word: u64) -> (Handle, Handle) {
    (word as u32, (word >> 32) as u32)
}

/// Where [`word`]'s code is: the handler may read the thread-local only if this is in the
/// main executable (a shared library's thread-locals are reached through
/// `__tls_get_addr`, which may allocate on a thread's first access).
pub(crate) fn code_address() -> u64 {
    word as fn() -> u64 as usize as u64
}
