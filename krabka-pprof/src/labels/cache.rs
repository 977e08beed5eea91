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

#[cfg(test)]
thread_local! {
    /// Sets this thread interned through the cache: what a hit saves, counted for the tests.
    static INTERNED: Cell<u64> = const { Cell::new(0) };
}

/// The set of `labels` over the set `outer` names, interned in the process's table.
fn intern(outer: Handle, labels: &[(&str, &str)]) -> (Handle, Arc<LabelSet>) {
    #[cfg(test)]
    INTERNED.with(|n| n.set(n.get() + 1));
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
    // A multiply carries low bits up, never down: fold the high half in and mix once more,
    // or the slot (the low bits) would depend on a few bits of the last word alone.
    let h = (h ^ h >> 32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
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

    fn interned() -> u64 {
        INTERNED.with(Cell::get)
    }

    fn empty() -> Vec<Option<Entry>> {
        (0..ENTRIES).map(|_| None).collect()
    }

    #[test]
    fn a_repeated_scope_is_interned_once_per_outer_set() {
        let before = interned();
        let mut handles = Vec::new();
        for _ in 0..100 {
            let _scope = enter(&[("route", "/a"), ("tenant", "once")]);
            handles.push(current::user());
        }
        assert_eq!(interned() - before, 1, "one intern, 99 hits");
        assert!(handles.iter().all(|&h| h == handles[0]));
        // The same labels under another outer set are another entry, interned once too.
        let outer = enter(&[("job", "batch")]);
        let before = interned();
        let under: Vec<Handle> = (0..10)
            .map(|_| {
                let _scope = enter(&[("route", "/a"), ("tenant", "once")]);
                current::user()
            })
            .collect();
        assert_eq!(interned() - before, 1);
        assert_ne!(
            under[0], handles[0],
            "merged with the outer set: another set"
        );
        assert!(under.iter().all(|&h| h == under[0]));
        drop(outer);
    }

    #[test]
    fn a_hit_needs_the_same_hash_outer_and_labels() {
        let (handle, set) = intern(0, &[("a", "b")]);
        let entry = Entry {
            hash: 7,
            outer: 3,
            given: Box::new([("a".into(), "b".into())]),
            handle,
            _set: set,
        };
        assert!(entry.matches(7, 3, &[("a", "b")]));
        assert!(!entry.matches(8, 3, &[("a", "b")]), "another hash");
        assert!(!entry.matches(7, 4, &[("a", "b")]), "another outer set");
        assert!(!entry.matches(7, 3, &[("a", "c")]), "another value");
        assert!(!entry.matches(7, 3, &[("x", "b")]), "another key");
        assert!(
            !entry.matches(7, 3, &[("a", "b"), ("c", "d")]),
            "more labels"
        );
        assert!(!entry.matches(7, 3, &[]), "fewer labels");
    }

    #[test]
    fn colliding_sets_take_the_next_slots_and_evict_the_first_when_full() {
        assert_eq!(OPEN.with(Cell::get), 0);
        let mut entries = empty();
        let value = |i: usize| format!("p{i}");
        let hash = |i: usize| 5 + (i * ENTRIES) as u64;
        // PROBE sets whose hashes all start at slot 5: slots 5, 6, 7, 8, each cached.
        for i in 0..PROBE {
            let (_, held) = lookup(&mut entries, hash(i), 0, &[("k", &value(i))]);
            assert!(held.is_none(), "cached");
        }
        for i in 0..PROBE {
            let entry = entries[5 + i].as_ref().expect("filled");
            assert_eq!(entry.hash, hash(i));
        }
        assert_eq!(entries.iter().flatten().count(), PROBE);
        // Each found again without interning.
        let before = interned();
        for i in 0..PROBE {
            lookup(&mut entries, hash(i), 0, &[("k", &value(i))]);
        }
        assert_eq!(interned(), before);
        // One more: no free slot on its path, no scope open: it takes the first slot.
        let (_, held) = lookup(&mut entries, hash(PROBE), 0, &[("k", &value(PROBE))]);
        assert!(held.is_none());
        assert_eq!(entries[5].as_ref().unwrap().hash, hash(PROBE));
        let before = interned();
        lookup(&mut entries, hash(0), 0, &[("k", &value(0))]);
        assert_eq!(interned(), before + 1, "the evicted set is interned again");
        // A path that starts near the end wraps to the first slots.
        let mut entries = empty();
        for i in 0..PROBE {
            let at = ENTRIES - 2 + i * ENTRIES;
            lookup(&mut entries, at as u64, 0, &[("w", &value(i))]);
        }
        let filled: Vec<usize> = (0..ENTRIES).filter(|&at| entries[at].is_some()).collect();
        assert_eq!(filled, [0, 1, ENTRIES - 2, ENTRIES - 1]);
    }

    #[test]
    fn while_a_scope_is_open_a_full_path_is_not_cached() {
        let mut entries = empty();
        let hash = |i: usize| 9 + (i * ENTRIES) as u64;
        for i in 0..PROBE {
            lookup(&mut entries, hash(i), 0, &[("k", &i.to_string())]);
        }
        let open = enter(&[("open", "yes")]);
        let (handle, held) = lookup(&mut entries, hash(PROBE), 0, &[("k", "late")]);
        let held = held.expect("not cached: the scope holds the set");
        assert_eq!(table::set_of(handle).expect("alive").get("k"), Some("late"));
        assert_eq!(held.get("k"), Some("late"));
        assert_eq!(
            entries[9].as_ref().unwrap().hash,
            hash(0),
            "nothing evicted"
        );
        drop(open);
        assert_eq!(OPEN.with(Cell::get), 0, "the scope's end is counted");
        let (_, held) = lookup(&mut entries, hash(PROBE), 0, &[("k", "late")]);
        assert!(held.is_none(), "no scope open: cached, evicting");
        assert_eq!(entries[9].as_ref().unwrap().hash, hash(PROBE));
    }

    #[test]
    fn the_hash_spreads_sets_over_the_cache() {
        let mut per_slot = [0u32; ENTRIES];
        let sets = ENTRIES * 10;
        for i in 0..sets {
            let value = format!("tenant-number-{i}");
            per_slot[hash(0, &[("tenant", &value)]) as usize % ENTRIES] += 1;
        }
        let used = per_slot.iter().filter(|&&n| n > 0).count();
        let most = per_slot.iter().copied().max().unwrap();
        assert!(used >= ENTRIES * 7 / 8, "{used} of {ENTRIES} slots used");
        assert!(most <= 30, "{most} sets in one slot (10 on average)");
        // Where a string ends counts, and so does the outer set.
        assert_ne!(hash(0, &[("ab", "c")]), hash(0, &[("a", "bc")]));
        assert_ne!(hash(0, &[("k", "v")]), hash(1, &[("k", "v")]));
    }
}
