//! The CPU sampler: per-thread CPU-time timers ([`timers`](super::timers)) that send
//! `SIGPROF`, a signal handler that unwinds the interrupted thread and writes its stack
//! into a pre-allocated buffer, and a drain that aggregates stacks off the signal path.
//!
//! # What runs in the signal handler, and why it is safe
//!
//! Each thread's timer signals that thread once per `1/frequency` seconds of its own CPU
//! time; a process-wide backstop timer covers threads too short-lived to get one. The
//! handler ([`on_sigprof`]):
//!
//! 1. saves `errno`, and registers itself in an atomic counter of running handlers;
//! 2. hands a thread dump's signal (`SI_QUEUE`, a dump's tag in its value) to the dump
//!    ([`dump`]: the thread unwinds itself into its reply slot) and returns: a dump never
//!    becomes a sample or a foreign signal, whether or not a session runs;
//! 3. loads the session pointer (null when no profile runs: it returns at once);
//! 4. keeps only this session's own timer signals: `si_code == SI_TIMER` and a signal
//!    value carrying the session's number (`kill -PROF`, `raise`, another profiler's
//!    timer and a finished session's late signals are counted as foreign and dropped);
//!    a backstop signal is dropped on a thread that has a timer of its own;
//! 5. weighs the sample by `1 + si_overrun`: the periods the timer could not signal
//!    (it fires at most once per kernel tick) are CPU time this sample stands for;
//! 6. takes a scratch slot with a compare-and-swap (no lock; if every slot is in use by
//!    handlers on other threads, it records the interrupted PC alone, marked as such);
//! 7. reads the registers from the `ucontext` the kernel passed;
//! 8. unwinds with [framehop](https://docs.rs/framehop) with fixed storage (no allocation),
//!    from unwind tables (`.eh_frame_hdr`/`.eh_frame`) located in memory before the timers
//!    started, of objects that cannot be unmapped while the session lives (the executable,
//!    the vDSO, and libraries pinned with `dlopen(RTLD_NOLOAD)` and confirmed by `dlinfo`
//!    to be the copy listed); framehop takes no locks and does not allocate in this mode;
//! 9. reads the stack in one of two ways that cannot fault: with plain loads, only from
//!    the thread's current stack pointer up to the end of a range of its stack already
//!    proven readable ([`Threads`]: memory between a live thread's stack pointer and its
//!    stack's top stays mapped); anywhere else, only through a copy made by a system call
//!    ([`Memory`]: `process_vm_readv`, or `pread` of `/proc/self/mem` where a seccomp
//!    filter is installed) that fails instead of faulting. A wrong unwind rule can at
//!    worst end the stack early, never crash the process;
//! 10. reserves space in the active buffer with one `fetch_add` and writes the record with
//!     plain atomic stores; if the buffer is full, it counts a lost sample;
//! 11. restores `errno`.
//!
//! Nothing in the handler allocates, locks, formats, logs or can block (a dump's handler
//! may wait for a scratch slot, never past the dump's deadline): it uses atomics,
//! memory owned by the session, and the async-signal-safe `process_vm_readv`, `pread`,
//! `gettid` and `clock_gettime` calls. Its frames and stack copy live in the slot, and
//! framehop's unwind storage is sized to real tables ([`FixedStorage`]), so it uses about
//! 3 KiB of the interrupted thread's stack besides the kernel's signal frame, whatever the
//! stack's depth (measured by a test).
//!
//! Off the signal path, a drain (called about every 100 ms while a window is open, and
//! when one opens or closes) gives new threads their timers, swaps the two buffers, waits
//! for handlers still writing to the old one, and folds its records into each open
//! window's map from stack to count and weight. A window opened or closed at a swap gets
//! exactly the records written while it was open. Memory is therefore bounded by the
//! buffer size and the distinct stacks of the open windows, not by their length.
//!
//! Stopping deletes the timers, clears the session pointer, waits until no handler is
//! running, and only then frees the session. The handler stays installed between
//! profiles (it returns at once when no session exists), so a late `SIGPROF` can never
//! meet the default action, which would kill the process. Nothing survives `execve`
//! (POSIX timers are deleted by it) or `fork` (they are not inherited, and a fork handler
//! clears the child's copy of the session so that the child can profile itself).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use framehop::{
    AllocationPolicy, CacheNative, ExplicitModuleSectionInfo, Module, UnwindRegsNative,
    Unwinder as _, UnwinderNative,
};

mod dump;

pub(crate) use dump::{MAX_DUMP_THREADS, Stack, Taken, take as take_dump};

use super::memory::{MAX_PAGES, Memory, PAGE};
use super::threads::{Thread, Threads};
use super::timers::{KIND_BACKSTOP, KIND_THREAD, ThreadCpu, Timers, signal_kind};
use crate::objects::{LoadedObject, Objects};

/// Deepest stack recorded, in frames; a deeper one ends in a `[truncated]` frame.
pub(crate) const MAX_DEPTH: usize = 128;
/// How far above the stack pointer the handler may copy the stack.
const MAX_STACK_COPY: usize = 256 * 1024;
/// How often the caller should [`Sampler::drain`] while a profile runs.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// Threads that can have a timer of their own in one session.
const MAX_THREADS: usize = 4096;

/// Record: a header word `MAGIC << 56 | flags << 48 | depth << 32 | tid`, a weight word
/// (timer periods the sample stands for), then the frames.
const MAGIC: u64 = 0xA5;
const RECORD_HEADER: usize = 2;
/// The interrupted PC was in a blocklisted library: not unwound.
pub(crate) const FLAG_BLOCKLISTED: u8 = 1;
/// Every scratch slot was busy on other threads: not unwound.
pub(crate) const FLAG_NO_SCRATCH: u8 = 2;
/// The stack could not be read (no reader works here): not unwound.
pub(crate) const FLAG_NO_STACK_READ: u8 = 4;
/// The stack is deeper than [`MAX_DEPTH`]: its outermost frames are missing.
pub(crate) const FLAG_TRUNCATED: u8 = 8;

/// A stack as recorded: the interrupted PC first, then return addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StackKey {
    pub(crate) tid: u32,
    pub(crate) flags: u8,
    pub(crate) frames: Box<[u64]>,
}

/// How often a stack was sampled, and how many timer periods those samples stand for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) samples: u64,
    pub(crate) periods: u64,
}

/// What one window of a session collected.
pub(crate) struct Collected {
    pub(crate) stacks: HashMap<StackKey, Tally>,
    /// Samples dropped because the buffer was full.
    pub(crate) lost: Tally,
    pub(crate) started: SystemTime,
    pub(crate) duration: Duration,
    /// CPU time the whole process used during the window (user + system).
    pub(crate) cpu_time: Duration,
    pub(crate) frequency: u32,
    pub(crate) objects: Objects,
    /// Each tracked thread's CPU over the window, from its own clock.
    pub(crate) threads: Vec<ThreadCpu>,
    pub(crate) report: Report,
}

/// How the session went, for the response's log line and the profile's comments.
#[derive(Clone, Debug, Default)]
pub(crate) struct Report {
    /// The stack reader, and why it was chosen.
    pub(crate) reader: &'static str,
    pub(crate) reader_why: String,
    /// `SIGPROF`s that were not this session's (another sender, a late timer).
    pub(crate) foreign_signals: u64,
    /// Our handler was replaced by someone else's during the window; counting stopped.
    pub(crate) handler_replaced: bool,
    /// Threads that had a timer of their own.
    pub(crate) threads_timed: usize,
    /// Why some threads had none.
    pub(crate) timer_shortfall: Option<String>,
    /// Handler time per sample: median and 99th percentile, nanoseconds.
    pub(crate) handler_nanos: (u64, u64),
    /// Mean frames per unwound sample.
    pub(crate) mean_depth: f64,
    /// Unwound samples: read without a system call, and unwound to the outermost frame.
    pub(crate) unwound: u64,
    pub(crate) direct: u64,
    pub(crate) complete: u64,
}

