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
//!
//! A wall-clock profile reads the words of *sleeping* threads too, from another thread
//! (`crate::wall`), without a signal: a thread's first write registers its word's address
//! under its id ([`words_of`]), and a second thread-local's destructor removes it when the
//! thread exits, under the same lock the reader holds while it loads, so that no word is
//! read after its thread is gone. Fork handlers keep that lock across a `fork` and give
//! the child an empty registry (it has one thread, which registers again).
//!
//! Beside it, where the app installs tokio's task hooks ([`crate::task_hooks`]), a second
//! word says whether the thread is inside a task's poll now: registered the same way,
//! read with the label word ([`words_of`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, compiler_fence};

use super::table::Handle;

thread_local! {
    static WORD: AtomicU64 = const { AtomicU64::new(0) };
}

/// Registers this thread's word for [`words_of`], once per thread (a thread-local read
/// after that). Only where wall-clock profiles read it (this crate's own sampler).
#[inline]
fn register() {
    #[cfg(sampler)]
    registry::register();
}

#[cfg(all(feature = "ebpf-labels", sampler))]
pub(crate) use registry::named_handles;
#[cfg(sampler)]
pub(crate) use registry::words_of;

/// Whether the task hooks (`crate::task_hooks`) ever ran in this process: a wall profile
/// says whether they are there.
static HOOKED: AtomicBool = AtomicBool::new(false);

/// Says that this thread is inside an async task's poll (`true`) or left it, for
/// [`words_of`]: what the task hooks call around each poll. A thread-local store, and on
/// a thread's first call its registration.
#[inline]
pub(crate) fn set_polling(polling: bool) {
    if polling && !HOOKED.load(Ordering::Relaxed) {
        HOOKED.store(true, Ordering::Relaxed);
    }
    #[cfg(sampler)]
    {
        registry::register();
        // A depth, not a flag: a runtime's poll may run another's (`block_on` inside
        // `block_in_place`), whose end does not end the outer poll. Only this thread
        // writes it.
        let _ = registry::POLLING.try_with(|depth| {
            let now = depth.load(Ordering::Relaxed);
            let next = if polling {
                now.saturating_add(1)
            } else {
                now.saturating_sub(1)
            };
            depth.store(next, Ordering::Relaxed);
        });
    }
}

/// Whether the task hooks have run in this process.
pub(crate) fn hooked() -> bool {
    HOOKED.load(Ordering::Relaxed)
}

#[cfg(sampler)]
mod registry {
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    use std::sync::{Mutex, MutexGuard, Once, PoisonError};

    use super::WORD;

    thread_local! {
        /// How many async tasks' polls the thread is inside, where the task hooks say so.
        pub(super) static POLLING: AtomicU32 = const { AtomicU32::new(0) };
        static REGISTERED: Registered = const { Registered(Cell::new((0, 0))) };
        /// The registry's lock, held across a `fork` by the thread that forks.
        static HELD: RefCell<Option<MutexGuard<'static, Words>>> = const { RefCell::new(None) };
    }

    /// The words of threads that ever set labels or were polled under the task hooks, by
    /// thread id: the addresses of its label word and of its poll word.
    type Words = Option<HashMap<u32, (usize, usize)>>;
    static WORDS: Mutex<Words> = Mutex::new(None);

    /// Children forked so far on the way to this process: a child starts with one thread
    /// and an empty registry, and a registration made before its fork (the forking
    /// thread's own, under its parent's id) no longer counts.
    static FORKS: AtomicU32 = AtomicU32::new(0);

    /// This thread's entry in [`WORDS`]: [`FORKS`] and its id once registered (id 0:
    /// not yet), removed when the thread exits.
    struct Registered(Cell<(u32, u32)>);

    impl Drop for Registered {
        fn drop(&mut self) {
            #[cfg(feature = "ebpf-labels")]
            super::super::ebpf::thread_exits();
            let (forks, tid) = self.0.get();
            if tid != 0 && forks == FORKS.load(Ordering::Relaxed) {
                let mut words = WORDS.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(words) = words.as_mut() {
                    words.remove(&tid);
                }
            }
        }
    }

    /// Nothing during the thread's exit, once its entry is gone.
    #[inline]
    pub(super) fn register() {
        let _ = REGISTERED.try_with(|registered| {
            let (forks, tid) = registered.0.get();
            if tid == 0 || forks != FORKS.load(Ordering::Relaxed) {
                register_slow(registered);
            }
        });
    }

    #[cold]
    fn register_slow(registered: &Registered) {
        static AT_FORK: Once = Once::new();
        AT_FORK.call_once(|| {
            // SAFETY: the three handlers are plain functions that live for the process.
            unsafe {
                libc::pthread_atfork(
                    Some(before_fork),
                    Some(after_fork_in_parent),
                    Some(after_fork_in_child),
                );
            }
        });
        let tid = crate::process::current_tid();
        let Ok(label_word) = WORD.try_with(|word| word as *const AtomicU64 as usize) else {
            return;
        };
        let Ok(poll_word) = POLLING.try_with(|word| word as *const AtomicU32 as usize) else {
            return;
        };
        let mut words = WORDS.lock().unwrap_or_else(PoisonError::into_inner);
        words
            .get_or_insert_with(HashMap::new)
            .insert(tid, (label_word, poll_word));
        registered.0.set((FORKS.load(Ordering::Relaxed), tid));
    }

