//! The cumulative allocation counts: a fixed table of this crate's own, fed by jemalloc's
//! `experimental.hooks.prof_sample` hook, one call per sampled allocation, so `/allocs`
//! carries Go's `alloc_objects` and `alloc_space` without jemalloc's `prof_accum` (which
//! keeps every sampled stack of every thread for the life of the process). Installed
//! once, from the first router built with heap profiling and `alloc_stacks > 0`; read by
//! `heap.rs` when a profile is built. This file is the hook's safety contract.
//!
//! # What runs inside malloc, and why it is safe
//!
//! jemalloc 5.3.1 calls [`on_sample`] from `prof_malloc_sample_object`, on the thread that
//! allocated, for every sampled allocation (a sampled `realloc` too), after it has
//! recorded the sample and released its own profiling locks, with its reentrancy level
//! raised (an allocation meanwhile would be served unsampled, never recursing). The hook:
//!
//! 1. reads its arguments: `backtrace` is jemalloc's own copy of the stack (the one its
//!    dumps print on their `@` lines), `len` return addresses, valid during the call;
//!    `usize` is the usable size, which jemalloc's sampling counts;
//! 2. loads the table ([`TABLE`], Acquire), published before the hook was installed and
//!    never freed, so it is valid on every thread for as long as the hook can run;
//! 3. weighs the sample by `1 / p`, `p = 1 - e^(-usize / R)`, the chance that jemalloc
//!    samples an allocation of that size at the period `R` it had when the table was
//!    made: float arithmetic and `expm1` (jemalloc itself calls `log` on this path, and
//!    Rust binaries bind symbols at load, so nothing is resolved lazily);
//! 4. finds the stack's slot: a hash of its addresses, then at most [`MAX_PROBES`] slots
//!    from there; a slot whose published addresses are the same stack is its own; an
//!    empty slot is claimed with one compare-and-swap of its key, its addresses reserved
//!    in the frame pool by a compare-and-swap loop that never passes the pool's end,
//!    copied with relaxed stores and published by one release store of its `meta`;
//! 5. adds one sample, `1024 / p` and `usize / p` to the slot with relaxed `fetch_add`s;
//!    a stack with no room (no free slot within the probes, or no frames left in the
//!    pool) is added to the table's `overflow` counters instead, so totals stay right,
//!    never decrease, and say how much went uncounted by stack;
//! 6. calls the hook it replaced, if there was one (one slot, chained).
//!
//! Nothing in it allocates, locks, formats, logs, calls jemalloc or can block, and nothing
//! can panic: every index is checked (`get`), every integer operation wraps or
//! saturates, and a float that is not a finite positive weight counts as 1. It is
//! `extern "C"`, so a panic would abort the process rather than unwind into C. Counters
//! only grow, and a slot once published keeps its stack, so every reader
//! ([`Table::totals`], off the allocation path) sees each count never decrease.
//!
//! The table is allocated zeroed from the global allocator when the hook is installed
//! (so the heap profile shows its own cost, at `install`), is touched only as stacks
//! arrive, and is never freed: jemalloc has one hook slot and no way to tell whether a
//! call is still running. A child made by `fork` keeps its copy, and its counts begin
//! with its parent's (the profile's comments say so).

use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

use tikv_jemalloc_ctl::raw;

use super::jemalloc::serves_the_global_allocator;

/// Slots probed for a stack before it counts as having no room.
pub(super) const MAX_PROBES: usize = 64;
/// Frames the pool holds per slot, on average: stacks are as deep as jemalloc walks
/// (`prof_bt_max`, 128 by default), most server stacks 30 to 60.
pub(super) const FRAMES_PER_SLOT: usize = 64;
/// Fixed-point scale of the unbiased object counts (a sample of a small object stands for
/// thousands of objects; of a large one, for barely more than one).
const OBJECT_SCALE: f64 = 1024.0;
/// The jemalloc whose hook signature this file is written against: the 5-argument
/// `prof_sample_hook_t` (with `usize`) first shipped in 5.3.1, and the hooks are
/// experimental, so another version is not trusted to call it the same way.
const JEMALLOC_VERSION: &str = "5.3.1-";
const HOOK: &[u8] = b"experimental.hooks.prof_sample\0";