/// Why sampling could not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Another session is running in this process (another router, or a bug).
    Running,
    /// Another `SIGPROF` handler is installed (another profiler in this process).
    ForeignHandler,
    /// A system call failed.
    System(&'static str, std::io::Error),
}

/// Bytes of a loaded object's memory, for framehop.
#[derive(Clone, Copy)]
struct MemorySlice {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the slices point into read-only segments of objects that stay mapped while the
// session uses them: the executable, the vDSO, and libraries the session pinned.
unsafe impl Send for MemorySlice {}
// SAFETY: as above; the bytes are never written.
unsafe impl Sync for MemorySlice {}

impl Default for MemorySlice {
    fn default() -> MemorySlice {
        MemorySlice {
            ptr: std::ptr::NonNull::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl Deref for MemorySlice {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: see the `Send` impl.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

type Unwinder = UnwinderNative<MemorySlice, FixedStorage>;
type Cache = CacheNative<FixedStorage>;

/// framehop's allocation-free unwinding, with storage sized for what unwind tables use.
///
/// framehop's own `MustNotAllocateDuringUnwind` gives gimli room for 192 register rules
/// per row; gimli moves rows by value while it evaluates, so the handler then used about
/// 17 KiB of the interrupted thread's stack, more than a thread near its limit has. Real
/// tables name at most the 17 integer registers of x86_64 (or 33 of aarch64) and a few
/// vector ones; a table that needs more fails to unwind (the stack ends early), never
/// overruns.
struct FixedStorage;

impl<R: gimli::ReaderOffset> gimli::UnwindContextStorage<R> for FixedStorage {
    type Rules = [(gimli::Register, gimli::RegisterRule<R>); 24];
    type Stack = [gimli::UnwindTableRow<R, Self>; 4];
}

impl<R: gimli::Reader> gimli::EvaluationStorage<R> for FixedStorage {
    type Stack = [gimli::Value; 16];
    type ExpressionStack = [(R, R); 4];
    type Result = [gimli::Piece<R>; 1];
}

impl AllocationPolicy for FixedStorage {
    type GimliUnwindContextStorage<R: gimli::ReaderOffset> = FixedStorage;
    type GimliEvaluationStorage<R: gimli::Reader> = FixedStorage;
}

/// One handler's working memory: kept off the interrupted thread's stack, which may have
/// little room left.
struct Scratch {
    cache: Cache,
    stack: FreshPages,
    frames: [u64; MAX_DEPTH],
}

/// Zeroed memory mapped straight from the kernel: its pages become resident only when
/// written. (`calloc` of the same size may reuse freed heap memory and zero it all, making
/// every page resident: a stack copy is sized for the deepest stack, but a typical one
/// uses a few pages of it.)
struct FreshPages {
    start: *mut u8,
    len: usize,
}

impl FreshPages {
    fn new(len: usize) -> FreshPages {
        // SAFETY: an anonymous private mapping; the result is checked.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            start != libc::MAP_FAILED,
            "mmap of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        );
        FreshPages {
            start: start.cast(),
            len,
        }
    }
}

impl Deref for FreshPages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }
}

impl std::ops::DerefMut for FreshPages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, writable, and borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
    }
}

impl Drop for FreshPages {
    fn drop(&mut self) {
        // SAFETY: the mapping came from `mmap` in `new` and is unmapped once.
        unsafe { libc::munmap(self.start.cast(), self.len) };
    }
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for FreshPages {}

/// How many handlers can unwind at once, each in a scratch slot of its own: one per CPU
/// and two more, 4 to 16. The two more are for handlers that hold a slot while they are
/// not running: preempted on a loaded machine, or waiting in a stack read for the kernel's
/// memory-map lock while another thread maps or unmaps. With one slot per CPU alone, a
/// third handler on 2 CPUs found none and recorded its PC alone ("sampler busy"), which a
/// profile of a loaded 2-core machine showed.
pub(crate) fn scratch_slots() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus + 2).clamp(4, 16)
}

struct Slot {
    busy: AtomicBool,
    scratch: UnsafeCell<Scratch>,
}

// SAFETY: `scratch` is only touched by the handler that set `busy` from false to true, until
// it stores false again.
unsafe impl Sync for Slot {}

impl Slot {
    fn new() -> Slot {
        Slot {
            busy: AtomicBool::new(false),
            scratch: UnsafeCell::new(Scratch {
                cache: Cache::new_in(),
                stack: FreshPages::new(MAX_STACK_COPY),
                frames: [0; MAX_DEPTH],
            }),
        }
    }

    /// Takes the slot if no handler holds it; async-signal-safe.
    fn try_take(&self) -> bool {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }
}

/// One of the two sample buffers. `state` is `writers << 40 | cursor` (cursor in words).
struct Buffer {
    state: AtomicU64,
    words: Box<[AtomicU64]>,
}

const WRITER: u64 = 1 << 40;
const CURSOR_MASK: u64 = WRITER - 1;

impl Buffer {
    /// A zeroed buffer whose pages become resident only as samples are written to them.
    fn new(words: usize) -> Buffer {
        const _: () = assert!(
            size_of::<AtomicU64>() == size_of::<u64>()
                && align_of::<AtomicU64>() == align_of::<u64>()
        );
        // calloc'd: large buffers are fresh zero pages the kernel maps on first write.
        let zeroed: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        // SAFETY: AtomicU64 has the size, alignment and bit validity of u64 (checked above
        // for this target), so the allocation is a valid `[AtomicU64]` of the same length,
        // and the `Box` is freed with the same layout.
        let words = unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [AtomicU64]) };
        Buffer {
            state: AtomicU64::new(0),
            words,
        }
    }
}

/// Handler time per sample, in 100 ns buckets up to 20 µs (the last bucket: longer).
struct Costs {
    buckets: [AtomicU32; Costs::BUCKETS],
    frames: AtomicU64,
    unwound: AtomicU64,
    /// Unwound samples that needed no system call to read the stack.
    direct: AtomicU64,
    /// Unwound samples that reached the stack's outermost frame.
    complete: AtomicU64,
}

impl Costs {
    const BUCKETS: usize = 201;
    const WIDTH: u64 = 100;

    fn new() -> Costs {
        Costs {
            buckets: [const { AtomicU32::new(0) }; Costs::BUCKETS],
            frames: AtomicU64::new(0),
            unwound: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            complete: AtomicU64::new(0),
        }
    }

    fn record(&self, nanos: u64) {
        let bucket = ((nanos / Costs::WIDTH) as usize).min(Costs::BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The upper edge of the bucket holding the `quantile`th sample.
    fn quantile(&self, quantile: f64) -> u64 {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| u64::from(b.load(Ordering::Relaxed)))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * quantile).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return (bucket as u64 + 1) * Costs::WIDTH;
            }
        }
        Costs::BUCKETS as u64 * Costs::WIDTH
    }
}

/// Everything the handler reads. Immutable after start, apart from atomics and slots.
struct Session {
    /// Matched against each signal's value: only this session's timers count.
    id: u32,
    unwinding: Unwinding,
    slots: Box<[Slot]>,
    buffers: [Buffer; 2],
    active: AtomicUsize,
    lost: AtomicU64,
    lost_periods: AtomicU64,
    foreign: AtomicU64,
    /// Per thread: whether it has a timer of its own (the backstop's signals on it are
    /// dropped), and the range of its stack proven readable (read without system calls).
    threads: Threads,
    costs: Costs,
    drained: Mutex<Drained>,
}

