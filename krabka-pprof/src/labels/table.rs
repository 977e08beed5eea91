//! The process's label sets, interned off the signal path: a set gets a [`Handle`] (a
//! word the handler copies into a sample's record), and the drain turns handles back into
//! sets when it folds records. A set is freed only once no thread can still hold its
//! handle in its label word and every record that might carry it has been drained:
//! unused at one drain's sweep, freed at a later one (see [`sweep`]). A handle carries a
//! generation, so one that outlives its set resolves to nothing, never to another set.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::process::PerProcess;

/// `index << 8 | generation`; 0 is no set.
pub(crate) type Handle = u32;

/// The most label sets alive at once; past it, new sets are the one sentinel set that
/// says so. Values like request ids would make a set per request; this bounds what they
/// can cost. A span's set is its local root's own (it carries `span_id`), and a set lives
/// until the second drain after its last use (about 0.2 s while a profile runs): room for
/// some 300,000 traces a second, at about 200 bytes each (13 MB at the cap).
const MAX_SETS: usize = 64 * 1024;

/// The most slots the table has: one per set, slot 0 (no set) and the sentinel.
#[cfg_attr(not(all(feature = "ebpf-labels", sampler)), allow(dead_code))]
pub(crate) const MAX_SLOTS: usize = MAX_SETS + 2;

/// One label set: keys unique, sorted.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct LabelSet {
    pairs: Box<[(Arc<str>, Arc<str>)]>,
}

impl LabelSet {
    /// The set of `pairs`; a key given twice keeps its last value.
    pub(crate) fn of(pairs: impl IntoIterator<Item = (Arc<str>, Arc<str>)>) -> LabelSet {
        let mut map: Vec<(Arc<str>, Arc<str>)> = Vec::new();
        for (key, value) in pairs {
            match map.iter_mut().find(|(k, _)| *k == key) {
                Some(pair) => pair.1 = value,
                None => map.push((key, value)),
            }
        }
        map.sort_by(|a, b| a.0.cmp(&b.0));
        LabelSet {
            pairs: map.into_boxed_slice(),
        }
    }

    /// `self`'s pairs with `inner`'s over them: an inner value wins on the same key.
    pub(crate) fn merged(&self, inner: &LabelSet) -> LabelSet {
        LabelSet::of(self.pairs.iter().chain(inner.pairs.iter()).cloned())
    }

    pub(crate) fn pairs(&self) -> &[(Arc<str>, Arc<str>)] {
        &self.pairs
    }

    /// The value of `key`, if the set has it.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    fn bytes(&self) -> usize {
        self.pairs.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

struct Slot {
    generation: u8,
    set: Option<Arc<LabelSet>>,
    /// Interned by content (in `by_content`, which holds a second reference).
    shared: bool,
    /// The drain at whose sweep the set was first seen unused.
    unused_since: Option<u64>,
}

struct Table {
    /// Slot 0 is never used: handle 0 is no set.
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_content: HashMap<Arc<LabelSet>, u32>,
    /// Drains begun.
    drains: u64,
    /// A CPU session runs: records may hold handles not yet drained.
    collecting: bool,
    /// Interns since the last sweep without a session: such a sweep looks at every slot,
    /// so it runs once the interns since pay for it (amortised constant per intern).
    since_sweep: usize,
    live: usize,
    /// The set past [`MAX_SETS`], never freed.
    too_many: Option<(Handle, Arc<LabelSet>)>,
    /// The process's own table (not a test's): its sets are published where eBPF
    /// profilers read them (feature `ebpf-labels`).
    publishes: bool,
    /// What slot 0's index is in handles: drawn per process, so that a child made by
    /// `fork` (which starts a table of its own, see `PerProcess`) does not resolve the
    /// handles its parent's threads left in the forking thread's word to its own sets.
    base: u32,
}

static TABLE: PerProcess<Mutex<Table>> =
    PerProcess::new(|| Mutex::new(Table::new().the_processs()));

fn table() -> MutexGuard<'static, Table> {
    TABLE.get().lock().unwrap_or_else(PoisonError::into_inner)
}

impl Table {
    fn handle(&self, index: u32, generation: u8) -> Handle {
        (self.base + index) << 8 | Handle::from(generation)
    }
}

