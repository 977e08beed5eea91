//! The recorder's stacks, each kept once however many slices count it: an id per
//! distinct (thread name, labels, stack), a count of the slices that hold it, and the stack freed when
//! the last of them is dropped. Slices hold ids, never stacks, so a stack sampled every
//! second for ten minutes costs its frames once. Also what they weigh, for the memory
//! bound.

use std::collections::HashMap;
use std::sync::Arc;

use crate::sampler::StackKey;

/// A stack as the recorder keeps it: by the name of its thread, not its id, since a
/// profile tells threads apart by name (`/recent` has no `thread_ids`) and thread ids
/// come and go with thread churn; `key.tid` is 0. Two are the same stack when their
/// labels say the same, whichever interned copy of the set they carry: the labels table
/// frees an unused set and interns the same labels again later as another.
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub(super) thread: Arc<str>,
    pub(super) key: StackKey,
}

impl PartialEq for Held {
    fn eq(&self, other: &Held) -> bool {
        self.thread == other.thread
            && self.key.flags == other.key.flags
            && self.key.frames == other.key.frames
            && self.key.labels.pairs().eq(other.key.labels.pairs())
    }
}

impl Eq for Held {}

impl std::hash::Hash for Held {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.thread.hash(state);
        self.key.flags.hash(state);
        self.key.frames.hash(state);
        for pair in self.key.labels.pairs() {
            pair.hash(state);
        }
    }
}

/// What one interned stack costs besides its frames, in bytes: the key and its `Arc`,
/// the map's entry and the slot's, and two allocations' headers.
const STACK_OVERHEAD: usize = 112;

/// Every stack some slice holds.
#[derive(Default)]
pub(super) struct Stacks {
    ids: HashMap<Arc<Held>, u32>,
    /// By id: the stack and how many slices hold it; `None` once freed.
    slots: Vec<Option<(Arc<Held>, u32)>>,
    free: Vec<u32>,
    bytes: usize,
}

impl Stacks {
    /// The id of `key` sampled on a thread named `thread`, held once more (by the slice
    /// being built).
    pub(super) fn hold(&mut self, thread: Arc<str>, key: StackKey) -> u32 {
        let key = Held {
            thread,
            key: StackKey { tid: 0, ..key },
        };
        if let Some(&id) = self.ids.get(&key) {
            if let Some((_, holders)) = &mut self.slots[id as usize] {
                *holders += 1;
            }
            return id;
        }
        self.bytes += weight(&key);
        let key = Arc::new(key);
        let slot = Some((key.clone(), 1));
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.ids.insert(key, id);
        id
    }

    /// One holder of `id` lets go; the stack is freed with the last.
    pub(super) fn release(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        match slot {
            Some((_, holders)) if *holders > 1 => {
                *holders -= 1;
                return;
            }
            Some(_) => {}
            None => return,
        }
        let Some((key, _)) = slot.take() else {
            return;
        };
        self.bytes -= weight(&key);
        self.ids.remove(&*key);
        self.free.push(id);
        // A burst of distinct stacks leaves the tables sized for it; once most of it is
        // gone, so is their memory.
        if self.ids.len() * 4 < self.ids.capacity() && self.ids.capacity() > 1024 {
            self.ids.shrink_to_fit();
        }
    }

    /// The stack `id` names, while some slice holds it.
    pub(super) fn key(&self, id: u32) -> Option<&Held> {
        self.slots.get(id as usize)?.as_ref().map(|(key, _)| &**key)
    }

    /// Distinct stacks held.
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// What the stacks weigh, in bytes: their frames and their overhead.
    pub(super) fn bytes(&self) -> usize {
        // The slots of freed stacks stay until reused.
        self.bytes + self.free.len() * size_of::<Option<(Arc<Held>, u32)>>()
    }
}