#[derive(Default)]
struct Drained {
    /// The open windows, each with the stacks drained since it opened. A record drained
    /// while no window is open counts for none.
    windows: Vec<(u64, HashMap<StackKey, Tally>)>,
    /// Per buffer: words already folded in since its last reset.
    done: [usize; 2],
    /// Scratch for a fold shared by several windows.
    fresh: HashMap<StackKey, Tally>,
}

impl Drained {
    /// Folds records `from..to` of `buffer` into every open window.
    fn fold(&mut self, buffer: &Buffer, from: usize, to: usize) {
        match self.windows.as_mut_slice() {
            [] => fold(buffer, from, to, &mut self.fresh),
            [(_, only)] => return fold(buffer, from, to, only),
            [rest @ .., (_, last)] => {
                fold(buffer, from, to, &mut self.fresh);
                for (_, stacks) in rest {
                    for (key, tally) in &self.fresh {
                        let sum = stacks.entry(key.clone()).or_default();
                        sum.samples += tally.samples;
                        sum.periods += tally.periods;
                    }
                }
                for (key, tally) in self.fresh.drain() {
                    let sum = last.entry(key).or_default();
                    sum.samples += tally.samples;
                    sum.periods += tally.periods;
                }
            }
        }
        self.fresh.clear();
    }
}

/// The session's running counts at one moment; a window's are the difference between
/// its close and its open.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    lost: Tally,
    foreign: u64,
    unwound: u64,
    direct: u64,
    complete: u64,
    frames: u64,
}

impl Counts {
    fn since(self, start: Counts) -> Counts {
        Counts {
            lost: Tally {
                samples: self.lost.samples.saturating_sub(start.lost.samples),
                periods: self.lost.periods.saturating_sub(start.lost.periods),
            },
            foreign: self.foreign.saturating_sub(start.foreign),
            unwound: self.unwound.saturating_sub(start.unwound),
            direct: self.direct.saturating_sub(start.direct),
            complete: self.complete.saturating_sub(start.complete),
            frames: self.frames.saturating_sub(start.frames),
        }
    }
}

/// Where a window began: what [`Sampler::close_window`] subtracts.
pub(crate) struct WindowStart {
    id: u64,
    started: SystemTime,
    started_at: Instant,
    cpu: Duration,
    counts: Counts,
    /// Each tracked thread's CPU clock.
    threads: HashMap<u32, Duration>,
}

static SESSION: AtomicPtr<Session> = AtomicPtr::new(std::ptr::null_mut());
static RUNNING_HANDLERS: AtomicUsize = AtomicUsize::new(0);
static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// A running sampler. Dropping it stops sampling and frees its memory; it may block for a
/// moment (deleting timers, waiting for handlers, `dlclose`), so drop it on a blocking
/// thread.
pub(crate) struct Sampler {
    /// Shared with the handler through [`SESSION`]; null once taken back.
    session: *mut Session,
    /// A reference to every shared library whose unwind tables the handler reads, so
    /// that a `dlclose` elsewhere cannot unmap them while the session lives.
    libraries: Vec<Library>,
    objects: Objects,
    timers: Mutex<Option<Timers>>,
    handler_replaced: AtomicBool,
    reader_why: String,
    frequency: u32,
}

// SAFETY: `Session` is `Sync` (atomics, a mutex, and slots guarded by their flag), and the
// sampler only hands out shared references to it until it takes it back in `stop`/`drop`.
// The library handles are only passed to `dlclose`, from whichever thread drops them.
unsafe impl Send for Sampler {}
// SAFETY: `&Sampler` only allows `drain` and the window calls, which go through the
// session's and the timers' mutexes.
unsafe impl Sync for Sampler {}

/// A `dlopen` reference to a loaded library, released on drop.
struct Library(*mut libc::c_void);

unsafe extern "C" {
    /// glibc and musl both have it; the `libc` crate declares it for glibc only.
    fn dlinfo(
        handle: *mut libc::c_void,
        request: libc::c_int,
        info: *mut libc::c_void,
    ) -> libc::c_int;
}
const RTLD_DI_LINKMAP: libc::c_int = 2;

impl Library {
    /// Pins exactly this loaded library; `None` if that cannot be done (it has no path,
    /// or the path names another copy, as for one loaded into another namespace by
    /// `dlmopen`). Only a pinned library's unwind tables may be read by the handler.
    fn pin(object: &LoadedObject) -> Option<Library> {
        let path = object.file.as_ref()?;
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: RTLD_NOLOAD never loads anything: it only adds a reference to a library
        // that is already loaded in the default namespace, which keeps its pages mapped.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            return None;
        }
        let library = Library(handle);
        // The first field of a `link_map` is its load bias, `l_addr`.
        let mut map: *const u64 = std::ptr::null();
        // SAFETY: RTLD_DI_LINKMAP writes the handle's `struct link_map *` into `map`.
        let found = unsafe { dlinfo(handle, RTLD_DI_LINKMAP, (&raw mut map).cast()) } == 0;
        // SAFETY: a link_map returned by the loader is valid while the handle is open.
        let same = found && !map.is_null() && unsafe { *map } == object.bias;
        same.then_some(library)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful dlopen and is closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

/// Which objects' unwind tables the handler may read: the executable and the vDSO, which
/// are never unmapped, and libraries this call could pin (returned with them).
fn readable_objects(objects: &Objects) -> (Vec<&LoadedObject>, Vec<Library>) {
    let mut readable = Vec::new();
    let mut libraries = Vec::new();
    for object in objects.iter() {
        let permanent = object.is_vdso
            || object.file.as_deref() == Some(std::path::Path::new("/proc/self/exe"));
        if permanent {
            readable.push(object);
        } else if let Some(library) = Library::pin(object) {
            libraries.push(library);
            readable.push(object);
        }
    }
    (readable, libraries)
}

/// An unwinder over the tables of every object the handler may read, and the pins that
/// keep the libraries among them mapped while it is used.
fn unwinder_for(objects: &Objects) -> (Unwinder, Vec<Library>) {
    let mut unwinder = Unwinder::new();
    let (readable, libraries) = readable_objects(objects);
    for object in readable {
        if let Some(module) = framehop_module(object) {
            unwinder.add_module(module);
        }
    }
    (unwinder, libraries)
}

/// The code ranges of the objects `blocklist` names, sorted.
fn blocked_ranges(objects: &Objects, blocklist: &[&str]) -> Box<[Range<u64>]> {
    let mut blocked = Vec::new();
    for object in objects.iter() {
        if blocklist.iter().any(|entry| object.is_named(entry)) {
            blocked.extend(object.segments.iter().map(|s| s.avma.clone()));
        }
    }
    blocked.sort_by_key(|r| r.start);
    blocked.into_boxed_slice()
}

/// The address bits of a code pointer in this process: everything up to the highest bit
/// any loaded object uses. On aarch64 the bits above may hold a pointer authentication
/// code in return addresses, which must be stripped before they are looked up.
fn code_address_mask(objects: &Objects) -> u64 {
    let highest = objects
        .iter()
        .map(|o| o.range.end)
        .max()
        .unwrap_or(u64::MAX);
    u64::MAX >> highest.leading_zeros()
}

impl Sampler {
    /// Arms the timers at `frequency` Hz. Locates unwind tables, allocates every buffer
    /// the handler will use, installs the handler. Takes about a millisecond.
    pub(crate) fn start(frequency: u32, blocklist: &[&str]) -> Result<Sampler, StartError> {
        register_fork_handler();
        if !handler_is_ours_or_default() {
            return Err(StartError::ForeignHandler);
        }
        let objects = Objects::current();
        let reader = Memory::choose();
        let (unwinding, libraries) = Unwinding::new(&objects, blocklist, reader.memory);

        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        // A buffer holds a quarter second of the worst case (every CPU sampled at the
        // full rate with full-depth stacks), 2.5 drain periods: enough that a drain a
        // little late loses nothing, small enough to stay well under a megabyte at 99 Hz.
        let per_second = frequency as usize * cpus.min(64) * (MAX_DEPTH + RECORD_HEADER);
        let words = (per_second / 4).clamp(16 * 1024, 1024 * 1024);

        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let session = Box::new(Session {
            id,
            unwinding,
            slots: (0..scratch_slots()).map(|_| Slot::new()).collect(),
            buffers: [Buffer::new(words), Buffer::new(words)],
            active: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
            lost_periods: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            threads: Threads::new(MAX_THREADS),
            costs: Costs::new(),
            drained: Mutex::new(Drained::default()),
        });

        install_handler()?;
        let pointer = Box::into_raw(session);
        if SESSION
            .compare_exchange(
                std::ptr::null_mut(),
                pointer,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            // SAFETY: `pointer` came from `Box::into_raw` above and was never shared.
            drop(unsafe { Box::from_raw(pointer) });
            return Err(StartError::Running);
        }
        // SAFETY: the session lives until `retire` below or the sampler's `take_session`.
        let threads = unsafe { &(*pointer).threads };
        let timers = match Timers::start(id, frequency, threads) {
            Ok(timers) => timers,
            Err(err) => {
                drop(retire(pointer));
                return Err(StartError::System("timer_create", err));
            }
        };
        Ok(Sampler {
            session: pointer,
            libraries,
            objects,
            timers: Mutex::new(Some(timers)),
            handler_replaced: AtomicBool::new(false),
            reader_why: reader.why,
            frequency,
        })
    }