impl Table {
    /// The process's table: with the eBPF labels, it publishes its sets.
    fn the_processs(mut self) -> Table {
        self.publishes = true;
        self
    }

    fn new() -> Table {
        use std::hash::BuildHasher as _;
        let drawn = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        // Room above for MAX_SETS slots and the sentinel, in 24 bits.
        let base = (drawn % (1 << 23)) as u32;
        Table {
            publishes: false,
            base,
            slots: vec![Slot {
                generation: 0,
                set: None,
                shared: false,
                unused_since: None,
            }],
            free: Vec::new(),
            by_content: HashMap::new(),
            drains: 0,
            collecting: false,
            since_sweep: 0,
            live: 0,
            too_many: None,
        }
    }

    fn intern(&mut self, set: LabelSet, shared: bool) -> (Handle, Arc<LabelSet>) {
        if shared && let Some((content, &index)) = self.by_content.get_key_value(&set) {
            let slot = &self.slots[index as usize];
            return (self.handle(index, slot.generation), content.clone());
        }
        self.since_sweep += 1;
        if !self.collecting && (self.since_sweep >= self.live.max(64) || self.live >= MAX_SETS) {
            // No record can hold a handle: what is unused may go now.
            self.sweep(true);
        }
        if self.live >= MAX_SETS {
            return self.too_many();
        }
        let set = Arc::new(set);
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    set: None,
                    shared: false,
                    unused_since: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        if shared {
            self.by_content.insert(set.clone(), index);
        }
        self.live += 1;
        let slot = &mut self.slots[index as usize];
        slot.set = Some(set.clone());
        slot.shared = shared;
        slot.unused_since = None;
        let generation = slot.generation;
        let handle = self.handle(index, generation);
        #[cfg(all(feature = "ebpf-labels", sampler))]
        if self.publishes {
            super::ebpf::publish(index, handle, &set);
        }
        (handle, set)
    }

    fn too_many(&mut self) -> (Handle, Arc<LabelSet>) {
        if let Some(sentinel) = &self.too_many {
            return sentinel.clone();
        }
        let set = Arc::new(LabelSet::of([(
            Arc::from("labels"),
            Arc::from("[too many distinct label sets]"),
        )]));
        self.slots.push(Slot {
            generation: 0,
            set: Some(set.clone()),
            shared: false,
            unused_since: None,
        });
        let index = (self.slots.len() - 1) as u32;
        let sentinel = (self.handle(index, 0), set);
        #[cfg(all(feature = "ebpf-labels", sampler))]
        if self.publishes {
            super::ebpf::publish(index, sentinel.0, &sentinel.1);
        }
        self.too_many = Some(sentinel.clone());
        // Never freed: `live` does not count it, and the sweep never sees it unused (the
        // table keeps a second reference in `too_many`).
        sentinel
    }

    fn resolve(&self, handle: Handle) -> Option<Arc<LabelSet>> {
        let slot = self
            .slots
            .get((handle >> 8).checked_sub(self.base)? as usize)?;
        (slot.generation == handle as u8)
            .then(|| slot.set.clone())
            .flatten()
    }

    /// Frees the sets unused since an earlier drain (see [`sweep`]); with `at_once`, every
    /// unused set (no session runs, so no record can hold a handle).
    fn sweep(&mut self, at_once: bool) {
        self.since_sweep = 0;
        let drains = self.drains;
        let mut freed = Vec::new();
        // With the eBPF labels, a set some thread's word still names stays: its pointer
        // may name the set's published form (a span's set replaced by `on_record` while
        // other threads are in the span; a handle saved to be restored).
        #[cfg(all(feature = "ebpf-labels", sampler))]
        let named = if self.publishes {
            let mut named = super::current::named_handles();
            named.sort_unstable();
            named.dedup();
            named
        } else {
            Vec::new()
        };
        #[cfg(all(feature = "ebpf-labels", sampler))]
        let base = self.base;
        for (index, slot) in self.slots.iter_mut().enumerate().skip(1) {
            let Some(set) = &slot.set else {
                continue;
            };
            let held_by_table = 1 + usize::from(slot.shared);
            if Arc::strong_count(set) > held_by_table {
                slot.unused_since = None;
                continue;
            }
            #[cfg(all(feature = "ebpf-labels", sampler))]
            if named
                .binary_search(&((base + index as u32) << 8 | Handle::from(slot.generation)))
                .is_ok()
            {
                slot.unused_since = None;
                continue;
            }
            match slot.unused_since {
                Some(since) if at_once || since < drains => freed.push(index as u32),
                None if at_once => freed.push(index as u32),
                None => slot.unused_since = Some(drains),
                Some(_) => {}
            }
        }
        for index in freed {
            let slot = &mut self.slots[index as usize];
            if let Some(set) = slot.set.take()
                && slot.shared
            {
                self.by_content.remove(&*set);
            }
            slot.generation = slot.generation.wrapping_add(1);
            slot.unused_since = None;
            #[cfg(all(feature = "ebpf-labels", sampler))]
            if self.publishes {
                super::ebpf::unpublish(index);
            }
            self.free.push(index);
            self.live -= 1;
        }
    }

