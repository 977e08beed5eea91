//! A value the signal handler reads through a pointer that the drain may replace while a
//! session runs (the thread table when it is rebuilt, the unwinder when libraries come and
//! go): the old value is freed only once no CPU handler can still be reading it.

use std::sync::atomic::{AtomicPtr, Ordering};

use super::signals::Running;

pub(crate) struct Published<T> {
    current: AtomicPtr<T>,
}

impl<T> Published<T> {
    pub(crate) fn new(value: T) -> Published<T> {
        Published {
            current: AtomicPtr::new(Box::into_raw(Box::new(value))),
        }
    }

    /// The current value.
    ///
    /// # Safety
    /// The caller is a handler counted in the `running` that [`replace`](Self::replace) is
    /// given, or the one writer (the drain, under its lock), which alone replaces it; the
    /// reference is not kept past the handler's end or the writer's next `replace`.
    pub(crate) unsafe fn get(&self) -> &T {
        // SAFETY: the pointer is always a live `Box` (see `replace` and `drop`), and the
        // caller's contract keeps it from being freed while the reference is used.
        unsafe { &*self.current.load(Ordering::SeqCst) }
    }

    /// Publishes `value` and frees the old one once no handler counted in `running` can
    /// hold it (a handler that loaded the old pointer entered `running` first). For the
    /// one writer only; blocks for as long as a handler runs (microseconds; see
    /// [`Running::wait_until_none`] for a handler that never returns).
    pub(crate) fn replace(&self, value: T, running: &Running) {
        let old = self
            .current
            .swap(Box::into_raw(Box::new(value)), Ordering::SeqCst);
        if running.wait_until_none() {
            // SAFETY: `old` came from `Box::into_raw`, and no handler can reach it any more.
            drop(unsafe { Box::from_raw(old) });
        }
        // Else a handler never returned: `old` stays allocated, as it may still read it.
    }
}

impl<T> Drop for Published<T> {
    fn drop(&mut self) {
        // SAFETY: the last pointer published, a live `Box`; whoever drops the owner has
        // made sure no handler can reach it (the session was retired first).
        drop(unsafe { Box::from_raw(*self.current.get_mut()) });
    }
}

// SAFETY: the pointee is shared with handlers on other threads as `&T` and handed to the
// dropping thread by value.
unsafe impl<T: Send + Sync> Send for Published<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Published<T> {}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_replaced_value_is_freed_once_no_handler_runs_and_the_last_with_its_owner() {
        let running = Running::new();
        let (first, second) = (Arc::new(1), Arc::new(2));
        let published = Published::new(first.clone());
        published.replace(second.clone(), &running);
        // SAFETY: the one writer, reading what it published.
        assert_eq!(**unsafe { published.get() }, 2);
        assert_eq!(
            Arc::strong_count(&first),
            1,
            "no handler ran: the old one is freed"
        );
        assert_eq!(Arc::strong_count(&second), 2);
        drop(published);
        assert_eq!(Arc::strong_count(&second), 1, "freed with its owner");
    }
}