    /// The frequency the timers run at.
    pub(crate) fn frequency(&self) -> u32 {
        self.frequency
    }

    /// The session itself, while it runs.
    fn session(&self) -> Option<&Session> {
        // SAFETY: the session lives until `take_session`, which needs `&mut self`.
        (!self.session.is_null()).then(|| unsafe { &*self.session })
    }

    /// The code addresses window `id` has gathered so far (drained ones; sorted, unique),
    /// as its profile will name them: each stack's leaf as sampled, its return addresses
    /// minus one. Lets the request symbolize most of its profile before the window ends.
    pub(crate) fn window_addresses(&self, id: u64) -> Vec<u64> {
        let Some(session) = self.session() else {
            return Vec::new();
        };
        let drained = session
            .drained
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some((_, stacks)) = drained.windows.iter().find(|(open, _)| *open == id) else {
            return Vec::new();
        };
        let mut addresses: Vec<u64> = stacks
            .keys()
            .flat_map(|key| {
                key.frames
                    .iter()
                    .enumerate()
                    .map(|(i, &address)| if i == 0 { address } else { address - 1 })
            })
            .collect();
        drop(drained);
        addresses.sort_unstable();
        addresses.dedup();
        addresses
    }

    /// The objects this session's profiles are built with (loaded when it started).
    pub(crate) fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Opens window `id`: every sample recorded from now on counts for it, until it
    /// closes. The records before are drained first (for the windows already open).
    pub(crate) fn open_window(&self, id: u64) -> WindowStart {
        let threads = self
            .timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Timers::clocks)
            .unwrap_or_default();
        let mut counts = Counts::default();
        if let Some(session) = self.session() {
            let mut drained = session.drain_inactive();
            counts = session.counts();
            drained.windows.push((id, HashMap::new()));
        }
        WindowStart {
            id,
            started: SystemTime::now(),
            started_at: Instant::now(),
            cpu: process_cpu_time(),
            counts,
            threads,
        }
    }

    /// Closes a window and returns what it collected: every sample recorded while it was
    /// open, and the session's counts, clocks and report over that time.
    pub(crate) fn close_window(&self, start: WindowStart) -> Collected {
        let duration = start.started_at.elapsed();
        let cpu_time = process_cpu_time().saturating_sub(start.cpu);
        let (threads, threads_timed, timer_shortfall) = {
            let timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
            match timers.as_ref() {
                Some(timers) => (
                    timers.cpu_since(&start.threads),
                    timers.tracked(),
                    timers.shortfall.clone(),
                ),
                None => (Vec::new(), 0, None),
            }
        };
        let mut stacks = HashMap::new();
        let mut counts = Counts::default();
        let mut handler_nanos = (0, 0);
        if let Some(session) = self.session() {
            let mut drained = session.drain_inactive();
            counts = session.counts().since(start.counts);
            handler_nanos = (session.costs.quantile(0.5), session.costs.quantile(0.99));
            if let Some(at) = drained.windows.iter().position(|(id, _)| *id == start.id) {
                stacks = drained.windows.swap_remove(at).1;
            }
        }
        let report = Report {
            reader: self.session().map_or("none", |s| s.unwinding.memory.name()),
            reader_why: self.reader_why.clone(),
            foreign_signals: counts.foreign,
            handler_replaced: self.handler_replaced.load(Ordering::Relaxed) || !handler_is_ours(),
            threads_timed,
            timer_shortfall,
            handler_nanos,
            unwound: counts.unwound,
            direct: counts.direct,
            complete: counts.complete,
            mean_depth: if counts.unwound == 0 {
                0.0
            } else {
                counts.frames as f64 / counts.unwound as f64
            },
        };
        Collected {
            stacks,
            lost: counts.lost,
            started: start.started,
            duration,
            cpu_time,
            frequency: self.frequency,
            objects: self.objects.clone(),
            threads,
            report,
        }
    }

    /// Closes window `id` without collecting it (its client hung up); nothing if it is
    /// not open.
    pub(crate) fn forget_window(&self, id: u64) {
        if let Some(session) = self.session() {
            let mut drained = session
                .drained
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            drained.windows.retain(|(open, _)| *open != id);
        }
    }

    /// Folds the records written so far into the stack counts, and gives threads that
    /// started since the last drain their own timers. If another handler replaced ours,
    /// the timers stop: their signals would only disturb the other profiler.
    pub(crate) fn drain(&self) {
        let Some(session) = self.session() else {
            return;
        };
        drop(session.drain_inactive());
        let mut timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        if !handler_is_ours() {
            self.handler_replaced.store(true, Ordering::Relaxed);
            drop(timers.take());
        } else if let Some(timers) = timers.as_mut() {
            timers.refresh(&session.threads);
        }
    }

