//! Windows of allocations where sampling is already on (`?seconds=N`, as Go's
//! `heap?seconds=N`): each holds a reading of the counts from its start, and its profile
//! is the difference at its end, `alloc_*` only; `inuse_*` are as at the end (Go also
//! subtracts those, which godeltaprof calls a bug). Readings are only read, so several
//! windows run at once, up to [`MAX_WINDOWS`]; one more gets 409. A window is a lease
//! owned by the request: a client that hangs up drops it, and nothing of it stays.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::dump::HeapStack;
use super::request::HeapError;

/// Windows of allocations open at once; each holds one reading of the counts (at most
/// 24 bytes per stack counted).
pub(super) const MAX_WINDOWS: usize = 8;

/// The ends of the open windows, by lease number.
static OPEN: Mutex<Vec<(u64, Instant)>> = Mutex::new(Vec::new());
static NEXT: Mutex<u64> = Mutex::new(0);

/// One open window; closed when dropped.
pub(super) struct DeltaLease {
    id: u64,
}

/// Opens a window of `length`, or says when the first open one ends.
pub(super) fn open(length: Duration) -> Result<DeltaLease, HeapError> {
    let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    if open.len() >= MAX_WINDOWS {
        let now = Instant::now();
        let first = open.iter().map(|(_, end)| *end).min().unwrap_or(now);
        return Err(HeapError::WindowsFull {
            max: MAX_WINDOWS,
            retry_after: first.saturating_duration_since(now),
        });
    }
    let id = {
        let mut next = NEXT.lock().unwrap_or_else(PoisonError::into_inner);
        *next += 1;
        *next
    };
    open.push((id, Instant::now() + length));
    Ok(DeltaLease { id })
}

impl Drop for DeltaLease {
    fn drop(&mut self) {
        OPEN.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _)| *id != self.id);
    }
}

/// What `prof_accum`'s brackets say was allocated since `earlier`, stack by stack
/// (matched by their addresses): never less than nothing, as jemalloc's rounding of its
/// object counts can make a stack's count go down by a little.
pub(super) fn brackets_since(
    now: &[HeapStack],
    earlier: &[HeapStack],
) -> Vec<(Vec<u64>, f64, f64)> {
    let before: HashMap<&[u64], (f64, f64)> = earlier
        .iter()
        .map(|s| (s.addresses.as_slice(), (s.alloc_objects, s.alloc_bytes)))
        .collect();
    now.iter()
        .filter_map(|s| {
            let (objects, bytes) = before
                .get(s.addresses.as_slice())
                .copied()
                .unwrap_or_default();
            let (objects, bytes) = (
                (s.alloc_objects - objects).max(0.0),
                (s.alloc_bytes - bytes).max(0.0),
            );
            (bytes > 0.0).then(|| (s.addresses.clone(), objects, bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The windows are the process's: one test at a time fills them.
    static WINDOWS: Mutex<()> = Mutex::new(());

    #[test]
    fn windows_beyond_the_most_are_refused_until_one_closes() {
        let _one = WINDOWS.lock().unwrap_or_else(PoisonError::into_inner);
        let leases: Vec<DeltaLease> = (0..MAX_WINDOWS)
            .map(|_| open(Duration::from_secs(3)).unwrap())
            .collect();
        match open(Duration::from_secs(3)) {
            Err(HeapError::WindowsFull { max, retry_after }) => {
                assert_eq!(max, MAX_WINDOWS);
                assert!(retry_after <= Duration::from_secs(3) && retry_after > Duration::ZERO);
            }
            _ => panic!("a ninth window must be refused"),
        }
        drop(leases);
        assert!(open(Duration::from_secs(1)).is_ok(), "closed on drop");
    }

    #[test]
    fn closing_one_window_frees_one_place_and_no_other() {
        let _one = WINDOWS.lock().unwrap_or_else(PoisonError::into_inner);
        let mut leases: Vec<DeltaLease> = (0..MAX_WINDOWS)
            .map(|_| open(Duration::from_secs(3)).unwrap())
            .collect();
        drop(leases.remove(3));
        leases.push(open(Duration::from_secs(3)).expect("the place the closed one left"));
        assert!(
            open(Duration::from_secs(3)).is_err(),
            "the other windows are still open"
        );
    }

    #[test]
    fn bracket_differences_never_go_below_zero() {
        let stack = |a: u64, objects: f64, bytes: f64| HeapStack {
            addresses: vec![a],
            objects: 0.0,
            bytes: 0.0,
            alloc_objects: objects,
            alloc_bytes: bytes,
        };
        let earlier = [stack(1, 10.0, 1000.0), stack(2, 5.0, 500.0)];
        let now = [
            stack(1, 9.5, 3000.0),
            stack(2, 5.0, 500.0),
            stack(3, 1.0, 64.0),
        ];
        let since = brackets_since(&now, &earlier);
        assert_eq!(since, [(vec![1], 0.0, 2000.0), (vec![3], 1.0, 64.0)]);
    }
}
