//! The labels where an eBPF profiler reads them (feature `ebpf-labels`): Polar Signals'
//! custom-labels ABI v1, which the OpenTelemetry eBPF profiler and parca-agent read
//! today. Two dynamic symbols of the executable, defined in C (`csrc/custom_labels.c`:
//! Rust cannot name a thread-local's symbol): `custom_labels_abi_version`, the constant
//! one, and the thread-local `custom_labels_current_set`, a pointer to the thread's
//! active label set as
//!
//! ```c
//! typedef struct { size_t len; const unsigned char *buf; } custom_labels_string_t;
//! typedef struct { custom_labels_string_t key, value; } custom_labels_label_t;
//! typedef struct { custom_labels_label_t *storage; size_t count, capacity; } custom_labels_labelset_t;
//! ```
//!
//! which the profiler reads while the thread is stopped, at a fixed offset from its
//! thread pointer. Each interned label set gets its published form once, when interned
//! (`table.rs`), and loses it when freed; the thread's word ([`current`](super::current))
//! points the thread-local at the set of its user half or of its span half, and where both
//! are set, at a copy of both's labels in a buffer of the thread's own (two, written
//! alternately, so that the one the pointer names is never being written). No lock, no
//! allocation but a thread's first merged set: a few loads and a store per word change.
//!
//! The application's executable must export the two symbols (a dependency cannot add
//! linker arguments to it); its build script says so, see the guide's labels page.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering, compiler_fence};
use std::sync::{Arc, OnceLock};

use super::table::{Handle, LabelSet};

unsafe extern "C" {
    /// The address of this thread's `custom_labels_current_set`.
    fn krabka_custom_labels_current_set() -> *mut *const LabelSetC;
    /// `custom_labels_abi_version`, read so that the linker keeps it.
    fn krabka_custom_labels_abi_version() -> u32;
}

/// `custom_labels_string_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct StringC {
    len: usize,
    buf: *const u8,
}

/// `custom_labels_label_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LabelC {
    key: StringC,
    value: StringC,
}

/// `custom_labels_labelset_t`.
#[repr(C)]
pub(crate) struct LabelSetC {
    storage: *const LabelC,
    count: usize,
    capacity: usize,
}

/// One interned set as the profiler reads it, with the strings it points into.
struct Published {
    set: LabelSetC,
    _labels: Box<[LabelC]>,
    _strings: Box<[(Arc<str>, Arc<str>)]>,
}

// SAFETY: the raw pointers point into `_labels` and `_strings`, which the value owns and
// never changes after it is built; it is read, never written, from other threads.
unsafe impl Send for Published {}
// SAFETY: as above.
unsafe impl Sync for Published {}

impl Published {
    fn of(set: &LabelSet) -> Box<Published> {
        let strings: Box<[(Arc<str>, Arc<str>)]> = set.pairs().into();
        let labels: Box<[LabelC]> = strings
            .iter()
            .map(|(key, value)| LabelC {
                key: text(key),
                value: text(value),
            })
            .collect();
        Box::new(Published {
            set: LabelSetC {
                storage: labels.as_ptr(),
                count: labels.len(),
                capacity: labels.len(),
            },
            _labels: labels,
            _strings: strings,
        })
    }
}

fn text(text: &str) -> StringC {
    StringC {
        len: text.len(),
        buf: text.as_ptr(),
    }
}

/// A slot of the table's: the handle published there and its set's published form.
struct Slot {
    handle: AtomicU32,
    set: AtomicPtr<Published>,
}

/// Slots per chunk of [`CHUNKS`].
const CHUNK: usize = 1024;
/// One per slot of the label table, in chunks allocated as the table's slots are first
/// used: a table of a few sets costs one chunk (16 KiB).
static CHUNKS: [OnceLock<Box<[Slot]>>; super::table::MAX_SLOTS.div_ceil(CHUNK)] =
    [const { OnceLock::new() }; super::table::MAX_SLOTS.div_ceil(CHUNK)];
/// The publishing table's base (`table.rs`: a handle's index is `(handle >> 8) - base`),
/// set by each publish.
static BASE: AtomicU32 = AtomicU32::new(0);

/// Slot `index`, its chunk allocated if `allocate` and not yet.
fn slot(index: u32, allocate: bool) -> Option<&'static Slot> {
    let index = index as usize;
    let chunk = CHUNKS.get(index / CHUNK)?;
    let slots = match chunk.get() {
        Some(slots) => slots,
        None if allocate => chunk.get_or_init(|| {
            // SAFETY: reading a constant the C half defines; the call keeps it linked in.
            let _ = unsafe { krabka_custom_labels_abi_version() };
            (0..CHUNK)
                .map(|_| Slot {
                    handle: AtomicU32::new(0),
                    set: AtomicPtr::new(std::ptr::null_mut()),
                })
                .collect()
        }),
        None => return None,
    };
    slots.get(index % CHUNK)
}