    fn usage(&self) -> (usize, usize) {
        let bytes = self
            .slots
            .iter()
            .filter_map(|slot| slot.set.as_ref())
            .map(|set| set.bytes())
            .sum();
        (self.live, bytes)
    }
}

/// The handle of `set`: the one it already has if `shared` and a set of the same labels
/// is alive (user sets, shared by every scope with those labels), else a new one (a
/// span's, unique to its trace). Returns the set the handle names, which the caller keeps
/// for as long as the handle may be in a thread's word.
pub(crate) fn intern(set: LabelSet, shared: bool) -> (Handle, Arc<LabelSet>) {
    table().intern(set, shared)
}

/// The set `handle` names, if it is alive.
pub(crate) fn set_of(handle: Handle) -> Option<Arc<LabelSet>> {
    table().resolve(handle)
}

/// The labels of one sample: the user's set (scopes, labelled futures) and a span's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct SampleLabels {
    pub(crate) user: Option<Interned>,
    pub(crate) span: Option<Interned>,
}

impl SampleLabels {
    /// The labels, the span's first; a key both sets have is the user's.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        let user = self.user.iter().flat_map(|set| set.0.pairs().iter());
        let span = self.span.iter().flat_map(|set| set.0.pairs().iter());
        span.filter(|(key, _)| {
            self.user
                .as_ref()
                .is_none_or(|user| user.0.get(key).is_none())
        })
        .chain(user)
        .map(|(k, v)| (&**k, &**v))
    }
}

/// Turns one drain's label words into the sets they name: the table's lock once per
/// distinct word.
#[derive(Default)]
pub(crate) struct Resolver {
    seen: HashMap<u64, SampleLabels>,
}

impl Resolver {
    pub(crate) fn resolve(&mut self, word: u64) -> SampleLabels {
        self.seen
            .entry(word)
            .or_insert_with(|| {
                let table = table();
                let (user, span) = (word as u32, (word >> 32) as u32);
                let set = |handle| (handle != 0).then(|| table.resolve(handle)).flatten();
                SampleLabels {
                    user: set(user).map(Interned),
                    span: set(span).map(Interned),
                }
            })
            .clone()
    }

    /// Forgets this drain's words (holding their sets would keep them alive).
    pub(crate) fn clear(&mut self) {
        self.seen.clear();
    }
}

/// A drain is about to swap the sample buffers: what it folds was written before now.
pub(crate) fn drain_begins() {
    table().drains += 1;
}

/// After a drain folded its records: frees the sets that were already unused at an earlier
/// drain's sweep. A set unused at sweep `g` cannot have been in any thread's word since
/// before drain `g + 1` began, and that drain folded every record written before it began
/// (the buffers' swap waits for late writers), so at sweep `g + 1` no record can hold its
/// handle.
pub(crate) fn sweep() {
    table().sweep(false);
}

/// A CPU session starts (records may now hold handles) or stops.
pub(crate) fn set_collecting(collecting: bool) {
    table().collecting = collecting;
}

/// Label sets alive, and the bytes of their keys and values.
pub(crate) fn usage() -> (usize, usize) {
    table().usage()
}

/// A label set by its pointer: what a sample's key holds, hashed and compared as one
/// interned value (equal sets share one `Arc` while alive).
#[derive(Clone, Debug)]
pub(crate) struct Interned(pub(crate) Arc<LabelSet>);