/// `meta`: published (its stack is readable, or it has none).
const READY: u64 = 1 << 63;
/// `meta`: claimed when the frame pool was full; its counts are reported as overflow.
const NO_FRAMES: u64 = 1 << 62;
const OFFSET_MASK: u64 = (1 << 30) - 1;

/// `prof_sample_hook_t` of jemalloc 5.3.1: `(ptr, size, backtrace, backtrace_length,
/// usize)`.
type SampleHook = unsafe extern "C" fn(*const c_void, usize, *mut *mut c_void, c_uint, usize);

/// One stack's counters. All zero is empty: the table is allocated zeroed.
struct Slot {
    /// The stack's hash (never 0), once claimed.
    key: AtomicU64,
    /// [`READY`], [`NO_FRAMES`], the frames' offset in the pool (bits 32..62) and their
    /// number (bits 0..32).
    meta: AtomicU64,
    counts: Counts,
}

/// Sampled allocations, and what they stand for, unbiased.
#[derive(Default)]
struct Counts {
    samples: AtomicU64,
    /// Unbiased objects times [`OBJECT_SCALE`].
    objects: AtomicU64,
    /// Unbiased bytes.
    bytes: AtomicU64,
}

impl Counts {
    fn add(&self, objects: u64, bytes: u64) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.objects.fetch_add(objects, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn read(&self) -> Tally {
        Tally {
            samples: self.samples.load(Ordering::Relaxed),
            objects: self.objects.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The counts as read: integers, so that a window's difference is exact and rounding a
/// cumulative count keeps it monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Tally {
    pub(super) samples: u64,
    objects: u64,
    pub(super) bytes: u64,
}

impl Tally {
    /// Unbiased objects.
    pub(super) fn objects(self) -> f64 {
        self.objects as f64 / OBJECT_SCALE
    }

    /// What was counted since `earlier` (a reading of the same counters, so never less).
    pub(super) fn since(self, earlier: Tally) -> Tally {
        Tally {
            samples: self.samples.saturating_sub(earlier.samples),
            objects: self.objects.saturating_sub(earlier.objects),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }

    fn plus(self, other: Tally) -> Tally {
        Tally {
            samples: self.samples.saturating_add(other.samples),
            objects: self.objects.saturating_add(other.objects),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }

    pub(super) fn is_zero(self) -> bool {
        self == Tally::default()
    }
}

/// The counts of the process, fixed in size when the hook is installed.
pub(super) struct Table {
    slots: &'static [Slot],
    frames: &'static [AtomicU64],
    next_frame: AtomicUsize,
    overflow: Counts,
    /// jemalloc's sample period `R` in bytes, as `f64` bits.
    period: AtomicU64,
    /// The hook this one replaced, called after it (0: none).
    previous: AtomicUsize,
    /// When the counts began.
    pub(super) since: SystemTime,
    /// The process that installed the hook (a child made by `fork` inherits the counts).
    pub(super) pid: u32,
}

/// The table, for the hook: null until installed, then never changed.
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());
/// The outcome of the one installation.
static INSTALLED: OnceLock<Result<&'static Table, String>> = OnceLock::new();

/// Installs the hook with a table of `stacks` slots, once per process; later calls (other
/// routers) find it as the first left it.
pub(super) fn install(stacks: u32) -> Result<&'static Table, &'static str> {
    INSTALLED
        .get_or_init(|| try_install(stacks as usize))
        .as_ref()
        .copied()
        .map_err(String::as_str)
}

fn try_install(stacks: usize) -> Result<&'static Table, String> {
    if !serves_the_global_allocator() {
        return Err("jemalloc is not this process's global allocator".to_owned());
    }
    // SAFETY: documented jemalloc controls of these types.
    let (prof, version, lg_sample) = unsafe {
        (
            raw::read::<bool>(b"opt.prof\0"),
            raw::read_str(b"version\0"),
            raw::read::<usize>(b"prof.lg_sample\0"),
        )
    };
    match prof {
        Ok(true) => {}
        Ok(false) => return Err("jemalloc's sampling is off (prof:false)".to_owned()),
        Err(_) => return Err("this jemalloc was built without profiling".to_owned()),
    }
    let version = version
        .map(|v| String::from_utf8_lossy(v).trim_end_matches('\0').to_owned())
        .unwrap_or_default();
    if !version.starts_with(JEMALLOC_VERSION) {
        return Err(format!(
            "jemalloc {version} is not 5.3.1, the version whose experimental sample hook this \
             crate is built against"
        ));
    }
    let lg_sample = lg_sample.map_err(|e| format!("reading prof.lg_sample failed: {e}"))?;
    // SAFETY: the hook's control holds a function pointer, pointer-sized; writing back the
    // value read proves the slot writable (jemalloc refuses writes with ENOENT when
    // profiling is off) before anything is allocated for it.
    let previous = unsafe { raw::read::<usize>(HOOK) }
        .and_then(|previous| unsafe { raw::update::<usize>(HOOK, previous) })
        .map_err(|e| format!("jemalloc refused its sample hook: {e}"))?;
    let table = Table::allocate(stacks, 2f64.powi(lg_sample.min(62) as i32))
        .ok_or("the allocation counts table could not be allocated")?;
    table.previous.store(previous, Ordering::Relaxed);
    TABLE.store(std::ptr::from_ref(table).cast_mut(), Ordering::Release);
    let hook: SampleHook = on_sample;
    // SAFETY: as above; `on_sample` has the hook's signature and upholds the contract at
    // the top of this file, and the table it reads is published (Release, above) and
    // never freed.
    let replaced = unsafe { raw::update::<usize>(HOOK, hook as usize) }
        .map_err(|e| format!("jemalloc refused its sample hook: {e}"))?;
    if replaced != previous {
        table.previous.store(replaced, Ordering::Relaxed);
    }
    Ok(table)
}

/// Zeroed memory for `n` values of `T`, never freed. `None` if it cannot be allocated.
///
/// # Safety
///
/// All-zero bytes must be a valid `T`.
unsafe fn zeroed_forever<T>(n: usize) -> Option<&'static [T]> {
    let layout = std::alloc::Layout::array::<T>(n.max(1)).ok()?;
    // SAFETY: the layout has a non-zero size.
    let memory = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if memory.is_null() {
        return None;
    }
    // SAFETY: `n` zeroed values of `T`, valid by the caller's promise, properly aligned
    // by the layout, and never freed, so the borrow may be 'static.
    Some(unsafe { std::slice::from_raw_parts(memory, n) })
}

impl Table {
    fn allocate(stacks: usize, period: f64) -> Option<&'static Table> {
        // SAFETY: a `Slot` is atomics only, and an all-zero atomic is a zero.
        let slots = unsafe { zeroed_forever::<Slot>(stacks) }?;
        // SAFETY: as above.
        let frames = unsafe { zeroed_forever::<AtomicU64>(stacks * FRAMES_PER_SLOT) }?;
        Some(Box::leak(Box::new(Table {
            slots,
            frames,
            next_frame: AtomicUsize::new(0),
            overflow: Counts::default(),
            period: AtomicU64::new(period.to_bits()),
            previous: AtomicUsize::new(0),
            since: SystemTime::now(),
            pid: std::process::id(),
        })))
    }

    /// How many stacks it holds at most.
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The sample period the weights use, in bytes.
    pub(super) fn period(&self) -> f64 {
        f64::from_bits(self.period.load(Ordering::Relaxed))
    }

    /// Follows jemalloc's period when a dump shows that it changed (`prof.reset` with a new
    /// `lg_sample`): samples taken since are weighed by it.
    pub(super) fn set_period(&self, period: f64) {
        if period.is_finite() && period > 0.0 {
            self.period.store(period.to_bits(), Ordering::Relaxed);
        }
    }

    /// Counts one sample of `frames` (the hook's work, steps 3 to 5 of the contract).
    fn count(&self, frames: &[*mut c_void], usable: usize) {
        let period = self.period();
        let probability = -(-(usable as f64) / period).exp_m1();
        let weight = 1.0 / probability;
        let weight = if weight.is_finite() && weight >= 1.0 {
            weight
        } else {
            1.0
        };
        // `as` saturates: a float beyond u64 (never, in practice) counts as u64::MAX.
        let objects = (weight * OBJECT_SCALE).round() as u64;
        let bytes = (usable as f64 * weight).round() as u64;
        match self.slot_of(frames) {
            Some(slot) => slot.counts.add(objects, bytes),
            None => self.overflow.add(objects, bytes),
        }
    }

    /// The slot of `frames`, claiming one if it has none; `None` if there is no room.
    fn slot_of(&self, frames: &[*mut c_void]) -> Option<&Slot> {
        let key = hash(frames);
        let capacity = self.slots.len();
        if capacity == 0 {
            return None;
        }
        let start = (key % capacity as u64) as usize;
        for probe in 0..MAX_PROBES.min(capacity) {
            let slot = self.slots.get((start + probe) % capacity)?;
            let mut found = slot.key.load(Ordering::Acquire);
            if found == 0 {
                match slot
                    .key
                    .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        self.publish(slot, frames);
                        return Some(slot);
                    }
                    // Another thread claimed it meantime, perhaps for this same stack:
                    // looked at as if it had been found claimed.
                    Err(other) => found = other,
                }
            }
            if found == key && self.holds(slot, frames) {
                return Some(slot);
            }
        }
        None
    }

    /// Whether `slot`, whose key is `frames`' hash, holds `frames`. A slot another thread
    /// is still publishing is taken to (the hashes of two stacks agree once in 2^64).
    fn holds(&self, slot: &Slot, frames: &[*mut c_void]) -> bool {
        let meta = slot.meta.load(Ordering::Acquire);
        if meta & READY == 0 || meta & NO_FRAMES != 0 {
            return true;
        }
        let (offset, len) = (((meta >> 32) & OFFSET_MASK) as usize, meta as u32 as usize);
        len == frames.len()
            && frames.iter().enumerate().all(|(i, frame)| {
                self.frames
                    .get(offset + i)
                    .is_some_and(|stored| stored.load(Ordering::Relaxed) == *frame as u64)
            })
    }

    /// Copies `frames` into the pool for a slot just claimed and publishes it.
    fn publish(&self, slot: &Slot, frames: &[*mut c_void]) {
        let len = frames.len();
        let mut offset = self.next_frame.load(Ordering::Relaxed);
        let reserved = loop {
            let end = offset.saturating_add(len);
            if end > self.frames.len() {
                break None;
            }
            match self.next_frame.compare_exchange_weak(
                offset,
                end,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break Some(offset),
                Err(now) => offset = now,
            }
        };
        let meta = match reserved {
            Some(offset) => {
                for (stored, frame) in self.frames.iter().skip(offset).zip(frames) {
                    stored.store(*frame as u64, Ordering::Relaxed);
                }
                READY | ((offset as u64 & OFFSET_MASK) << 32) | len as u32 as u64
            }
            None => READY | NO_FRAMES,
        };
        slot.meta.store(meta, Ordering::Release);
    }

    /// Every published slot's counts, by slot, and what was counted without a stack.
    pub(super) fn totals(&self) -> Totals {
        let mut slots = Vec::new();
        let mut overflow = self.overflow.read();
        for (index, slot) in self.slots.iter().enumerate() {
            let meta = slot.meta.load(Ordering::Acquire);
            if meta & READY == 0 {
                continue;
            }
            let counts = slot.counts.read();
            if meta & NO_FRAMES != 0 {
                overflow = overflow.plus(counts);
            } else {
                slots.push((index, counts));
            }
        }
        Totals { slots, overflow }
    }

    /// The stack of a slot [`totals`](Self::totals) listed, leaf first.
    pub(super) fn stack(&self, index: usize) -> Vec<u64> {
        let Some(slot) = self.slots.get(index) else {
            return Vec::new();
        };
        let meta = slot.meta.load(Ordering::Acquire);
        let (offset, len) = (((meta >> 32) & OFFSET_MASK) as usize, meta as u32 as usize);
        self.frames
            .iter()
            .skip(offset)
            .take(len)
            .map(|frame| frame.load(Ordering::Relaxed))
            .collect()
    }

    /// Frames of the pool in use, and its size.
    pub(super) fn frames_used(&self) -> (usize, usize) {
        (
            self.next_frame
                .load(Ordering::Relaxed)
                .min(self.frames.len()),
            self.frames.len(),
        )
    }
}