    /// Deletes the timers and takes the session back from the handler.
    fn take_session(&mut self) -> Option<Session> {
        drop(
            self.timers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let pointer = std::mem::replace(&mut self.session, std::ptr::null_mut());
        if pointer.is_null() {
            return None;
        }
        let session = *retire(pointer);
        // Only now that no handler can read their unwind tables.
        self.libraries.clear();
        Some(session)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // A request that was cancelled: stop and free everything; the handler never sees
        // the session again.
        if let Some(session) = self.take_session() {
            #[cfg(test)]
            tests::note_teardown();
            drop(session);
        }
    }
}

/// Clears the session pointer, waits until no handler can still use the session, and
/// hands it back.
fn retire(pointer: *mut Session) -> Box<Session> {
    let _ = SESSION.compare_exchange(
        pointer,
        std::ptr::null_mut(),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    // A handler that loaded the pointer before it was cleared registered itself first
    // (both SeqCst), so it is counted here until it is done.
    while RUNNING_HANDLERS.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    // SAFETY: `pointer` came from `Box::into_raw`, and no handler can reach it any more.
    unsafe { Box::from_raw(pointer) }
}

/// In a child made by `fork`, the parent's session is a copy that no timer feeds and no
/// thread will ever stop: forget it (leaking the copy), so that the child can profile
/// itself. Registered once, before the first session starts.
fn register_fork_handler() {
    static ONCE: Once = Once::new();
    extern "C" fn in_child() {
        SESSION.store(std::ptr::null_mut(), Ordering::SeqCst);
        dump::DUMP.store(std::ptr::null_mut(), Ordering::SeqCst);
        RUNNING_HANDLERS.store(0, Ordering::SeqCst);
    }
    ONCE.call_once(|| {
        // SAFETY: the child handler only stores to atomics, which is async-signal-safe.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
}

/// The layout of a `siginfo_t` sent by a POSIX timer on 64-bit Linux.
#[repr(C)]
struct TimerSignalInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    timer: libc::c_int,
    overrun: libc::c_int,
    value: u64,
}

const _: () = assert!(size_of::<TimerSignalInfo>() <= size_of::<libc::siginfo_t>());

impl Session {
    /// One `SIGPROF`. Runs in the signal handler: see the module docs.
    ///
    /// # Safety
    /// `info` and `context` must be what the kernel passed to a `SA_SIGINFO` handler.
    unsafe fn on_signal(&self, info: *const libc::siginfo_t, context: *mut libc::c_void) {
        let entered = monotonic_nanos();
        if info.is_null() {
            return;
        }
        // SAFETY: the kernel's siginfo is valid for the handler's duration, and at least
        // as large as the timer layout (checked above).
        let info = unsafe { &*info.cast::<TimerSignalInfo>() };
        let kind = if info.code == libc::SI_TIMER {
            signal_kind(info.value, self.id)
        } else {
            None
        };
        // A thread's own timer names it: no system call needed to learn which it is.
        let tid = match kind {
            Some(KIND_THREAD) => self.threads.owner(info.timer).unwrap_or_else(current_tid),
            _ => current_tid(),
        };
        let thread = self.threads.find(tid);
        let periods = match kind {
            Some(KIND_THREAD) => 1 + info.overrun.max(0) as u64,
            // A thread with its own timer is sampled by it; the backstop is for the others.
            Some(KIND_BACKSTOP) if thread.is_some_and(Thread::is_timed) => return,
            Some(KIND_BACKSTOP) => 1,
            _ => {
                self.foreign.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.sample(tid, thread, periods, context) };
        self.costs.record(monotonic_nanos().saturating_sub(entered));
    }

    /// Swaps the buffers and folds the one that was active into the counts. One drainer at
    /// a time (the mutex); handlers never take it.
    /// Swaps the buffers and folds everything the handlers wrote before the swap into
    /// the open windows. Returns the drained state still locked, so that a window opened
    /// or closed under it starts or ends exactly at the swap.
    fn drain_inactive(&self) -> std::sync::MutexGuard<'_, Drained> {
        let mut drained = self.drained.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.active.load(Ordering::Acquire);
        self.active.store(1 - old, Ordering::Release);
        let buffer = &self.buffers[old];
        loop {
            // Wait for handlers that reserved space before the swap to finish writing.
            let state = loop {
                let state = buffer.state.load(Ordering::Acquire);
                if state & !CURSOR_MASK == 0 {
                    break state;
                }
                std::thread::yield_now();
            };
            let cursor = (state & CURSOR_MASK) as usize;
            let from = drained.done[old];
            drained.fold(buffer, from, cursor);
            drained.done[old] = cursor.min(buffer.words.len());
            // Reset, unless a late handler (one that read `active` before the swap) has
            // reserved more space meanwhile; then fold that too.
            if buffer
                .state
                .compare_exchange(state, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                drained.done[old] = 0;
                return drained;
            }
        }
    }

    /// The running counts, read under the drained state's lock.
    fn counts(&self) -> Counts {
        Counts {
            lost: Tally {
                samples: self.lost.load(Ordering::Relaxed),
                periods: self.lost_periods.load(Ordering::Relaxed),
            },
            foreign: self.foreign.load(Ordering::Relaxed),
            unwound: self.costs.unwound.load(Ordering::Relaxed),
            direct: self.costs.direct.load(Ordering::Relaxed),
            complete: self.costs.complete.load(Ordering::Relaxed),
            frames: self.costs.frames.load(Ordering::Relaxed),
        }
    }

    /// Records one sample standing for `periods` timer periods.
    ///
    /// # Safety
    /// `context` must be the `ucontext_t` the kernel passed to the handler.
    unsafe fn sample(
        &self,
        tid: u32,
        thread: Option<&Thread>,
        periods: u64,
        context: *mut libc::c_void,
    ) {
        // SAFETY: forwarded from the caller.
        let Some((pc, regs)) = (unsafe { registers(context, self.unwinding.code_mask) }) else {
            return;
        };
        let flags = if let Some(flags) = self.unwinding.refusal(pc) {
            flags
        } else if let Some(slot) = self.take_slot(tid) {
            // SAFETY: `take_slot` gave this handler exclusive use of the slot.
            let scratch = unsafe { &mut *slot.scratch.get() };
            let sp = regs.sp();
            let direct_high = match thread.and_then(Thread::known_stack) {
                Some((low, high)) if low <= sp && sp < high => high,
                _ => 0,
            };
            let Unwound {
                depth,
                flags,
                complete,
                copied,
            } = self
                .unwinding
                .unwind((pc, regs), direct_high, scratch, None);
            // An unwind that reached the outermost frame read only this thread's stack:
            // what it copied is known readable for the thread's later samples.
            if let Some(thread) = thread.filter(|_| complete && copied > 0) {
                thread.prove_stack(sp, sp + copied as u64);
            }
            if copied == 0 {
                self.costs.direct.fetch_add(1, Ordering::Relaxed);
            }
            if complete {
                self.costs.complete.fetch_add(1, Ordering::Relaxed);
            }
            self.costs.frames.fetch_add(depth as u64, Ordering::Relaxed);
            self.costs.unwound.fetch_add(1, Ordering::Relaxed);
            self.write(tid, flags, periods, &scratch.frames[..depth]);
            slot.busy.store(false, Ordering::Release);
            return;
        } else {
            FLAG_NO_SCRATCH
        };
        self.write(tid, flags, periods, &[pc]);
    }

    fn take_slot(&self, tid: u32) -> Option<&Slot> {
        let n = self.slots.len();
        (0..n)
            .map(|i| &self.slots[(tid as usize + i) % n])
            .find(|slot| slot.try_take())
    }

    /// Appends one record to the active buffer; async-signal-safe.
    fn write(&self, tid: u32, flags: u8, periods: u64, frames: &[u64]) {
        let buffer = &self.buffers[self.active.load(Ordering::Acquire)];
        let len = RECORD_HEADER + frames.len();
        let previous = buffer
            .state
            .fetch_add(WRITER + len as u64, Ordering::AcqRel);
        let at = (previous & CURSOR_MASK) as usize;
        if at + len <= buffer.words.len() {
            let header =
                MAGIC << 56 | u64::from(flags) << 48 | (frames.len() as u64) << 32 | u64::from(tid);
            buffer.words[at].store(header, Ordering::Relaxed);
            buffer.words[at + 1].store(periods, Ordering::Relaxed);
            for (word, frame) in buffer.words[at + RECORD_HEADER..at + len]
                .iter()
                .zip(frames)
            {
                word.store(*frame, Ordering::Relaxed);
            }
        } else {
            self.lost.fetch_add(1, Ordering::Relaxed);
            self.lost_periods.fetch_add(periods, Ordering::Relaxed);
        }
        buffer.state.fetch_sub(WRITER, Ordering::Release);
    }
}

/// What the handler unwinds with, the same for a CPU sample and a thread dump's answer:
/// the unwind tables, the blocklisted code, the stack reader and the code address mask.
struct Unwinding {
    unwinder: Unwinder,
    /// Code ranges of blocklisted objects, sorted.
    blocked: Box<[Range<u64>]>,
    memory: Memory,
    /// Bits of a return address that are address (the rest may hold a pointer
    /// authentication code on aarch64).
    code_mask: u64,
}

/// What [`Unwinding::unwind`] wrote.
struct Unwound {
    depth: usize,
    flags: u8,
    /// It reached the stack's outermost frame.
    complete: bool,
    /// Bytes of the stack copied by system calls (0: all read directly).
    copied: usize,
}

impl Unwinding {
    /// For `objects` as loaded now; also the pins that keep the libraries among them
    /// mapped while the tables are read.
    fn new(objects: &Objects, blocklist: &[&str], memory: Memory) -> (Unwinding, Vec<Library>) {
        let (unwinder, libraries) = unwinder_for(objects);
        let unwinding = Unwinding {
            unwinder,
            blocked: blocked_ranges(objects, blocklist),
            memory,
            code_mask: code_address_mask(objects),
        };
        (unwinding, libraries)
    }

    /// Why a stack interrupted at `pc` is recorded as its PC alone, if it is: the PC is
    /// in a blocklisted object, or no stack can be read here.
    fn refusal(&self, pc: u64) -> Option<u8> {
        if self.is_blocked(pc) {
            Some(FLAG_BLOCKLISTED)
        } else if matches!(self.memory, Memory::Unreadable) {
            Some(FLAG_NO_STACK_READ)
        } else {
            None
        }
    }

    /// Whether `address` lies in blocklisted code.
    fn is_blocked(&self, address: u64) -> bool {
        let i = self.blocked.partition_point(|r| r.start <= address);
        i > 0 && self.blocked[i - 1].contains(&address)
    }

    /// Unwinds from the interrupted `pc` and registers (leaf first) into `frames`, or
    /// the scratch's own frames if `None`, stopping after the first frame in a
    /// blocklisted object and at [`MAX_DEPTH`] (marked [`FLAG_TRUNCATED`]). The stack is
    /// read directly below `direct_high`, else copied into the scratch by system calls.
    /// Async-signal-safe: framehop with fixed storage.
    fn unwind(
        &self,
        (pc, regs): (u64, UnwindRegsNative),
        direct_high: u64,
        scratch: &mut Scratch,
        frames: Option<&mut [u64; MAX_DEPTH]>,
    ) -> Unwound {
        let Scratch {
            cache,
            stack,
            frames: own,
        } = scratch;
        let frames = frames.unwrap_or(own);
        let mut reader = StackReader {
            memory: &self.memory,
            sp: regs.sp(),
            direct_high,
            copy: stack,
            copied: 0,
        };
        let mut read = |address: u64| reader.read(address);
        let mut unwinding = self.unwinder.iter_frames(pc, regs, cache, &mut read);
        let mut depth = 0usize;
        let mut flags = 0;
        let mut complete = false;
        loop {
            match unwinding.next() {
                Ok(Some(_)) if depth == MAX_DEPTH => {
                    flags |= FLAG_TRUNCATED;
                    break;
                }
                Ok(Some(frame)) => {
                    let address = frame.address() & self.code_mask;
                    frames[depth] = address;
                    depth += 1;
                    // Do not unwind through a blocklisted library.
                    if depth > 1 && self.is_blocked(address.wrapping_sub(1)) {
                        break;
                    }
                }
                Ok(None) => {
                    complete = true;
                    break;
                }
                Err(_) => break,
            }
        }
        Unwound {
            depth,
            flags,
            complete,
            copied: reader.copied,
        }
    }
}

/// Folds records `from..to` of `buffer` into `stacks` and zeroes them. Stops at the first
/// empty header: space reserved by a sample that did not fit is never written.
fn fold(buffer: &Buffer, from: usize, to: usize, stacks: &mut HashMap<StackKey, Tally>) {
    let words = &buffer.words;
    let end = to.min(words.len());
    let mut at = from;
    while at < end {
        let header = words[at].swap(0, Ordering::Relaxed);
        if header >> 56 != MAGIC {
            break;
        }
        let depth = ((header >> 32) & 0xffff) as usize;
        let Some(record) = words.get(at + RECORD_HEADER..at + RECORD_HEADER + depth) else {
            break;
        };
        let periods = words[at + 1].swap(0, Ordering::Relaxed);
        let frames: Box<[u64]> = record
            .iter()
            .map(|w| w.swap(0, Ordering::Relaxed))
            .collect();
        let key = StackKey {
            tid: header as u32,
            flags: (header >> 48) as u8,
            frames,
        };
        let tally = stacks.entry(key).or_default();
        tally.samples += 1;
        tally.periods += periods;
        at += RECORD_HEADER + depth;
    }
}

/// Reads the interrupted thread's stack: directly below `direct_high` (memory proven
/// readable, see [`Threads`]), else through a lazily grown copy made by system calls.
struct StackReader<'a> {
    memory: &'a Memory,
    sp: u64,
    /// Zero, or the end of the range above `sp` that may be read with plain loads.
    direct_high: u64,
    copy: &'a mut [u8],
    copied: usize,
}

impl StackReader<'_> {
    fn read(&mut self, address: u64) -> Result<u64, ()> {
        if address >= self.sp
            && address
                .checked_add(8)
                .is_some_and(|end| end <= self.direct_high)
        {
            // SAFETY: `[sp, direct_high)` is this thread's live stack, proven readable
            // (see `threads`): mapped while the thread runs, so the load cannot fault.
            return Ok(unsafe { (address as *const u64).read_unaligned() });
        }
        let offset = usize::try_from(address.checked_sub(self.sp).ok_or(())?).map_err(|_| ())?;
        let end = offset.checked_add(8).ok_or(())?;
        if end > self.copy.len() {
            return Err(());
        }
        // A frame can be larger than one step (a big array on the stack): copy step by
        // step until the address is covered or the stack ends.
        while self.copied < end {
            let from = self.sp + self.copied as u64;
            // Up to the end of the page `end` is on, at most MAX_PAGES pages per call.
            let page_end = (self.sp + end as u64).div_ceil(PAGE) * PAGE;
            let step_end = page_end.min((from / PAGE + MAX_PAGES as u64) * PAGE);
            let limit = (step_end - self.sp).min(self.copy.len() as u64) as usize;
            let got = self.memory.read(from, &mut self.copy[self.copied..limit]);
            if got == 0 {
                return Err(());
            }
            self.copied += got;
        }
        let bytes: [u8; 8] = self.copy[offset..end].try_into().map_err(|_| ())?;
        Ok(u64::from_ne_bytes(bytes))
    }
}

/// A framehop module for an object's in-memory unwind tables.
fn framehop_module(object: &LoadedObject) -> Option<Module<MemorySlice>> {
    let hdr = object.eh_frame_hdr.clone()?;
    let hdr_bytes = MemorySlice {
        ptr: hdr.start as *const u8,
        len: (hdr.end - hdr.start) as usize,
    };
    let eh_frame_start = crate::objects::eh_frame_address(&hdr_bytes, hdr.start)?;
    let segment = object
        .segments
        .iter()
        .find(|s| s.avma.contains(&eh_frame_start))?;
    let eh_frame = MemorySlice {
        ptr: eh_frame_start as *const u8,
        len: (segment.avma.end - eh_frame_start) as usize,
    };
    let to_svma = |r: Range<u64>| r.start - object.bias..r.end - object.bias;
    let text = object.text()?;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(to_svma(text.avma.clone())),
        eh_frame_svma: Some(to_svma(eh_frame_start..segment.avma.end)),
        eh_frame: Some(eh_frame),
        eh_frame_hdr_svma: Some(to_svma(hdr.clone())),
        eh_frame_hdr: Some(hdr_bytes),
        ..Default::default()
    };
    Some(Module::new(
        object.name.clone(),
        object.range.clone(),
        object.bias,
        info,
    ))
}