impl PartialEq for Interned {
    fn eq(&self, other: &Interned) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Interned {}

impl Hash for Interned {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> LabelSet {
        LabelSet::of(pairs.iter().map(|(k, v)| (Arc::from(*k), Arc::from(*v))))
    }

    #[test]
    fn equal_sets_share_a_handle_and_span_sets_do_not() {
        let mut table = Table::new();
        let (a, first) = table.intern(set(&[("tenant", "acme"), ("route", "/")]), true);
        let (b, second) = table.intern(set(&[("route", "/"), ("tenant", "acme")]), true);
        assert_eq!(a, b, "the same labels in another order");
        assert!(Arc::ptr_eq(&first, &second));
        let (c, _c) = table.intern(set(&[("span_id", "00000000000000ff")]), false);
        let (d, _d) = table.intern(set(&[("span_id", "00000000000000ff")]), false);
        assert_ne!(c, d, "a span's set is its own");
        assert_eq!(table.resolve(a).as_deref(), Some(&*first));
        // Three sets alive, of their keys' and values' bytes: 6 + 4 + 5 + 1, and twice
        // 7 + 16.
        assert_eq!(table.usage(), (3, 16 + 2 * 23));
    }

    #[test]
    fn an_inner_value_wins_and_a_key_given_twice_keeps_its_last() {
        let outer = set(&[("tenant", "acme"), ("route", "/a")]);
        let merged = outer.merged(&set(&[("route", "/b"), ("user", "7")]));
        assert_eq!(merged.get("route"), Some("/b"));
        assert_eq!(merged.get("tenant"), Some("acme"));
        assert_eq!(merged.get("user"), Some("7"));
        assert_eq!(set(&[("k", "1"), ("k", "2")]).get("k"), Some("2"));
    }

    #[test]
    fn a_set_is_freed_only_after_a_drain_that_began_after_it_was_last_used() {
        let mut table = Table::new();
        table.collecting = true;
        let (handle, held) = table.intern(set(&[("test", "freed-after-two-sweeps")]), true);
        let drain = |table: &mut Table| {
            table.drains += 1;
            table.sweep(false);
        };
        drain(&mut table);
        assert!(table.resolve(handle).is_some(), "in use");
        drop(held);
        // Records written before this drain may carry the handle: this sweep only notes
        // the set unused.
        drain(&mut table);
        assert!(
            table.resolve(handle).is_some(),
            "unused at this sweep, not yet freed"
        );
        // Another sweep in the same drain: still no drain began after the set's last use.
        table.sweep(false);
        assert!(table.resolve(handle).is_some(), "freed within one drain");
        drain(&mut table);
        assert!(
            table.resolve(handle).is_none(),
            "freed at the sweep after the next drain"
        );
        // The slot is used again under another generation: the old handle stays dead.
        let (again, _kept) = table.intern(set(&[("test", "another")]), false);
        assert_ne!(again, handle);
        assert_eq!(again >> 8, handle >> 8, "the same slot");
        assert!(table.resolve(handle).is_none());
        assert_eq!(table.usage().0, 1);
    }

    #[test]
    fn the_processs_table_frees_a_set_at_the_sweep_after_the_next_drain() {
        // The process's table, which the sampler's drains drive through `drain_begins`
        // and `sweep` (no other test's session runs meanwhile).
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (handle, held) = intern(set(&[("test", "the-process-table")]), false);
        assert!(set_of(handle).is_some(), "held");
        drop(held);
        sweep();
        drain_begins();
        sweep();
        assert!(
            set_of(handle).is_none(),
            "unused at a sweep, then a drain began and another sweep ran: freed"
        );
    }

    #[test]
    fn while_a_session_collects_no_set_is_freed_at_once() {
        // The process's table while a session runs (`set_collecting`, as the sampler
        // calls it): records written before a set went unused may still hold its
        // handle, so interning (which frees unused sets at once between sessions) must
        // leave it for the drains.
        let _one = crate::sampler::tests::ONE_SAMPLER
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        set_collecting(true);
        let (handle, held) = intern(set(&[("test", "in-a-record")]), false);
        drop(held);
        for i in 0..200 {
            drop(intern(set(&[("churn", &i.to_string())]), false));
        }
        let alive = set_of(handle).is_some();
        set_collecting(false);
        assert!(alive, "freed by an intern while a session collected");
        // Between sessions, interning frees it.
        for i in 0..200 {
            drop(intern(set(&[("churn", &i.to_string())]), false));
        }
        assert!(set_of(handle).is_none(), "kept after the session");
    }

