//! [`scope`](super::scope)'s per-thread cache: the handle of a set of labels under the
//! outer set active, found without the process's table (its lock) and without touching a
//! shared counter. An entry holds its set alive; an entry in use by a scope that has not
//! ended is pinned, and is never evicted while it is.

use std::cell::RefCell;
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
    /// Scopes entered with this entry that have not ended.
    pins: u32,
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

struct Cache {
    entries: Box<[Option<Entry>]>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        entries: (0..ENTRIES).map(|_| None).collect(),
    });
}

/// A scope entered: puts the thread's word back and unpins its entry when dropped.
pub(crate) struct Entered {
    _restore: Restore,
    pinned: Option<usize>,
    /// The set, when no entry could hold it (every candidate pinned, or the thread is
    /// exiting).
    _held: Option<Arc<LabelSet>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(at) = self.pinned {
            // A thread's cache is gone only after its last scope ended.
            let _ = CACHE.try_with(|cache| {
                if let Some(entry) = cache.borrow_mut().entries[at].as_mut() {
                    entry.pins -= 1;
                }
            });
        }
    }
}

/// Enters a scope of `labels` over the thread's current user set.
pub(crate) fn enter(labels: &[(&str, &str)]) -> Entered {
    let outer = current::user();
    if labels.is_empty() {
        return Entered {
            _restore: Restore(current::set_user(outer)),
            pinned: None,
            _held: None,
        };
    }
    let hash = hash(outer, labels);
    let found = CACHE.try_with(|cache| {
        let mut cache = cache.borrow_mut();
        let start = hash as usize % ENTRIES;
        let slots = (0..PROBE).map(|i| (start + i) % ENTRIES);
        for at in slots.clone() {
            if let Some(entry) = cache.entries[at].as_mut()
                && entry.matches(hash, outer, labels)
            {
                entry.pins += 1;
                return Ok((entry.handle, at));
            }
        }
        let (handle, set) = intern(outer, labels);
        let Some(at) = slots
            .clone()
            .find(|&at| cache.entries[at].is_none())
            .or_else(|| {
                slots
                    .clone()
                    .find(|&at| cache.entries[at].as_ref().is_some_and(|e| e.pins == 0))
            })
        else {
            return Err((handle, set));
        };
        cache.entries[at] = Some(Entry {
            hash,
            outer,
            given: labels.iter().map(|&(k, v)| (k.into(), v.into())).collect(),
            handle,
            _set: set,
            pins: 1,
        });
        Ok((handle, at))
    });
    match found {
        Ok(Ok((handle, at))) => Entered {
            _restore: Restore(current::set_user(handle)),
            pinned: Some(at),
            _held: None,
        },
        Ok(Err((handle, set))) => Entered {
            _restore: Restore(current::set_user(handle)),
            pinned: None,
            _held: Some(set),
        },
        // The thread is exiting: no cache, the set is held by the scope itself.
        Err(_) => {
            let (handle, set) = intern(outer, labels);
            Entered {
                _restore: Restore(current::set_user(handle)),
                pinned: None,
                _held: Some(set),
            }
        }
    }
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
    fn a_pinned_entry_is_never_evicted() {
        // More scopes nested than a probe has entries, all hashing anywhere: each keeps
        // its set until it ends.
        let values: Vec<String> = (0..ENTRIES * 2).map(|i| i.to_string()).collect();
        fn nest(values: &[String], depth: usize) {
            let Some((value, rest)) = values.split_first() else {
                return;
            };
            let _scope = enter(&[("depth", value)]);
            let handle = current::user();
            nest(rest, depth + 1);
            assert_eq!(current::user(), handle);
            assert_eq!(
                table::set_of(handle).expect("alive").get("depth"),
                Some(value.as_str())
            );
        }
        nest(&values, 0);
        assert_eq!(current::user(), 0);
    }
}