/// The interrupted PC and unwind registers.
///
/// # Safety
/// `context` must be the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
#[cfg(target_arch = "x86_64")]
unsafe fn registers(
    context: *mut libc::c_void,
    _code_mask: u64,
) -> Option<(u64, UnwindRegsNative)> {
    let context = context.cast::<libc::ucontext_t>();
    if context.is_null() {
        return None;
    }
    // SAFETY: the kernel's ucontext is valid for the handler's duration.
    let gregs = unsafe { &(*context).uc_mcontext.gregs };
    let ip = gregs[libc::REG_RIP as usize] as u64;
    let sp = gregs[libc::REG_RSP as usize] as u64;
    let bp = gregs[libc::REG_RBP as usize] as u64;
    Some((ip, UnwindRegsNative::new(ip, sp, bp)))
}

/// The interrupted PC and unwind registers; return addresses read while unwinding (and the
/// link register) are stripped of pointer authentication bits with `code_mask`.
///
/// # Safety
/// `context` must be the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
#[cfg(target_arch = "aarch64")]
unsafe fn registers(context: *mut libc::c_void, code_mask: u64) -> Option<(u64, UnwindRegsNative)> {
    let context = context.cast::<libc::ucontext_t>();
    if context.is_null() {
        return None;
    }
    // SAFETY: the kernel's ucontext is valid for the handler's duration.
    let mcontext = unsafe { &(*context).uc_mcontext };
    let pc = mcontext.pc;
    Some((
        pc,
        UnwindRegsNative::new_with_ptr_auth_mask(
            framehop::aarch64::PtrAuthMask(code_mask),
            mcontext.regs[30],
            mcontext.sp,
            mcontext.regs[29],
        ),
    ))
}