    #[test]
    fn without_a_session_unused_sets_go_within_a_bounded_number_of_interns() {
        let mut table = Table::new();
        let (handle, held) = table.intern(set(&[("test", "idle")]), true);
        drop(held);
        for i in 0..64 {
            drop(table.intern(set(&[("test", &i.to_string())]), false));
            if i == 61 {
                // 63 interns: a sweep looks at every slot, so it waits for 64 to pay.
                assert!(
                    table.resolve(handle).is_some(),
                    "swept before the 64th intern"
                );
            }
        }
        assert!(table.resolve(handle).is_none(), "swept by the 64th intern");
        // A set per request, each dropped at once: the table stays small, whatever the count.
        let most = (0..10_000)
            .map(|i| {
                drop(table.intern(set(&[("request", &i.to_string())]), false));
                table.usage().0
            })
            .max();
        assert!(
            most.is_some_and(|most| most <= 65),
            "{most:?} sets alive at once"
        );
    }

    #[test]
    fn past_the_cap_new_sets_are_the_sentinel() {
        let mut table = Table::new();
        table.collecting = true;
        let kept: Vec<_> = (0..MAX_SETS)
            .map(|i| table.intern(set(&[("request", &i.to_string())]), true))
            .collect();
        let (sentinel, labels) = table.intern(set(&[("request", "one more")]), true);
        assert_eq!(labels.get("labels"), Some("[too many distinct label sets]"));
        assert_eq!(table.resolve(sentinel).as_deref(), Some(&*labels));
        assert_eq!(
            table.intern(set(&[("request", "and another")]), true).0,
            sentinel
        );
        drop(kept);
    }

    /// A drain's label word names a user set (low half) and a span's (high half); each
    /// resolves to the very set interned, compared and hashed by that set's identity.
    #[test]
    fn a_label_word_resolves_to_the_sets_its_halves_name() {
        let (user, user_set) = intern(set(&[("tenant", "resolver-test")]), true);
        let (span, span_set) = intern(set(&[("span_id", "00000000000000aa")]), false);
        let mut resolver = Resolver::default();
        let both = resolver.resolve(u64::from(span) << 32 | u64::from(user));
        assert!(Arc::ptr_eq(&both.user.as_ref().unwrap().0, &user_set));
        assert!(Arc::ptr_eq(&both.span.as_ref().unwrap().0, &span_set));
        assert_eq!(
            both.pairs().collect::<Vec<_>>(),
            [("span_id", "00000000000000aa"), ("tenant", "resolver-test")]
        );
        let user_only = resolver.resolve(u64::from(user));
        assert!(user_only.span.is_none());
        assert_eq!(resolver.resolve(0), SampleLabels::default());
        // By identity: an equal set interned apart is another label set.
        let (_, twin) = intern(set(&[("span_id", "00000000000000aa")]), false);
        assert_ne!(Interned(twin.clone()), Interned(span_set.clone()));
        assert_eq!(Interned(span_set.clone()), both.span.clone().unwrap());
        let distinct: std::collections::HashSet<Interned> = [
            Interned(twin),
            Interned(span_set.clone()),
            both.span.unwrap(),
        ]
        .into();
        assert_eq!(distinct.len(), 2);
        resolver.clear();
        assert!(resolver.seen.is_empty(), "a cleared resolver holds no set");
        // The process's table counts them, with their bytes, while they are held.
        let (sets, bytes) = usage();
        assert!(
            sets >= 3 && bytes >= 6 + 13 + 2 * 23,
            "{sets} sets, {bytes} bytes"
        );
        drop((user_set, span_set));
    }

    #[test]
    fn another_processs_handles_resolve_to_nothing() {
        let mut parent = Table::new();
        let mut child = Table::new();
        child.base = (parent.base + 100_000) % (1 << 23);
        let (inherited, _kept) = parent.intern(set(&[("tenant", "parent's")]), true);
        let (own, _own) = child.intern(set(&[("tenant", "child's")]), true);
        assert_ne!(own, inherited);
        assert!(child.resolve(inherited).is_none());
    }
}