    /// Takes the registry's lock across a `fork`, so that the child never inherits it
    /// held by a thread it does not have.
    extern "C" fn before_fork() {
        let guard = WORDS.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = HELD.try_with(|held| *held.borrow_mut() = Some(guard));
    }

    extern "C" fn after_fork_in_parent() {
        let _ = HELD.try_with(|held| held.borrow_mut().take());
    }

    /// The child has one thread: every other entry is of a thread it does not have.
    extern "C" fn after_fork_in_child() {
        let _ = HELD.try_with(|held| {
            if let Some(mut words) = held.borrow_mut().take() {
                *words = None;
            }
        });
        FORKS.fetch_add(1, Ordering::Relaxed);
    }

    /// The handles the label words of every registered thread name now, both halves:
    /// the sets the eBPF labels' pointers may name (`super::super::ebpf`), which the
    /// table's sweep must not free.
    #[cfg(feature = "ebpf-labels")]
    pub(crate) fn named_handles() -> Vec<u32> {
        let words = WORDS.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(words) = words.as_ref() else {
            return Vec::new();
        };
        let mut named = Vec::with_capacity(words.len());
        for &(label_word, _) in words.values() {
            // SAFETY: as in `words_of`: the entry is removed under this lock before its
            // thread's thread-locals are freed.
            let word = unsafe { (*(label_word as *const AtomicU64)).load(Ordering::Relaxed) };
            for half in [word as u32, (word >> 32) as u32] {
                if half != 0 {
                    named.push(half);
                }
            }
        }
        named
    }

    /// A thread's two words, as [`words_of`] read them.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct ThreadWords {
        /// Its label word: 0 where no labels are active.
        pub(crate) labels: u64,
        /// Whether it is inside a task's poll, by the task hooks (false without them).
        pub(crate) polling: bool,
    }

    /// The words of thread `tid` of this process now, if it ever set labels (or was
    /// polled under the task hooks) and lives. Another thread's words are read with a
    /// relaxed load each, under the lock its exit takes to remove them.
    pub(crate) fn words_of(tid: u32) -> Option<ThreadWords> {
        let words = WORDS.lock().unwrap_or_else(PoisonError::into_inner);
        let (label_word, poll_word) = *words.as_ref()?.get(&tid)?;
        // SAFETY: the addresses are of thread `tid`'s `WORD` and `POLLING`, registered by
        // that thread; its entry is removed (under this lock, held here) by a destructor
        // of a thread-local that runs before the thread's thread-locals are freed, so the
        // atomics live while they are loaded.
        let (labels, polling) = unsafe {
            (
                (*(label_word as *const AtomicU64)).load(Ordering::Relaxed),
                (*(poll_word as *const AtomicU32)).load(Ordering::Relaxed) > 0,
            )
        };
        Some(ThreadWords { labels, polling })
    }

    #[cfg(test)]
    mod tests {
        use super::words_of;

        fn word_of(tid: u32) -> Option<u64> {
            words_of(tid).map(|words| words.labels)
        }

        #[test]
        fn another_threads_word_is_read_while_it_lives_and_forgotten_when_it_exits() {
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                crate::labels::scope(&[("tenant", "acme")], || {
                    tid_tx.send(crate::process::current_tid()).unwrap();
                    go_rx.recv().unwrap();
                });
                done_tx.send(()).unwrap();
                // Outside its scope now, alive until told.
                let _ = go_rx.recv();
            });
            let tid = tid_rx.recv().unwrap();
            let inside = word_of(tid).expect("a thread that set labels is registered");
            assert_ne!(inside, 0, "its word inside the scope");
            go_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            assert_eq!(word_of(tid), Some(0), "its word after the scope");
            drop(go_tx);
            thread.join().unwrap();
            assert_eq!(word_of(tid), None, "a thread gone is forgotten");
        }
    }
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
    register();
    WORD.with(|word| {
        let old = word.load(Ordering::Relaxed);
        let new = old & !LOW | u64::from(handle);
        word.store(new, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        #[cfg(all(feature = "ebpf-labels", sampler))]
        super::ebpf::point_at(new);
        old
    })
}

/// Sets the span half; returns the whole word before, for [`restore`].
#[inline]
pub(crate) fn set_span(handle: Handle) -> u64 {
    register();
    WORD.with(|word| {
        let old = word.load(Ordering::Relaxed);
        let new = old & LOW | u64::from(handle) << 32;
        word.store(new, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        #[cfg(all(feature = "ebpf-labels", sampler))]
        super::ebpf::point_at(new);
        old
    })
}

/// Puts back the word [`set_user`] or [`set_span`] returned.
#[inline]
pub(crate) fn restore(old: u64) {
    compiler_fence(Ordering::SeqCst);
    WORD.with(|word| word.store(old, Ordering::Relaxed));
    #[cfg(all(feature = "ebpf-labels", sampler))]
    super::ebpf::point_at(old);
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
