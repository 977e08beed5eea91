//! jemalloc's own allocated counts, for a process whose `_RJEM_MALLOC_CONF` turns on
//! `prof_accum:true` and that has no table of this crate's (`alloc_stacks = 0`, or the
//! sample hook unavailable): the dump's brackets, unbiased like the in-use counts. Their
//! bytes never decrease, but jemalloc rounds the object counts it writes, so a stack's
//! `alloc_objects` can dip between two dumps, which Pyroscope reads as a reset (and drops
//! the profile). So each stack's counts are held at their highest yet, for up to
//! [`MAX_HELD`] stacks: jemalloc itself keeps every stack for the life of the process in
//! this mode, at about 50 times what is held here per stack.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::dump::HeapStack;

/// Stacks whose highest counts are held (16 bytes each, plus the map's own).
pub(super) const MAX_HELD: usize = 65_536;

/// Highest counts yet, by a hash of the stack's addresses.
static HIGHEST: Mutex<Option<HashMap<u64, (f64, f64)>>> = Mutex::new(None);

/// A stack's addresses, and its allocated objects and bytes.
pub(super) type Allocated = (Vec<u64>, f64, f64);

/// Each stack's allocated counts, never lower than an earlier answer gave, and the
/// profile's comment on the stacks beyond [`MAX_HELD`], given as the dump says (none
/// where there are none).
pub(super) fn cumulative(stacks: &[HeapStack]) -> (Vec<Allocated>, Option<String>) {
    let mut highest = HIGHEST.lock().unwrap_or_else(PoisonError::into_inner);
    let highest = highest.get_or_insert_with(HashMap::new);
    let mut beyond = 0;
    let counted = stacks
        .iter()
        .filter(|s| s.alloc_bytes > 0.0)
        .map(|s| {
            let key = hash(&s.addresses);
            let now = (s.alloc_objects, s.alloc_bytes);
            let full = highest.len() >= MAX_HELD;
            let (objects, bytes) = match highest.get_mut(&key) {
                Some(held) => {
                    *held = (held.0.max(now.0), held.1.max(now.1));
                    *held
                }
                None if !full => {
                    highest.insert(key, now);
                    now
                }
                None => {
                    beyond += 1;
                    now
                }
            };
            (s.addresses.clone(), objects, bytes)
        })
        .collect();
    let note = (beyond > 0).then(|| {
        format!(
            "{beyond} stacks beyond the {MAX_HELD} whose counts are held at their highest: \
             their alloc_objects may dip between two profiles"
        )
    });
    (counted, note)
}

fn hash(addresses: &[u64]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    addresses.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests share the process's held counts: one at a time, each from none.
    fn alone() -> std::sync::MutexGuard<'static, ()> {
        static ALONE: Mutex<()> = Mutex::new(());
        let guard = ALONE.lock().unwrap_or_else(PoisonError::into_inner);
        *HIGHEST.lock().unwrap() = None;
        guard
    }

    fn at(address: u64, objects: f64, bytes: f64) -> HeapStack {
        HeapStack {
            addresses: vec![address, 0xbeef],
            objects: 0.0,
            bytes: 0.0,
            alloc_objects: objects,
            alloc_bytes: bytes,
        }
    }

    #[test]
    fn each_stack_is_held_apart_and_stacks_that_allocated_nothing_are_left_out() {
        let _alone = alone();
        let (first, _) = cumulative(&[at(1, 100.0, 6400.0), at(2, 5.0, 320.0), at(3, 0.0, 0.0)]);
        assert_eq!(first.len(), 2, "no bytes, no sample: {first:?}");
        let (second, _) = cumulative(&[at(1, 100.0, 6400.0), at(2, 6.0, 384.0)]);
        let counts: Vec<(f64, f64)> = second.iter().map(|s| (s.1, s.2)).collect();
        assert_eq!(
            counts,
            [(100.0, 6400.0), (6.0, 384.0)],
            "each its own highest"
        );
    }

    #[test]
    fn past_the_cap_new_stacks_are_given_as_the_dump_says_and_counted() {
        let _alone = alone();
        let many: Vec<HeapStack> = (0..MAX_HELD as u64 + 3)
            .map(|i| at(0x1000 + i, 10.0, 640.0))
            .collect();
        let (counted, note) = cumulative(&many);
        assert_eq!(counted.len(), MAX_HELD + 3);
        assert_eq!(
            note.as_deref(),
            Some(
                "3 stacks beyond the 65536 whose counts are held at their highest: their \
                 alloc_objects may dip between two profiles"
            )
        );
        // A stack beyond the cap is not held: a lower count is given as it is.
        let last = MAX_HELD as u64 + 2;
        let (again, note) = cumulative(&[at(0x1000 + last, 9.0, 700.0), at(0x1000, 9.0, 700.0)]);
        assert!(note.unwrap().starts_with("1 stacks beyond"));
        assert_eq!(
            (again[0].1, again[1].1),
            (9.0, 10.0),
            "the held one stays at 10"
        );
        *HIGHEST.lock().unwrap() = None;
    }

    #[test]
    fn a_stacks_counts_never_go_down() {
        let _alone = alone();
        let stack = |objects: f64, bytes: f64| HeapStack {
            addresses: vec![0xdead, 0xbeef],
            objects: 0.0,
            bytes: 0.0,
            alloc_objects: objects,
            alloc_bytes: bytes,
        };
        let (first, _) = cumulative(&[stack(100.0, 6400.0)]);
        assert_eq!(first[0].1, 100.0);
        // jemalloc rounded the objects down while the bytes grew.
        let (second, note) = cumulative(&[stack(99.0, 6500.0)]);
        assert_eq!((second[0].1, second[0].2), (100.0, 6500.0));
        assert_eq!(note, None, "no stack beyond the cap: no comment");
        let (third, _) = cumulative(&[stack(120.0, 7000.0)]);
        assert_eq!((third[0].1, third[0].2), (120.0, 7000.0));
    }
}