/// CPU time used by this process so far.
fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// `CLOCK_MONOTONIC` in nanoseconds; async-signal-safe (the vDSO answers it).
fn monotonic_nanos() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The `SIGPROF` handler. See the module docs for what it may and may not do.
extern "C" fn on_sigprof(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: errno is thread-local; reading and restoring it is what makes the handler
    // invisible to the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    RUNNING_HANDLERS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the kernel's siginfo is valid for the handler's duration, and at least as
    // large as the layout read; `context` comes from the kernel.
    let dumped = !info.is_null() && unsafe { dump::on_signal(&*info.cast(), context) };
    let session = SESSION.load(Ordering::SeqCst);
    if !dumped && !session.is_null() {
        // SAFETY: a non-null session stays alive until RUNNING_HANDLERS drops to zero
        // after it was cleared (see `retire`); `info` and `context` come from the kernel.
        unsafe { (*session).on_signal(info, context) };
    }
    RUNNING_HANDLERS.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The `SIGPROF` handler installed now.
fn current_handler() -> usize {
    // SAFETY: sigaction with a null new action only writes the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut old) != 0 {
            return libc::SIG_DFL;
        }
        old.sa_sigaction
    }
}

fn handler_is_ours() -> bool {
    current_handler() == on_sigprof as *const () as usize
}

/// Whether starting may install our handler: nobody else's is there.
fn handler_is_ours_or_default() -> bool {
    let handler = current_handler();
    handler == libc::SIG_DFL || handler == libc::SIG_IGN || handler_is_ours()
}