/// What one stack weighs, in bytes: its frames, its thread's name and its labels' text
/// (both counted with every stack that names them, though shared: the bound errs high).
fn weight(held: &Held) -> usize {
    STACK_OVERHEAD
        + held.key.frames.len() * size_of::<u64>()
        + held.thread.len()
        + held
            .key
            .labels
            .pairs()
            .map(|(key, value)| key.len() + value.len() + 32)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::table::SampleLabels;

    fn key(tid: u32, frames: &[u64]) -> StackKey {
        StackKey {
            tid,
            flags: 0,
            labels: SampleLabels::default(),
            frames: frames.to_vec().into_boxed_slice(),
        }
    }

    fn held(thread: &str, frames: &[u64]) -> Held {
        Held {
            thread: thread.into(),
            key: key(0, frames),
        }
    }

    #[test]
    fn a_stack_is_kept_once_and_freed_with_its_last_holder() {
        let mut stacks = Stacks::default();
        let a = stacks.hold("a".into(), key(1, &[0x10, 0x20]));
        let again = stacks.hold("a".into(), key(1, &[0x10, 0x20]));
        let same_name = stacks.hold("a".into(), key(7, &[0x10, 0x20]));
        let other_thread = stacks.hold("b".into(), key(2, &[0x10, 0x20]));
        assert_eq!(a, again, "the same (thread, stack), the same id");
        assert_eq!(
            a, same_name,
            "threads are told apart by name, as profiles do"
        );
        assert_ne!(a, other_thread, "stacks are per thread name");
        assert_eq!(stacks.len(), 2);
        let two = stacks.bytes();
        assert_eq!(two, 2 * (STACK_OVERHEAD + 16 + 1));
        stacks.release(a);
        stacks.release(a);
        assert_eq!(
            stacks.key(a),
            Some(&held("a", &[0x10, 0x20])),
            "one holder left"
        );
        stacks.release(a);
        assert_eq!(stacks.key(a), None, "freed with its last holder");
        assert_eq!(stacks.len(), 1);
        assert_eq!(
            stacks.bytes(),
            STACK_OVERHEAD + 16 + 1 + size_of::<Option<(Arc<Held>, u32)>>(),
            "the stack left, and the freed slot until it is reused"
        );
        // A freed id is reused, so the table does not grow with the stacks ever seen.
        let reused = stacks.hold("c".into(), key(3, &[0x30]));
        assert_eq!(reused, a);
        assert_eq!(stacks.slots.len(), 2);
        // Releasing an id nobody holds changes nothing.
        stacks.release(99);
        assert_eq!(stacks.len(), 2);
    }

    #[test]
    fn the_tables_shrink_once_a_burst_of_stacks_is_gone() {
        let mut stacks = Stacks::default();
        let ids: Vec<u32> = (0..10_000u64)
            .map(|i| stacks.hold("burst".into(), key(1, &[i])))
            .collect();
        let burst = stacks.ids.capacity();
        assert!(burst >= 10_000);
        for id in ids {
            stacks.release(id);
        }
        assert_eq!(stacks.len(), 0);
        assert!(
            stacks.ids.capacity() < burst / 4,
            "{} of {burst} kept",
            stacks.ids.capacity()
        );
    }

    #[test]
    fn the_tables_keep_their_size_while_a_quarter_is_in_use() {
        // Shrinking rehashes every stack held: not at each release while a quarter or more
        // of the table is in use, which would rehash again and again as a burst drains.
        // (Removals leave tombstones that lower `capacity()` a little: a rehash halves it.)
        let mut stacks = Stacks::default();
        let ids: Vec<u32> = (0..1500u64)
            .map(|i| stacks.hold("burst".into(), key(1, &[i])))
            .collect();
        let full = stacks.ids.capacity();
        assert!(full > 1024, "{full}");
        for id in ids {
            if stacks.len() <= full / 4 {
                break;
            }
            stacks.release(id);
            assert!(
                stacks.ids.capacity() > full / 2,
                "rehashed to {} with {} of {full} in use",
                stacks.ids.capacity(),
                stacks.len()
            );
        }
    }

    #[test]
    fn a_stack_weighs_its_frames_its_threads_name_and_its_labels_text() {
        use crate::labels::table::{Interned, LabelSet};
        let set = |pairs: &[(&str, &str)]| {
            Some(Interned(Arc::new(LabelSet::of(
                pairs.iter().map(|&(k, v)| (Arc::from(k), Arc::from(v))),
            ))))
        };
        let mut stacks = Stacks::default();
        let labelled = StackKey {
            labels: SampleLabels {
                user: set(&[("tenant", "acme"), ("job", "x")]),
                span: set(&[("span_name", "GET /")]),
            },
            ..key(1, &[0x10, 0x20, 0x30])
        };
        stacks.hold("worker-7".into(), labelled);
        assert_eq!(
            stacks.bytes(),
            STACK_OVERHEAD
                + 3 * 8
                + "worker-7".len()
                + ("tenant".len() + "acme".len() + 32)
                + ("job".len() + "x".len() + 32)
                + ("span_name".len() + "GET /".len() + 32)
        );
    }

    #[test]
    fn the_same_labels_interned_twice_are_one_stack() {
        use crate::labels::table::{Interned, LabelSet};
        let labelled = || StackKey {
            labels: SampleLabels {
                user: Some(Interned(Arc::new(LabelSet::of([(
                    Arc::from("tenant"),
                    Arc::from("acme"),
                )])))),
                span: None,
            },
            ..key(1, &[0x10])
        };
        let mut stacks = Stacks::default();
        let first = stacks.hold("w".into(), labelled());
        assert_eq!(stacks.hold("w".into(), labelled()), first);
        assert_ne!(
            stacks.hold("w".into(), key(1, &[0x10])),
            first,
            "unlabelled"
        );
        assert_eq!(stacks.len(), 2);
    }
}
