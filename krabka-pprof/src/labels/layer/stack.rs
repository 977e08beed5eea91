//! The thread's stack of entered spans: for each, the span half of the label word it
//! replaced, so that its exit puts that back without asking the registry anything (an
//! exit is then a few thread-local loads and stores). The previous value belongs to the
//! thread, not to the span: one span may be entered on two threads at once.
//!
//! Each entry also keeps the span's id, so an exit out of order (guards dropped in
//! another order than taken) removes the right entry, and an exit of a span this thread
//! never entered changes nothing. The first [`INLINE`] entries are a `const`,
//! destructor-free thread-local; deeper ones go to a vector allocated on first need.

use std::cell::{Cell, RefCell};

use crate::labels::current;
use crate::labels::table::Handle;

/// Entries kept without allocating: deeper nesting than this is rare.
const INLINE: usize = 32;

/// `(span id, the span half of the word before that span was entered)`.
type Entry = (u64, Handle);

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static INLINE_ENTRIES: [Cell<Entry>; INLINE] = const { [const { Cell::new((0, 0)) }; INLINE] };
    static DEEPER: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

fn get(at: usize) -> Entry {
    if at < INLINE {
        INLINE_ENTRIES.with(|entries| entries[at].get())
    } else {
        DEEPER
            .try_with(|deeper| deeper.borrow().get(at - INLINE).copied())
            .ok()
            .flatten()
            .unwrap_or((0, 0))
    }
}

fn set(at: usize, entry: Entry) {
    if at < INLINE {
        INLINE_ENTRIES.with(|entries| entries[at].set(entry));
    } else {
        let _ = DEEPER.try_with(|deeper| {
            let mut deeper = deeper.borrow_mut();
            let at = at - INLINE;
            if at < deeper.len() {
                deeper[at] = entry;
            } else {
                deeper.push(entry);
            }
        });
    }
}

/// Shortens the stack from `depth` entries to `depth - 1`.
fn pop(depth: usize) {
    DEPTH.set(depth - 1);
    if depth > INLINE {
        let _ = DEEPER.try_with(|deeper| deeper.borrow_mut().truncate(depth - 1 - INLINE));
    }
}

/// Span `span` is entered on this thread: its set's `handle` becomes the span half of the
/// word, and the half it replaces is kept for [`exit`].
pub(crate) fn enter(span: u64, handle: Handle) {
    let (_, before) = current::halves(current::set_span(handle));
    let depth = DEPTH.get();
    set(depth, (span, before));
    DEPTH.set(depth + 1);
}

/// Span `span` is exited on this thread: the span half it replaced goes back. Out of
/// order (a span entered later is still entered), the word is left as it is (the later
/// span's) and that span's exit will put back what `span` replaced. A span this thread
/// did not enter changes nothing.
pub(crate) fn exit(span: u64) {
    let depth = DEPTH.get();
    if depth == 0 {
        return;
    }
    let (top, before) = get(depth - 1);
    if top == span {
        pop(depth);
        current::set_span(before);
        return;
    }
    let Some(at) = (0..depth - 1).rev().find(|&at| get(at).0 == span) else {
        return;
    };
    // The entry above inherits what this one replaced; the ones above shift down.
    let (_, replaced) = get(at);
    let (above, _) = get(at + 1);
    set(at, (above, replaced));
    for from in at + 2..depth {
        set(from - 1, get(from));
    }
    pop(depth);
}

/// Span `span`'s set changed (a field recorded) from `old` to `new` while this thread may
/// have it entered: where it is the innermost entered span the word takes `new`, and
/// spans entered inside it put back `new`, not `old`, when they exit.
pub(crate) fn replaced(span: u64, old: Handle, new: Handle) {
    let depth = DEPTH.get();
    for at in (0..depth).filter(|&at| get(at).0 == span) {
        if at + 1 == depth {
            let (_, now) = current::halves(current::word());
            if now == old {
                current::set_span(new);
            }
        } else {
            let (above, before) = get(at + 1);
            if before == old {
                set(at + 1, (above, new));
            }
        }
    }
}

/// Spans entered on this thread now, for tests.
#[cfg(test)]
pub(crate) fn depth() -> usize {
    DEPTH.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The span half of this thread's word now.
    fn span_half() -> Handle {
        current::halves(current::word()).1
    }

    /// A span exited again (a second `exit` through the dispatcher, say) changes nothing,
    /// though its entry is still there past the stack's top: popping an inline entry
    /// leaves its cell as it was, and the search for an out-of-order exit must not reach it.
    #[test]
    fn a_span_exited_again_changes_nothing_though_its_entry_is_still_past_the_top() {
        std::thread::spawn(|| {
            enter(1, 10);
            enter(2, 20);
            exit(2);
            assert_eq!((depth(), span_half()), (1, 10));
            exit(2);
            assert_eq!((depth(), span_half()), (1, 10), "span 2 is not entered");
            exit(1);
            assert_eq!((depth(), span_half()), (0, 0));
        })
        .join()
        .unwrap();
    }

    /// Nested deeper than the inline entries, exited once out of order inside the
    /// allocated ones and then in order: every exit puts back what its span replaced.
    #[test]
    fn spans_nested_past_the_inline_entries_exit_to_what_they_replaced() {
        std::thread::spawn(|| {
            let deepest = INLINE as u64 + 8;
            for span in 1..=deepest {
                enter(span, span as Handle * 10);
                assert_eq!(span_half(), span as Handle * 10);
            }
            assert_eq!(depth(), deepest as usize);
            // Out of order, among the allocated entries: the word stays the innermost's,
            // and the span entered just inside it inherits what it replaced.
            let gone = INLINE as u64 + 3;
            exit(gone);
            assert_eq!(span_half(), deepest as Handle * 10);
            assert_eq!(depth(), deepest as usize - 1);
            for span in (1..=deepest).rev().filter(|&s| s != gone) {
                exit(span);
                let expected = if span == gone + 1 { gone - 1 } else { span - 1 };
                assert_eq!(span_half(), expected as Handle * 10, "after span {span}");
            }
            assert_eq!(depth(), 0);
            // Deep again: the allocated entries are used afresh, not appended past stale ones.
            for span in 100..100 + deepest {
                enter(span, span as Handle);
            }
            for span in (100..100 + deepest).rev() {
                exit(span);
                assert_eq!(
                    span_half(),
                    if span == 100 { 0 } else { span as Handle - 1 }
                );
            }
        })
        .join()
        .unwrap();
    }
}