/// Installs the handler (again, in case the default came back since the last profile).
fn install_handler() -> Result<(), StartError> {
    // SAFETY: the sigaction struct is fully initialised; the handler is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigprof as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()) != 0 {
            return Err(StartError::System(
                "sigaction(SIGPROF)",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    /// One sampler per process: the tests that start one take this first.
    pub(crate) static ONE_SAMPLER: Mutex<()> = Mutex::new(());

    /// The thread that last tore a cancelled session down.
    pub(crate) static TORN_DOWN_ON: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);

    pub(super) fn note_teardown() {
        *TORN_DOWN_ON.lock().unwrap() = Some(std::thread::current().id());
    }

    fn this_process() -> Memory {
        Memory::VmReadv {
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        }
    }

    #[test]
    fn stack_reader_stops_at_unreadable_memory() {
        use crate::cpu::memory::tests::{hole_still_free, page_before_a_hole};
        // A page we can read, then a hole: reads stop at the boundary.
        let memory = this_process();
        for _attempt in 0..5 {
            let base = page_before_a_hole();
            let mut copy = vec![0u8; MAX_STACK_COPY];
            let mut reader = StackReader {
                memory: &memory,
                sp: base,
                direct_high: 0,
                copy: &mut copy,
                copied: 0,
            };
            let reads = [
                reader.read(base),
                reader.read(base + PAGE - 8),
                reader.read(base + PAGE),
                reader.read(base - 8),
                reader.read(base + MAX_STACK_COPY as u64),
            ];
            let valid = hole_still_free(base);
            // SAFETY: unmapping the page mapped above.
            unsafe { libc::munmap(base as *mut libc::c_void, PAGE as usize) };
            if valid {
                assert_eq!(reads[0], Ok(0x1122_3344_5566_7788));
                assert_eq!(reads[1], Ok(0));
                assert_eq!(reads[2], Err(()), "the hole is not read");
                assert_eq!(reads[3], Err(()), "below the stack pointer");
                assert_eq!(reads[4], Err(()), "beyond the copy");
                return;
            }
        }
        panic!("the hole was taken five times in a row");
    }

    #[test]
    fn stack_reader_reaches_past_a_frame_larger_than_a_step() {
        let mut stack = vec![7u64; 40 * 1024 / 8];
        stack[36 * 1024 / 8] = 9;
        let memory = this_process();
        let mut copy = vec![0u8; MAX_STACK_COPY];
        let mut reader = StackReader {
            memory: &memory,
            sp: stack.as_ptr() as u64,
            direct_high: 0,
            copy: &mut copy,
            copied: 0,
        };
        let far = stack.as_ptr() as u64 + 36 * 1024;
        assert_eq!(
            reader.read(far),
            Ok(9),
            "36 KiB above sp, several steps away"
        );
        assert_eq!(reader.read(far - 8), Ok(7));
    }

    fn test_session(words: usize) -> Session {
        Session {
            id: 0,
            unwinding: Unwinding {
                unwinder: Unwinder::new(),
                blocked: Box::new([]),
                memory: Memory::Unreadable,
                code_mask: u64::MAX,
            },
            slots: Box::new([]),
            buffers: [Buffer::new(words), Buffer::new(words)],
            active: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
            lost_periods: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            threads: Threads::new(4),
            costs: Costs::new(),
            drained: Mutex::new(Drained::default()),
        }
    }

    #[test]
    fn buffer_records_round_trip_and_overflow_is_counted() {
        let session = test_session(10);
        // Drained while no window is open: counts for none.
        session.write(6, 0, 1, &[4]);
        drop(session.drain_inactive());
        session
            .drained
            .lock()
            .unwrap()
            .windows
            .push((1, HashMap::new()));
        session.write(7, 0, 1, &[1, 2, 3]);
        session.write(7, 0, 3, &[1, 2, 3]);
        session.write(8, FLAG_BLOCKLISTED, 2, &[9, 9, 9]); // does not fit: 5 + 5 + 5 > 10
        drop(session.drain_inactive());
        // A second window from here on: the later record counts for both.
        session
            .drained
            .lock()
            .unwrap()
            .windows
            .push((2, HashMap::new()));
        session.write(9, FLAG_TRUNCATED, 1, &[5]);
        let drained = session.drain_inactive();
        let (first, second) = (&drained.windows[0].1, &drained.windows[1].1);
        let key = |tid, flags, frames: &[u64]| StackKey {
            tid,
            flags,
            frames: frames.into(),
        };
        assert_eq!(
            first.get(&key(7, 0, &[1, 2, 3])),
            Some(&Tally {
                samples: 2,
                periods: 4
            })
        );
        let truncated = Some(&Tally {
            samples: 1,
            periods: 1,
        });
        assert_eq!(first.get(&key(9, FLAG_TRUNCATED, &[5])), truncated);
        assert_eq!(first.len(), 2);
        assert_eq!(second.get(&key(9, FLAG_TRUNCATED, &[5])), truncated);
        assert_eq!(
            second.len(),
            1,
            "the window opened later has the later record only"
        );
        assert_eq!(session.lost.load(Ordering::Relaxed), 1);
        assert_eq!(session.lost_periods.load(Ordering::Relaxed), 2);
        assert!(
            session
                .buffers
                .iter()
                .all(|b| b.state.load(Ordering::Relaxed) == 0)
        );
        assert!(
            session
                .buffers
                .iter()
                .all(|b| b.words.iter().all(|w| w.load(Ordering::Relaxed) == 0))
        );
    }

    #[test]
    fn handler_costs_give_median_and_tail() {
        let costs = Costs::new();
        for nanos in (0..98).map(|i| 1_000 + i * 10).chain([9_000, 50_000]) {
            costs.record(nanos);
        }
        assert_eq!(costs.quantile(0.5), 1_500);
        assert_eq!(costs.quantile(0.99), 9_100);
        assert_eq!(costs.quantile(1.0), Costs::BUCKETS as u64 * Costs::WIDTH);
        assert_eq!(Costs::new().quantile(0.5), 0);
    }

    #[test]
    fn pointer_authentication_bits_are_stripped_from_return_addresses() {
        // Objects up to a 48-bit address; a signed return address carries a code above.
        let objects = Objects::current();
        let mask = code_address_mask(&objects);
        let highest = objects.iter().map(|o| o.range.end).max().unwrap();
        assert_eq!(mask, u64::MAX >> highest.leading_zeros());
        let code = highest - 0x100;
        let signed = code | (0x2a << 55);
        assert_eq!(signed & mask, code, "the authentication code is removed");
        assert_eq!(code & mask, code, "a plain address is kept");
    }

    #[test]
    fn only_pinned_libraries_give_unwind_tables() {
        let objects = Objects::current();
        let (readable, libraries) = readable_objects(&objects);
        assert!(readable.iter().any(|o| o.is_vdso));
        assert!(
            readable
                .iter()
                .any(|o| o.short_name().starts_with("libc.so")),
            "libc is pinned"
        );
        assert_eq!(
            readable.len(),
            libraries.len() + 2,
            "every library is pinned; only the executable and the vDSO are not"
        );
    }

    #[test]
    fn a_library_is_pinned_only_as_the_copy_that_was_listed() {
        let objects = Objects::current();
        let libc = objects
            .iter()
            .find(|o| o.short_name().starts_with("libc.so"))
            .expect("libc is loaded");
        assert!(Library::pin(libc).is_some());
        // The same path, somewhere else: another copy (another namespace, or a library
        // replaced since the list was taken). Its tables could be unmapped under us.
        let mut elsewhere = libc.clone();
        elsewhere.bias += 0x1000_0000;
        assert!(Library::pin(&elsewhere).is_none());
    }

    #[cfg(target_env = "gnu")]
    #[test]
    fn a_library_in_another_namespace_is_not_read() {
        // The same libc, loaded again into a new namespace by dlmopen: RTLD_NOLOAD in the
        // default namespace would find the other copy, which does not pin this one.
        let name = c"libc.so.6";
        // SAFETY: dlmopen loads a fresh copy of libc into a new link-map namespace.
        let handle = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, name.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlmopen of libc");
        let objects = Objects::current();
        let (readable, libraries) = readable_objects(&objects);
        let readable_copies = readable
            .iter()
            .filter(|o| o.short_name().starts_with("libc.so"))
            .count();
        assert_eq!(readable_copies, 1, "only the pinned copy's tables are read");
        drop(libraries);
        // SAFETY: closing the handle opened above, once.
        unsafe { libc::dlclose(handle) };
    }

    /// How far below the interrupted code's stack pointer the kernel's signal frame and the
    /// handler reach, measured by painting the stack below a spinning thread and sampling it.
    #[test]
    fn the_handler_uses_little_of_the_interrupted_threads_stack() {
        const PAINT: usize = 48 * 1024;
        const COLOUR: u8 = 0xa7;

        #[inline(never)]
        fn paint_and_spin(stop: &AtomicBool, spins: &AtomicU64) -> usize {
            let marker = 0u8;
            let sp = std::hint::black_box(&raw const marker) as usize;
            // Below the red zone, down to PAINT bytes below this frame.
            let low = sp - 256 - PAINT;
            for at in low..sp - 256 {
                // SAFETY: this thread's own stack, below the current frame and within its
                // 1 MiB; nothing else uses it.
                unsafe { std::ptr::write_volatile(at as *mut u8, COLOUR) };
            }
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                spins.store(x, Ordering::Relaxed);
            }
            // The lowest byte that is no longer the paint: how deep the signal frames went.
            let lowest = (low..sp - 256)
                // SAFETY: as above.
                .find(|&at| unsafe { std::ptr::read_volatile(at as *const u8) } != COLOUR)
                .unwrap_or(sp);
            sp - lowest
        }

        let _one = ONE_SAMPLER.lock().unwrap_or_else(PoisonError::into_inner);
        let stop = Arc::new(AtomicBool::new(false));
        let spins = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, spins) = (stop.clone(), spins.clone());
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || paint_and_spin(&stop, &spins))
                .unwrap()
        };
        while spins.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let sampler = Sampler::start(1000, &[]).expect("a sampler");
        let window = sampler.open_window(1);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut samples = 0;
        while samples < 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            sampler.drain();
            // SAFETY: the session lives until `stop` below.
            let session = unsafe { &*sampler.session };
            samples = session.costs.unwound.load(Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
        let used = thread.join().unwrap();
        let collected = sampler.close_window(window);
        drop(sampler);
        assert!(samples >= 100, "{samples} samples to judge by");
        eprintln!(
            "signal frame + handler: {used} bytes below the interrupted sp; handler {:?} ns",
            collected.report.handler_nanos
        );
        // The kernel's own signal frame (its size depends on the CPU's vector registers),
        // plus 4 KiB for the handler.
        // SAFETY: getauxval has no preconditions; 51 is AT_MINSIGSTKSZ.
        let kernel_frame = unsafe { libc::getauxval(51) } as usize;
        let bound = kernel_frame.max(2048) + 4096;
        assert!(
            used < bound,
            "{used} bytes of the interrupted thread's stack (bound {bound}, the kernel's \
             frame {kernel_frame})"
        );
    }
}