/// `set`, interned at slot `index` as `handle`, is published. Under the table's lock.
pub(crate) fn publish(index: u32, handle: Handle, set: &LabelSet) {
    let Some(slot) = slot(index, true) else {
        return;
    };
    // The base of the table that publishes, under its lock (two threads may each have
    // made a table at the process's start; the one kept publishes).
    BASE.store((handle >> 8).wrapping_sub(index), Ordering::Relaxed);
    let new = Box::into_raw(Published::of(set));
    slot.handle.store(handle, Ordering::Relaxed);
    let old = slot.set.swap(new, Ordering::Release);
    retire(old);
}

/// The published sets taken out of their slots, and when: a thread may have loaded one
/// a moment before (a handle on its way into its word), so each is freed only a second
/// later, at a later publish or unpublish (under the table's lock).
static RETIRED: std::sync::Mutex<Vec<(std::time::Instant, u32, usize)>> =
    std::sync::Mutex::new(Vec::new());

/// How long a published set taken out of its slot lives on.
const RETIRED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

fn retire(old: *mut Published) {
    let mut retired = RETIRED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = std::time::Instant::now();
    let pid = std::process::id();
    retired.retain(|&(at, owner, set)| {
        let due = now.duration_since(at) >= RETIRED_FOR;
        if due && owner == pid {
            // SAFETY: made by `Box::into_raw` in `publish`, out of its slot for a second:
            // no thread still holds it from a load (`point_at` takes nanoseconds).
            drop(unsafe { Box::from_raw(set as *mut Published) });
        }
        // One a parent process made (this is a child made by `fork`): its forking
        // thread's pointer may name it; never freed here.
        !due
    });
    if !old.is_null() {
        retired.push((now, pid, old as usize));
    }
}

/// The set at slot `index` is freed: no thread's word names it (`table.rs`'s sweep).
/// Under the table's lock.
pub(crate) fn unpublish(index: u32) {
    let Some(slot) = slot(index, false) else {
        return;
    };
    slot.handle.store(0, Ordering::Relaxed);
    let old = slot.set.swap(std::ptr::null_mut(), Ordering::AcqRel);
    retire(old);
}

/// The published form of `handle`'s set, if it has one.
fn published(handle: Handle) -> Option<&'static Published> {
    if handle == 0 {
        return None;
    }
    let index = (handle >> 8).checked_sub(BASE.load(Ordering::Relaxed))?;
    let slot = slot(index, false)?;
    if slot.handle.load(Ordering::Relaxed) != handle {
        return None;
    }
    let set = slot.set.load(Ordering::Acquire);
    // SAFETY: published and not freed: the calling thread's word names the handle, and
    // a set named by a word is not freed (`table.rs`).
    (!set.is_null()).then(|| unsafe { &*set })
}

/// The most labels of a merged set (user and span); more are left out.
const MERGED: usize = 32;

/// A thread's two buffers for merged sets, written alternately.
struct Merged {
    sets: [LabelSetC; 2],
    labels: [[LabelC; MERGED]; 2],
    next: usize,
}

impl Drop for Merged {
    /// The thread exits: its pointer must not name the buffers freed now.
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|current| {
            let slot = current.get();
            if !slot.is_null() {
                // SAFETY: this thread's own `custom_labels_current_set`.
                unsafe { slot.write_volatile(std::ptr::null()) };
                compiler_fence(Ordering::SeqCst);
            }
        });
    }
}

thread_local! {
    /// The address of this thread's `custom_labels_current_set` (found once).
    static CURRENT: Cell<*mut *const LabelSetC> = const { Cell::new(std::ptr::null_mut()) };
    /// The thread is exiting: it names no set from now on (its registry entry is gone, so
    /// the sweep no longer keeps the sets its word names).
    static EXITING: Cell<bool> = const { Cell::new(false) };
    static MERGED_SETS: RefCell<Option<Box<Merged>>> = const { RefCell::new(None) };
}

/// Points this thread's `custom_labels_current_set` at the labels of `word` (its user
/// half's set, its span half's, or both's).
pub(crate) fn point_at(word: u64) {
    let (user, span) = super::current::halves(word);
    let exiting = EXITING.try_with(Cell::get).unwrap_or(true);
    let target: *const LabelSetC = match (published(user), published(span)) {
        _ if exiting => std::ptr::null(),
        (None, None) => std::ptr::null(),
        (Some(one), None) | (None, Some(one)) => &one.set,
        (Some(user), Some(span)) => merged(user, span),
    };
    let _ = CURRENT.try_with(|current| {
        let mut slot = current.get();
        if slot.is_null() {
            // SAFETY: the C half returns the address of this thread's own variable.
            slot = unsafe { krabka_custom_labels_current_set() };
            current.set(slot);
        }
        compiler_fence(Ordering::SeqCst);
        // SAFETY: this thread's own `custom_labels_current_set`, written only here.
        unsafe { slot.write_volatile(target) };
        compiler_fence(Ordering::SeqCst);
    });
}

