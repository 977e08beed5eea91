//! [`scope`](super::scope)'s per-thread cache: the handle of a set of labels under the
//! outer set active, found without the process's table (its lock) and without touching a
//! shared counter. An entry holds its set alive. While any scope is open on the thread,
//! no entry is evicted (a miss that finds no free entry is then not cached): an open
//! scope's handle, in the thread's word or saved by an inner scope, always names a set
//! its entry holds. So a hit touches the cache once, and the scope's end not at all.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::current::{self, Restore};
use super::keys;
use super::table::{self, Handle, LabelSet};

/// Entries per thread, direct-mapped with a short probe.
const ENTRIES: usize = 64;
const PROBE: usize = 4;

struct Entry {
    hash: u64,
    outer: Handle,
    /// The labels as given (before [`keys`] fixed them): what a hit is checked against.
    given: Box<[(Box<str>, Box<str>)]>,
    handle: Handle,
    _set: Arc<LabelSet>,
}

impl Entry {
    fn matches(&self, hash: u64, outer: Handle, labels: &[(&str, &str)]) -> bool {
        self.hash == hash
            && self.outer == outer
            && self.given.len() == labels.len()
            && self
                .given
                .iter()
                .zip(labels)
                .all(|((k, v), (key, value))| **k == **key && **v == **value)
    }
}

thread_local! {
    static CACHE: RefCell<Box<[Option<Entry>]>> =
        RefCell::new((0..ENTRIES).map(|_| None).collect());
    /// Scopes open on this thread (a `const` thread-local: no lazy state to check).
    static OPEN: Cell<u32> = const { Cell::new(0) };
}

/// A scope entered: puts the thread's word back when dropped.
pub(crate) struct Entered {
    _restore: Restore,
    /// The set, when no entry holds it (not cached, or the thread is exiting).
    _held: Option<Arc<LabelSet>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        OPEN.with(|open| open.set(open.get() - 1));
    }
}

/// Enters a scope of `labels` over the thread's current user set.
pub(crate) fn enter(labels: &[(&str, &str)]) -> Entered {
    let outer = current::user();
    let (handle, held) = if labels.is_empty() {
        (outer, None)
    } else {
        let hash = hash(outer, labels);
        CACHE
            .try_with(|cache| lookup(&mut cache.borrow_mut(), hash, outer, labels))
            // The thread is exiting: no cache, the set is held by the scope itself.
            .unwrap_or_else(|_| {
                let (handle, set) = intern(outer, labels);
                (handle, Some(set))
            })
    };
    OPEN.with(|open| open.set(open.get() + 1));
    Entered {
        _restore: Restore(current::set_user(handle)),
        _held: held,
    }
}

/// The handle of `labels` over `outer`: from the cache, or interned and cached; with the
/// set when the cache could not keep it.
fn lookup(
    entries: &mut [Option<Entry>],
    hash: u64,
    outer: Handle,
    labels: &[(&str, &str)],
) -> (Handle, Option<Arc<LabelSet>>) {
    let start = hash as usize % ENTRIES;
    let slots = (0..PROBE).map(|i| (start + i) % ENTRIES);
    for at in slots.clone() {
        if let Some(entry) = &entries[at]
            && entry.matches(hash, outer, labels)
        {
            return (entry.handle, None);
        }
    }
    let (handle, set) = intern(outer, labels);
    let evictable = OPEN.with(Cell::get) == 0;
    let free = slots
        .clone()
        .find(|&at| entries[at].is_none())
        .or_else(|| evictable.then_some(start));
    let Some(at) = free else {
        return (handle, Some(set));
    };
    entries[at] = Some(Entry {
        hash,
        outer,
        given: labels.iter().map(|&(k, v)| (k.into(), v.into())).collect(),
        handle,
        _set: set,
    });
    (handle, None)
}

/// The set of `labels` over the set `outer` names, interned in the process's table.
fn intern(outer: Handle, labels: &[(&str, &str)]) -> (Handle, Arc<LabelSet>) {
    let own = keys::set_of(labels);
    let set = match table::set_of(outer) {
        // Alive: the scope or future that put it in the word holds it.
        Some(outer) if outer.pairs().is_empty() => own,
        Some(outer) => outer.merged(&own),
        None => own,
    };
    table::intern(set, true)
}

/// A cheap hash of the outer handle and the labels: whole 8-byte words of each string
/// (a hit is checked by comparing the strings).
fn hash(outer: Handle, labels: &[(&str, &str)]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let mut h = mix(0, u64::from(outer));
    for (key, value) in labels {
        for s in [key.as_bytes(), value.as_bytes()] {
            h = mix(h, s.len() as u64);
            let mut chunks = s.chunks_exact(8);
            for chunk in &mut chunks {
                h = mix(h, u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
            }
            let mut tail = [0u8; 8];
            tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
            h = mix(h, u64::from_le_bytes(tail));
        }
    }
    h ^ h >> 29
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_is_the_same_handle_and_nesting_merges() {
        let outer = enter(&[("tenant", "cache-test"), ("job", "a")]);
        let first = current::user();
        assert_ne!(first, 0);
        {
            let _inner = enter(&[("job", "b")]);
            let inner = table::set_of(current::user()).expect("alive");
            assert_eq!(inner.get("job"), Some("b"), "the inner value wins");
            assert_eq!(inner.get("tenant"), Some("cache-test"));
        }
        assert_eq!(current::user(), first, "the inner scope put the word back");
        drop(outer);
        assert_eq!(current::user(), 0);
        let again = enter(&[("tenant", "cache-test"), ("job", "a")]);
        assert_eq!(current::user(), first, "the cached handle");
        drop(again);
    }

    #[test]
    fn an_open_scopes_set_is_never_evicted() {
        // More scopes nested than the cache has entries: each keeps its set until it ends.
        let values: Vec<String> = (0..ENTRIES * 2).map(|i| i.to_string()).collect();
        fn nest(values: &[String]) {
            let Some((value, rest)) = values.split_first() else {
                return;
            };
            let _scope = enter(&[("depth", value)]);
            let handle = current::user();
            nest(rest);
            assert_eq!(current::user(), handle);
            assert_eq!(
                table::set_of(handle).expect("alive").get("depth"),
                Some(value.as_str())
            );
        }
        nest(&values);
        assert_eq!(current::user(), 0);
    }
}