/// One reading of the table: `(slot, counts)` of each published slot with a stack, in
/// slot order, and the counts of the samples that had no room.
#[derive(Clone)]
pub(super) struct Totals {
    pub(super) slots: Vec<(usize, Tally)>,
    pub(super) overflow: Tally,
}

impl Totals {
    /// What was counted since `earlier`, slot by slot (slots never move).
    pub(super) fn since(&self, earlier: &Totals) -> Totals {
        let mut before = earlier.slots.iter().peekable();
        let slots = self
            .slots
            .iter()
            .map(|&(index, now)| {
                while before.next_if(|(i, _)| *i < index).is_some() {}
                let then = before
                    .next_if(|(i, _)| *i == index)
                    .map_or(Tally::default(), |(_, then)| *then);
                (index, now.since(then))
            })
            .filter(|(_, tally)| !tally.is_zero())
            .collect();
        Totals {
            slots,
            overflow: self.overflow.since(earlier.overflow),
        }
    }
}

/// FNV-1a over the addresses, then MurmurHash3's 64-bit finalizer, never 0 (0 marks an
/// empty slot). A stack starts its probes at `key % capacity`, the key's low bits: the
/// finalizer brings every address bit down to them (FNV's multiply carries a bit only
/// upwards, and addresses 16 bytes apart differ only above their fourth bit, which left
/// the start slots of such stacks bunched on a few residues).
fn hash(frames: &[*mut c_void]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for frame in frames {
        h = (h ^ *frame as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h.max(1)
}

/// jemalloc's sample hook: counts one sampled allocation (the contract atop this file).
///
/// # Safety
///
/// Called by jemalloc only, with `backtrace` pointing to `len` readable pointers for the
/// duration of the call (or null with `len` 0).
unsafe extern "C" fn on_sample(
    ptr: *const c_void,
    size: usize,
    backtrace: *mut *mut c_void,
    len: c_uint,
    usable: usize,
) {
    let table = TABLE.load(Ordering::Acquire);
    // SAFETY: null, or a table published before the hook was installed and never freed.
    let Some(table) = (unsafe { table.as_ref() }) else {
        return;
    };
    let frames: &[*mut c_void] = if backtrace.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: jemalloc's own backtrace, `len` pointers, valid during this call.
        unsafe { std::slice::from_raw_parts(backtrace, len as usize) }
    };
    table.count(frames, usable);
    let previous = table.previous.load(Ordering::Relaxed);
    if previous != 0 {
        // SAFETY: a value jemalloc held in this hook's slot, so a hook of this signature.
        let previous: SampleHook = unsafe { std::mem::transmute::<usize, SampleHook>(previous) };
        // SAFETY: called with the arguments jemalloc gave this one.
        unsafe { previous(ptr, size, backtrace, len, usable) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(addresses: &[usize]) -> Vec<*mut c_void> {
        addresses.iter().map(|a| *a as *mut c_void).collect()
    }

    fn table(stacks: usize) -> &'static Table {
        Table::allocate(stacks, 524_288.0).unwrap()
    }

    /// Distinct stacks get distinct keys, never 0, whose start slots spread evenly over a
    /// table, in its low bits as in its high ones: 20,000 stacks that differ in their
    /// leaf, in a caller, in their depth, all 16 bytes apart as code addresses are.
    #[test]
    fn distinct_stacks_get_distinct_keys_spread_over_the_slots() {
        let mut keys = std::collections::HashSet::new();
        for i in 0..5_000 {
            let varied = 0x5555_5555_0000 + i * 16;
            for frames in [
                stack(&[varied, 0x5555_6000_1008, 0x7f00_0000_2000]),
                stack(&[0x5555_6000_1008, varied, 0x7f00_0000_2000]),
                stack(&[0x5555_6000_1008, 0x7f00_0000_2000, varied]),
                stack(&[0x5555_6000_1008, varied]),
            ] {
                keys.insert(hash(&frames));
            }
        }
        assert_eq!(keys.len(), 20_000, "stacks that differ share a key");
        assert!(!keys.contains(&0));
        let capacity = 4096;
        let mut low = [0usize; 16];
        let mut high = [0usize; 4];
        for key in &keys {
            let start = (key % capacity) as usize;
            low[start % 16] += 1;
            high[start / 1024] += 1;
        }
        for (buckets, what) in [(&low[..], "residue mod 16"), (&high[..], "quarter")] {
            let share = keys.len() / buckets.len();
            for (bucket, &count) in buckets.iter().enumerate() {
                assert!(
                    count.abs_diff(share) < share * 15 / 100,
                    "{what} {bucket} starts {count} stacks, not about {share}: {buckets:?}"
                );
            }
        }
    }

    #[test]
    fn counts_are_unbiased_per_sample_and_grow_per_stack() {
        let table = table(64);
        let a = stack(&[0x10, 0x20, 0x30]);
        let b = stack(&[0x11, 0x20, 0x30]);
        for _ in 0..3 {
            table.count(&a, 65_536);
        }
        table.count(&b, 1 << 20);
        let totals = table.totals();
        assert_eq!(totals.slots.len(), 2);
        let by_stack: Vec<(Vec<u64>, Tally)> = totals
            .slots
            .iter()
            .map(|(i, t)| (table.stack(*i), *t))
            .collect();
        let (_, small) = by_stack.iter().find(|(s, _)| s[0] == 0x10).unwrap();
        let p = 1.0 - (-65_536.0f64 / 524_288.0).exp();
        assert_eq!(small.samples, 3);
        assert!((small.objects() - 3.0 / p).abs() < 0.01, "{small:?}");
        assert!((small.bytes as f64 - 3.0 * 65_536.0 / p).abs() < 2.0);
        let (frames, big) = by_stack.iter().find(|(s, _)| s[0] == 0x11).unwrap();
        assert_eq!(frames, &[0x11, 0x20, 0x30]);
        let p = 1.0 - (-2.0f64).exp();
        assert!((big.bytes as f64 - 1_048_576.0 / p).abs() < 1.0);
        assert!(totals.overflow.is_zero());
    }

    #[test]
    fn a_slot_whose_hash_agrees_holds_a_stack_only_if_its_frames_do() {
        let a = stack(&[0x10, 0x20]);
        // One slot, claimed by `a`, then given the hash of another stack, as when two
        // stacks' hashes agree: a stack of other frames, or of `a`'s first frame only,
        // is not `a`'s, and has no room left.
        for other in [stack(&[0x11, 0x20]), stack(&[0x10, 0x21]), stack(&[0x10])] {
            let table = table(1);
            table.count(&a, 4096);
            table.slots[0].key.store(hash(&other), Ordering::Release);
            table.count(&other, 4096);
            let totals = table.totals();
            assert_eq!(totals.overflow.samples, 1, "{other:?} counted as {a:?}");
            table.count(&a, 4096);
            assert_eq!(
                table.totals().overflow.samples,
                2,
                "the key is no longer a's"
            );
        }
        // A slot claimed by another thread that has yet to publish its frames is taken to
        // hold the stack (its frames cannot be compared yet).
        let table = table(1);
        table.slots[0].key.store(hash(&a), Ordering::Release);
        table.count(&a, 4096);
        assert_eq!(
            table.totals().overflow.samples,
            0,
            "counted in the claimed slot"
        );
        assert_eq!(table.slots[0].counts.read().samples, 1);
    }

    #[test]
    fn a_sample_of_no_bytes_weighs_one_object() {
        let table = table(4);
        table.count(&stack(&[0x10]), 0);
        let totals = table.totals();
        assert_eq!(totals.slots.len(), 1);
        let tally = totals.slots[0].1;
        assert_eq!((tally.samples, tally.objects(), tally.bytes), (1, 1.0, 0));
    }

    #[test]
    fn the_period_follows_jemalloc_and_ignores_what_is_no_period() {
        let table = table(4);
        assert_eq!(table.period(), 524_288.0);
        table.set_period(4096.0);
        assert_eq!(table.period(), 4096.0);
        for bad in [0.0, -4096.0, f64::NAN, f64::INFINITY] {
            table.set_period(bad);
            assert_eq!(table.period(), 4096.0, "{bad} taken as the period");
        }
    }

    #[test]
    fn a_full_table_counts_the_rest_as_overflow_and_never_loses_a_sample() {
        let table = table(64);
        for i in 0..200usize {
            table.count(&stack(&[0x1000 + i, 0x2000]), 4096);
        }
        let totals = table.totals();
        assert_eq!(
            table.capacity(),
            64,
            "the table says how many stacks it holds"
        );
        assert_eq!(totals.slots.len(), 64, "every slot used");
        let counted: u64 = totals.slots.iter().map(|(_, t)| t.samples).sum();
        assert_eq!(counted + totals.overflow.samples, 200);
        assert_eq!(totals.overflow.samples, 136);
    }

    #[test]
    fn stacks_beyond_the_frame_pool_are_overflow_too() {
        let table = table(64);
        let deep: Vec<usize> = (0..FRAMES_PER_SLOT * 40).collect();
        table.count(&stack(&deep), 4096);
        table.count(&stack(&deep[..FRAMES_PER_SLOT * 30]), 4096);
        let totals = table.totals();
        assert_eq!(totals.slots.len(), 1, "only the first fits");
        assert_eq!(table.stack(totals.slots[0].0).len(), FRAMES_PER_SLOT * 40);
        assert_eq!(totals.overflow.samples, 1);
        assert_eq!(table.frames_used().0, FRAMES_PER_SLOT * 40);
        // A stack that fills the pool to its last frame still fits.
        let rest: Vec<usize> = (1 << 20..).take(FRAMES_PER_SLOT * 24).collect();
        table.count(&stack(&rest), 4096);
        assert_eq!(
            table.totals().slots.len(),
            2,
            "the pool's last frames are used"
        );
        assert_eq!(table.frames_used().0, FRAMES_PER_SLOT * 64);
    }

    #[test]
    fn a_window_is_the_difference_of_two_readings() {
        let table = table(64);
        let (a, b) = (stack(&[1, 2]), stack(&[3, 4]));
        table.count(&a, 4096);
        let before = table.totals();
        table.count(&a, 4096);
        table.count(&b, 4096);
        table.count(&b, 4096);
        let window = table.totals().since(&before);
        let samples: Vec<(Vec<u64>, u64)> = window
            .slots
            .iter()
            .map(|(i, t)| (table.stack(*i), t.samples))
            .collect();
        assert_eq!(samples.len(), 2);
        assert!(samples.contains(&(vec![1, 2], 1)) && samples.contains(&(vec![3, 4], 2)));
        let nothing = table.totals().since(&table.totals());
        assert!(nothing.slots.is_empty() && nothing.overflow.is_zero());
    }

    /// `since` pairs two readings' slots by index: a slot only the later lists is counted
    /// whole, one only the earlier lists is passed over (no slot is ever emptied, but the
    /// pairing does not rely on it), and the slots after either still meet their own.
    #[test]
    fn readings_pair_their_slots_by_index_whatever_either_lists() {
        let tally = |samples| Tally {
            samples,
            objects: samples,
            bytes: samples * 8,
        };
        let earlier = Totals {
            slots: vec![(1, tally(1)), (3, tally(2)), (5, tally(4))],
            overflow: tally(1),
        };
        let later = Totals {
            slots: vec![(2, tally(5)), (5, tally(6)), (7, tally(3))],
            overflow: tally(3),
        };
        let since = later.since(&earlier);
        assert_eq!(since.slots, [(2, tally(5)), (5, tally(2)), (7, tally(3))]);
        assert_eq!(since.overflow, tally(2));
    }

    #[test]
    fn threads_counting_at_once_lose_nothing() {
        let table = table(256);
        std::thread::scope(|scope| {
            for t in 0..4usize {
                scope.spawn(move || {
                    for i in 0..10_000usize {
                        table.count(&stack(&[0x100 + i % 50, t % 2]), 8192);
                    }
                });
            }
        });
        let totals = table.totals();
        assert_eq!(totals.slots.len(), 100, "50 leaves on 2 callers");
        let samples: u64 = totals.slots.iter().map(|(_, t)| t.samples).sum();
        assert_eq!(samples + totals.overflow.samples, 40_000);
        assert_eq!(totals.overflow.samples, 0);
        for (index, _) in &totals.slots {
            assert_eq!(table.stack(*index).len(), 2);
        }
    }
}