/// The thread exits (its registry entry is being removed): its pointer names nothing,
/// now and at any label change its last destructors make.
pub(crate) fn thread_exits() {
    let _ = EXITING.try_with(|exiting| exiting.set(true));
    point_at(0);
}

/// A set of `user`'s labels and then `span`'s, in the buffer of this thread's the
/// profiler is not reading; null where the thread is exiting.
fn merged(user: &Published, span: &Published) -> *const LabelSetC {
    MERGED_SETS
        .try_with(|buffers| {
            let mut buffers = buffers.borrow_mut();
            let buffers = buffers.get_or_insert_with(|| {
                let empty = LabelC {
                    key: StringC {
                        len: 0,
                        buf: std::ptr::null(),
                    },
                    value: StringC {
                        len: 0,
                        buf: std::ptr::null(),
                    },
                };
                Box::new(Merged {
                    sets: [
                        LabelSetC {
                            storage: std::ptr::null(),
                            count: 0,
                            capacity: 0,
                        },
                        LabelSetC {
                            storage: std::ptr::null(),
                            count: 0,
                            capacity: 0,
                        },
                    ],
                    labels: [[empty; MERGED]; 2],
                    next: 0,
                })
            });
            let at = buffers.next;
            buffers.next = 1 - at;
            // The user's labels, then the span's with other keys: a key both have keeps
            // the user's value, as the profiles' labels do.
            let mut count = 0;
            let spans_own = span
                ._strings
                .iter()
                .zip(span._labels.iter())
                .filter(|((key, _), _)| !user._strings.iter().any(|(user_key, _)| user_key == key));
            for label in user._labels.iter().chain(spans_own.map(|(_, label)| label)) {
                if count == MERGED {
                    break;
                }
                buffers.labels[at][count] = *label;
                count += 1;
            }
            buffers.sets[at] = LabelSetC {
                storage: buffers.labels[at].as_ptr(),
                count,
                capacity: MERGED,
            };
            &buffers.sets[at] as *const LabelSetC
        })
        .unwrap_or(std::ptr::null())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a profiler reads at `set`: its labels, as strings.
    fn read(set: *const LabelSetC) -> Vec<(String, String)> {
        if set.is_null() {
            return Vec::new();
        }
        // SAFETY: the tests read sets this module published and keeps alive.
        let set = unsafe { &*set };
        (0..set.count)
            .map(|at| {
                // SAFETY: `storage` holds `count` labels of valid strings.
                let label = unsafe { &*set.storage.add(at) };
                let string = |s: StringC| {
                    // SAFETY: as above.
                    let bytes = unsafe { std::slice::from_raw_parts(s.buf, s.len) };
                    String::from_utf8(bytes.to_vec()).unwrap()
                };
                (string(label.key), string(label.value))
            })
            .collect()
    }

    fn current() -> *const LabelSetC {
        // SAFETY: this thread's own variable.
        unsafe { *krabka_custom_labels_current_set() }
    }

    /// The thread's pointer follows its word: a user set, a span set, both merged (in
    /// alternating buffers, so the one read is never the one written), none.
    #[test]
    fn the_threads_pointer_names_its_words_labels() {
        let pairs = |pairs: &[(&str, &str)]| {
            LabelSet::of(pairs.iter().map(|(k, v)| (Arc::from(*k), Arc::from(*v))))
        };
        let (user, _user) = super::super::table::intern(pairs(&[("tenant", "acme")]), true);
        let (span, _span) = super::super::table::intern(pairs(&[("span_name", "checkout")]), false);
        point_at(u64::from(user));
        assert_eq!(read(current()), [("tenant".into(), "acme".into())]);
        point_at(u64::from(span) << 32);
        assert_eq!(read(current()), [("span_name".into(), "checkout".into())]);
        point_at(u64::from(span) << 32 | u64::from(user));
        let first = current();
        assert_eq!(
            read(first),
            [
                ("tenant".into(), "acme".into()),
                ("span_name".into(), "checkout".into())
            ]
        );
        point_at(u64::from(span) << 32 | u64::from(user));
        assert_ne!(current(), first, "the other buffer");
        assert_eq!(read(first).len(), 2, "the first is left as it was");
        // A key both have keeps the user's value, once.
        let (both, _both) = super::super::table::intern(
            pairs(&[("span_name", "checkout"), ("tenant", "from-span")]),
            false,
        );
        point_at(u64::from(both) << 32 | u64::from(user));
        assert_eq!(
            read(current()),
            [
                ("tenant".into(), "acme".into()),
                ("span_name".into(), "checkout".into())
            ]
        );
        point_at(0);
        assert!(current().is_null());
        // SAFETY: reading the constant.
        assert_eq!(unsafe { krabka_custom_labels_abi_version() }, 1);
    }
}
