//! The CPU sampler: a `SIGPROF` interval timer, a signal handler that unwinds the
//! interrupted thread and writes its stack into a pre-allocated buffer, and a drain that
//! aggregates stacks off the signal path.
//!
//! # What runs in the signal handler, and why it is safe
//!
//! `ITIMER_PROF` sends `SIGPROF` to the process once per `1/frequency` seconds of its CPU
//! time; the kernel delivers it to a thread that is running. The handler ([`on_sigprof`]):
//!
//! 1. saves `errno`, and registers itself in an atomic counter of running handlers;
//! 2. loads the session pointer (null when no profile runs: it returns at once);
//! 3. takes a scratch slot with a compare-and-swap (no lock; if every slot is in use by
//!    handlers on other threads, it records the interrupted PC alone, marked as such);
//! 4. reads the registers from the `ucontext` the kernel passed;
//! 5. unwinds with [framehop](https://docs.rs/framehop) under `MustNotAllocateDuringUnwind`,
//!    from unwind tables (`.eh_frame_hdr`/`.eh_frame`) that were located in memory before
//!    the timer started; framehop takes no locks and does not allocate in this mode;
//! 6. reads the stack only through a copy made with `process_vm_readv` on its own pid: a
//!    system call that fails with `EFAULT` instead of faulting, so a wrong unwind rule can
//!    at worst end the stack early, never crash the process;
//! 7. reserves space in the active buffer with one `fetch_add` and writes the record with
//!    plain atomic stores; if the buffer is full, it counts a lost sample;
//! 8. restores `errno`.
//!
//! Nothing in the handler allocates, locks, formats, logs or can block: it uses atomics,
//! memory owned by the session, and the async-signal-safe `process_vm_readv` and `gettid`
//! system calls. Unwinding stops at the first frame in a blocklisted library; a sample
//! whose interrupted PC is in one is recorded as that PC alone, not unwound.
//!
//! Off the signal path, a drain (called about every 100 ms while the window runs, and at
//! the end) swaps the two buffers, waits for handlers still writing to the old one, and
//! folds its records into a map from stack to count. Memory is therefore bounded by the
//! buffer size and the number of distinct stacks, not by the profile's length.
//!
//! Stopping disarms the timer, clears the session pointer, waits until no handler is
//! running, and only then frees the session. The handler stays installed between
//! profiles (it returns at once when no session exists), so a late `SIGPROF` can never
//! meet the default action, which would kill the process.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, UnwindRegsNative,
    Unwinder as _, UnwinderNative,
};

use crate::objects::{LoadedObject, Objects};

/// Deepest stack recorded, in frames.
pub(crate) const MAX_DEPTH: usize = 128;
/// How far above the stack pointer the handler may copy the stack.
const MAX_STACK_COPY: usize = 256 * 1024;
/// The stack is copied in steps of this size, as far as the unwinder reads.
const STACK_CHUNK: usize = 16 * 1024;
const PAGE: u64 = 4096;
/// How often the caller should [`Sampler::drain`] while a profile runs.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// Record header: `MAGIC << 56 | flags << 48 | depth << 32 | tid`.
const MAGIC: u64 = 0xA5;
/// The interrupted PC was in a blocklisted library: not unwound.
pub(crate) const FLAG_BLOCKLISTED: u8 = 1;
/// Every scratch slot was busy on other threads: not unwound.
pub(crate) const FLAG_NO_SCRATCH: u8 = 2;
/// The stack could not be read (`process_vm_readv` unavailable): not unwound.
pub(crate) const FLAG_NO_STACK_READ: u8 = 4;

/// A stack as recorded: the interrupted PC first, then return addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StackKey {
    pub(crate) tid: u32,
    pub(crate) flags: u8,
    pub(crate) frames: Box<[u64]>,
}

/// What a finished session collected.
pub(crate) struct Collected {
    pub(crate) stacks: HashMap<StackKey, u64>,
    /// Samples dropped because the buffer was full.
    pub(crate) lost: u64,
    pub(crate) started: SystemTime,
    pub(crate) duration: Duration,
    /// CPU time the whole process used during the window (user + system).
    pub(crate) cpu_time: Duration,
    pub(crate) frequency: u32,
    pub(crate) objects: Objects,
}

/// Why sampling could not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Another session is running in this process (another router, or a bug).
    Running,
    /// A system call failed.
    System(&'static str, std::io::Error),
}

/// Bytes of a loaded object's memory, for framehop.
#[derive(Clone, Copy)]
struct MemorySlice {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the slices point into loaded objects' read-only segments, which stay mapped while
// the session uses them (objects unloaded mid-profile are the documented exception).
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

type Unwinder = UnwinderNative<MemorySlice, MustNotAllocateDuringUnwind>;
type Cache = CacheNative<MustNotAllocateDuringUnwind>;

/// One handler's working memory.
struct Scratch {
    cache: Cache,
    stack: Box<[u8]>,
}

struct Slot {
    busy: AtomicBool,
    scratch: UnsafeCell<Scratch>,
}

// SAFETY: `scratch` is only touched by the handler that set `busy` from false to true, until
// it stores false again.
unsafe impl Sync for Slot {}

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

/// Everything the handler reads. Immutable after start, apart from atomics and slots.
struct Session {
    unwinder: Unwinder,
    /// Code ranges of blocklisted objects, sorted.
    blocked: Box<[Range<u64>]>,
    slots: Box<[Slot]>,
    buffers: [Buffer; 2],
    active: AtomicUsize,
    lost: AtomicU64,
    pid: libc::pid_t,
    can_read_stack: bool,
    drained: Mutex<Drained>,
}

#[derive(Default)]
struct Drained {
    stacks: HashMap<StackKey, u64>,
    /// Per buffer: words already folded in since its last reset.
    done: [usize; 2],
}

static SESSION: AtomicPtr<Session> = AtomicPtr::new(std::ptr::null_mut());
static RUNNING_HANDLERS: AtomicUsize = AtomicUsize::new(0);

/// A running sampler. Dropping it stops sampling and frees its memory.
pub(crate) struct Sampler {
    /// Shared with the handler through [`SESSION`]; null once taken back.
    session: *mut Session,
    /// A reference to every shared library whose unwind tables the handler reads, so
    /// that a `dlclose` elsewhere cannot unmap them while the session lives.
    libraries: Vec<Library>,
    objects: Objects,
    started: SystemTime,
    started_at: Instant,
    cpu_at_start: Duration,
    frequency: u32,
}

// SAFETY: `Session` is `Sync` (atomics, a mutex, and slots guarded by their flag), and the
// sampler only hands out shared references to it until it takes it back in `stop`/`drop`.
// The library handles are only passed to `dlclose`, from whichever thread drops them.
unsafe impl Send for Sampler {}
// SAFETY: `&Sampler` only allows `drain`, which goes through the session's mutex.
unsafe impl Sync for Sampler {}

/// A `dlopen` reference to a loaded library, released on drop.
struct Library(*mut libc::c_void);

impl Library {
    /// Pins an already loaded library; `None` if it is not loaded (or has no path).
    fn pin(object: &LoadedObject) -> Option<Library> {
        let path = object.file.as_ref()?;
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: RTLD_NOLOAD never loads anything: it only adds a reference to a library
        // that is already loaded, which is what keeps its pages mapped.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        (!handle.is_null()).then_some(Library(handle))
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful dlopen and is closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

impl Sampler {
    /// Arms the timer at `frequency` Hz. Locates unwind tables, allocates every buffer
    /// the handler will use, installs the handler. Takes well under a millisecond.
    pub(crate) fn start(frequency: u32, blocklist: &[&str]) -> Result<Sampler, StartError> {
        let objects = Objects::current();
        let mut unwinder = Unwinder::new();
        let mut blocked = Vec::new();
        let mut libraries = Vec::new();
        for object in objects.iter() {
            // The executable and the vDSO are never unloaded; shared libraries could be.
            if !object.is_vdso
                && object.file.as_deref() != Some(std::path::Path::new("/proc/self/exe"))
            {
                libraries.extend(Library::pin(object));
            }
            if blocklist.iter().any(|entry| object.is_named(entry)) {
                blocked.extend(object.segments.iter().map(|s| s.avma.clone()));
            }
            if let Some(module) = framehop_module(object) {
                unwinder.add_module(module);
            }
        }
        blocked.sort_by_key(|r| r.start);

        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let slots = cpus.clamp(2, 16);
        // A buffer holds a quarter second of the worst case (every CPU sampled at the
        // full rate with full-depth stacks), 2.5 drain periods: enough that a drain a
        // little late loses nothing, small enough to stay well under a megabyte at 99 Hz.
        let per_second = frequency as usize * cpus.min(64) * (MAX_DEPTH + 1);
        let words = (per_second / 4).clamp(16 * 1024, 1024 * 1024);

        let session = Box::new(Session {
            unwinder,
            blocked: blocked.into_boxed_slice(),
            slots: (0..slots)
                .map(|_| Slot {
                    busy: AtomicBool::new(false),
                    scratch: UnsafeCell::new(Scratch {
                        cache: Cache::new_in(),
                        stack: vec![0u8; MAX_STACK_COPY].into_boxed_slice(),
                    }),
                })
                .collect(),
            buffers: [Buffer::new(words), Buffer::new(words)],
            active: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            can_read_stack: process_vm_readv_works(),
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
        let started = SystemTime::now();
        let started_at = Instant::now();
        let cpu_at_start = process_cpu_time();
        if let Err(err) = set_timer(frequency) {
            let session = retire(pointer);
            drop(session);
            return Err(err);
        }
        Ok(Sampler {
            session: pointer,
            libraries,
            objects,
            started,
            started_at,
            cpu_at_start,
            frequency,
        })
    }

    /// Folds the records written so far into the stack counts.
    pub(crate) fn drain(&self) {
        if !self.session.is_null() {
            // SAFETY: the session lives until `take_session`, which needs `&mut self`.
            unsafe { (*self.session).drain_inactive() };
        }
    }

    /// Stops sampling and returns what was collected.
    pub(crate) fn stop(mut self) -> Collected {
        let session = self.take_session().expect("a sampler stops once");
        let duration = self.started_at.elapsed();
        let cpu_time = process_cpu_time().saturating_sub(self.cpu_at_start);
        let lost = session.lost.load(Ordering::Relaxed);
        let mut drained = session
            .drained
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for (index, buffer) in session.buffers.iter().enumerate() {
            // No handler runs any more: everything up to the cursor is complete.
            let cursor = (buffer.state.load(Ordering::Acquire) & CURSOR_MASK) as usize;
            fold(buffer, drained.done[index], cursor, &mut drained.stacks);
        }
        Collected {
            stacks: drained.stacks,
            lost,
            started: self.started,
            duration,
            cpu_time,
            frequency: self.frequency,
            objects: std::mem::take(&mut self.objects),
        }
    }

    /// Disarms the timer and takes the session back from the handler.
    fn take_session(&mut self) -> Option<Session> {
        let pointer = std::mem::replace(&mut self.session, std::ptr::null_mut());
        if pointer.is_null() {
            return None;
        }
        let _ = disarm_timer();
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
        drop(self.take_session());
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

impl Session {
    /// Swaps the buffers and folds the one that was active into the counts. One drainer at
    /// a time (the mutex); handlers never take it.
    fn drain_inactive(&self) {
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
            let Drained { stacks, done } = &mut *drained;
            fold(buffer, done[old], cursor, stacks);
            done[old] = cursor.min(buffer.words.len());
            // Reset, unless a late handler (one that read `active` before the swap) has
            // reserved more space meanwhile; then fold that too.
            if buffer
                .state
                .compare_exchange(state, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                done[old] = 0;
                return;
            }
        }
    }

    /// Records one sample. Runs in the signal handler: see the module docs.
    ///
    /// # Safety
    /// `context` must be the `ucontext_t` the kernel passed to the handler.
    unsafe fn sample(&self, context: *mut libc::c_void) {
        // SAFETY: forwarded from the caller.
        let Some((pc, regs)) = (unsafe { registers(context) }) else {
            return;
        };
        let tid = current_tid();
        let mut frames = [0u64; MAX_DEPTH];
        let mut depth = 0usize;
        let mut flags = 0u8;
        if self.is_blocked(pc) {
            flags |= FLAG_BLOCKLISTED;
            frames[0] = pc;
            depth = 1;
        } else if !self.can_read_stack {
            flags |= FLAG_NO_STACK_READ;
            frames[0] = pc;
            depth = 1;
        } else if let Some(slot) = self.take_slot(tid) {
            // SAFETY: `take_slot` gave this handler exclusive use of the slot.
            let scratch = unsafe { &mut *slot.scratch.get() };
            let Scratch { cache, stack } = scratch;
            let mut reader = StackReader {
                pid: self.pid,
                sp: regs.sp(),
                copy: stack,
                copied: 0,
            };
            let mut read = |address: u64| reader.read(address);
            let mut frames_iter = self.unwinder.iter_frames(pc, regs, cache, &mut read);
            while depth < MAX_DEPTH {
                match frames_iter.next() {
                    Ok(Some(frame)) => {
                        let address = frame.address();
                        frames[depth] = address;
                        depth += 1;
                        // Do not unwind through a blocklisted library.
                        if depth > 1 && self.is_blocked(address.wrapping_sub(1)) {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            slot.busy.store(false, Ordering::Release);
        } else {
            flags |= FLAG_NO_SCRATCH;
            frames[0] = pc;
            depth = 1;
        }
        self.write(tid, flags, &frames[..depth]);
    }

    fn is_blocked(&self, address: u64) -> bool {
        let i = self.blocked.partition_point(|r| r.start <= address);
        i > 0 && self.blocked[i - 1].contains(&address)
    }

    fn take_slot(&self, tid: u32) -> Option<&Slot> {
        let n = self.slots.len();
        (0..n)
            .map(|i| &self.slots[(tid as usize + i) % n])
            .find(|slot| {
                slot.busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            })
    }

    /// Appends one record to the active buffer; async-signal-safe.
    fn write(&self, tid: u32, flags: u8, frames: &[u64]) {
        let buffer = &self.buffers[self.active.load(Ordering::Acquire)];
        let len = 1 + frames.len();
        let previous = buffer
            .state
            .fetch_add(WRITER + len as u64, Ordering::AcqRel);
        let at = (previous & CURSOR_MASK) as usize;
        if at + len <= buffer.words.len() {
            let header =
                MAGIC << 56 | u64::from(flags) << 48 | (frames.len() as u64) << 32 | u64::from(tid);
            buffer.words[at].store(header, Ordering::Relaxed);
            for (word, frame) in buffer.words[at + 1..at + len].iter().zip(frames) {
                word.store(*frame, Ordering::Relaxed);
            }
        } else {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        buffer.state.fetch_sub(WRITER, Ordering::Release);
    }
}

/// Folds records `from..to` of `buffer` into `stacks` and zeroes them. Stops at the first
/// empty header: space reserved by a sample that did not fit is never written.
fn fold(buffer: &Buffer, from: usize, to: usize, stacks: &mut HashMap<StackKey, u64>) {
    let words = &buffer.words;
    let end = to.min(words.len());
    let mut at = from;
    while at < end {
        let header = words[at].swap(0, Ordering::Relaxed);
        if header >> 56 != MAGIC {
            break;
        }
        let depth = ((header >> 32) & 0xffff) as usize;
        let Some(record) = words.get(at + 1..at + 1 + depth) else {
            break;
        };
        let frames: Box<[u64]> = record
            .iter()
            .map(|w| w.swap(0, Ordering::Relaxed))
            .collect();
        let key = StackKey {
            tid: header as u32,
            flags: (header >> 48) as u8,
            frames,
        };
        *stacks.entry(key).or_insert(0) += 1;
        at += 1 + depth;
    }
}

/// Reads the interrupted thread's stack through a lazily grown copy.
struct StackReader<'a> {
    pid: libc::pid_t,
    sp: u64,
    copy: &'a mut [u8],
    copied: usize,
}

impl StackReader<'_> {
    fn read(&mut self, address: u64) -> Result<u64, ()> {
        let offset = usize::try_from(address.checked_sub(self.sp).ok_or(())?).map_err(|_| ())?;
        let end = offset.checked_add(8).ok_or(())?;
        if end > self.copied {
            if end > self.copy.len() {
                return Err(());
            }
            // A frame can be larger than one step (a big array on the stack): copy step
            // by step until the address is covered or the stack ends.
            let want = (end.div_ceil(STACK_CHUNK) * STACK_CHUNK).min(self.copy.len());
            while self.copied < end {
                let before = self.copied;
                self.copy_more(want);
                if self.copied == before {
                    return Err(());
                }
            }
        }
        let bytes: [u8; 8] = self.copy[offset..end].try_into().map_err(|_| ())?;
        Ok(u64::from_ne_bytes(bytes))
    }

    /// Copies at most one step more of the stack, towards `want` bytes above `sp`, page by
    /// page so that a partial copy stops exactly at the first unmapped page.
    fn copy_more(&mut self, want: usize) {
        const MAX_IOV: usize = STACK_CHUNK / PAGE as usize + 1;
        let mut remote = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOV];
        let mut count = 0;
        let mut address = self.sp + self.copied as u64;
        let end = self.sp + want as u64;
        while address < end && count < MAX_IOV {
            let page_end = ((address / PAGE) + 1) * PAGE;
            let next = page_end.min(end);
            remote[count] = libc::iovec {
                iov_base: address as *mut libc::c_void,
                iov_len: (next - address) as usize,
            };
            count += 1;
            address = next;
        }
        let length = (address - (self.sp + self.copied as u64)) as usize;
        let local = libc::iovec {
            iov_base: self.copy[self.copied..].as_mut_ptr().cast(),
            iov_len: length,
        };
        // SAFETY: `local` is inside our own buffer; the remote ranges are only read, by the
        // kernel, which reports unmapped ones instead of faulting.
        let got =
            unsafe { libc::process_vm_readv(self.pid, &local, 1, remote.as_ptr(), count as _, 0) };
        if got > 0 {
            self.copied += got as usize;
        }
    }
}

/// Whether `process_vm_readv` on our own memory works here (seccomp may forbid it).
fn process_vm_readv_works() -> bool {
    let source = [0x5au8; 16];
    let mut target = [0u8; 16];
    let local = libc::iovec {
        iov_base: target.as_mut_ptr().cast(),
        iov_len: target.len(),
    };
    let remote = libc::iovec {
        iov_base: source.as_ptr() as *mut libc::c_void,
        iov_len: source.len(),
    };
    // SAFETY: both ranges are live locals of the right length.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    got == 16 && target == source
}

/// A framehop module for an object's in-memory unwind tables.
fn framehop_module(object: &LoadedObject) -> Option<Module<MemorySlice>> {
    let hdr = object.eh_frame_hdr.clone()?;
    let hdr_bytes = MemorySlice {
        ptr: hdr.start as *const u8,
        len: (hdr.end - hdr.start) as usize,
    };
    let eh_frame_start = eh_frame_address(&hdr_bytes, hdr.start)?;
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

/// Where `.eh_frame` starts, from the `eh_frame_ptr` field of `.eh_frame_hdr`.
fn eh_frame_address(hdr: &[u8], hdr_address: u64) -> Option<u64> {
    const DW_EH_PE_PCREL: u8 = 0x10;
    const DW_EH_PE_DATAREL: u8 = 0x30;
    if hdr.first() != Some(&1) {
        return None;
    }
    let encoding = *hdr.get(1)?;
    let field = hdr_address + 4;
    let (value, _) = read_encoded(hdr.get(4..)?, encoding & 0x0f)?;
    let base = match encoding & 0x70 {
        0 => 0,
        DW_EH_PE_PCREL => field,
        DW_EH_PE_DATAREL => hdr_address,
        _ => return None,
    };
    Some(base.wrapping_add(value as u64))
}

/// A DWARF pointer-encoded value of the given format.
fn read_encoded(bytes: &[u8], format: u8) -> Option<(i64, usize)> {
    let take = |n: usize| bytes.get(..n);
    Some(match format {
        0x00 | 0x04 => (u64::from_le_bytes(take(8)?.try_into().ok()?) as i64, 8),
        0x02 => (i64::from(u16::from_le_bytes(take(2)?.try_into().ok()?)), 2),
        0x03 => (i64::from(u32::from_le_bytes(take(4)?.try_into().ok()?)), 4),
        0x0a => (i64::from(i16::from_le_bytes(take(2)?.try_into().ok()?)), 2),
        0x0b => (i64::from(i32::from_le_bytes(take(4)?.try_into().ok()?)), 4),
        0x0c => (i64::from_le_bytes(take(8)?.try_into().ok()?), 8),
        _ => return None,
    })
}

/// The interrupted PC and unwind registers.
///
/// # Safety
/// `context` must be the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
#[cfg(target_arch = "x86_64")]
unsafe fn registers(context: *mut libc::c_void) -> Option<(u64, UnwindRegsNative)> {
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

/// The interrupted PC and unwind registers.
///
/// # Safety
/// `context` must be the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
#[cfg(target_arch = "aarch64")]
unsafe fn registers(context: *mut libc::c_void) -> Option<(u64, UnwindRegsNative)> {
    let context = context.cast::<libc::ucontext_t>();
    if context.is_null() {
        return None;
    }
    // SAFETY: the kernel's ucontext is valid for the handler's duration.
    let mcontext = unsafe { &(*context).uc_mcontext };
    let pc = mcontext.pc;
    Some((
        pc,
        UnwindRegsNative::new(mcontext.regs[30], mcontext.sp, mcontext.regs[29]),
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

fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The `SIGPROF` handler. See the module docs for what it may and may not do.
extern "C" fn on_sigprof(
    _signal: libc::c_int,
    _info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: errno is thread-local; reading and restoring it is what makes the handler
    // invisible to the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    RUNNING_HANDLERS.fetch_add(1, Ordering::SeqCst);
    let session = SESSION.load(Ordering::SeqCst);
    if !session.is_null() {
        // SAFETY: a non-null session stays alive until RUNNING_HANDLERS drops to zero
        // after it was cleared (see `retire`); `context` comes from the kernel.
        unsafe { (*session).sample(context) };
    }
    RUNNING_HANDLERS.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler (again, in case something replaced it since the last profile).
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

/// Arms `ITIMER_PROF` every `1/frequency` s of process CPU time.
fn set_timer(frequency: u32) -> Result<(), StartError> {
    let micros = (1_000_000 / i64::from(frequency.max(1))).max(1);
    setitimer_prof(libc::timeval {
        tv_sec: (micros / 1_000_000) as libc::time_t,
        tv_usec: (micros % 1_000_000) as libc::suseconds_t,
    })
}

fn disarm_timer() -> Result<(), StartError> {
    setitimer_prof(libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    })
}

/// `setitimer(ITIMER_PROF)` with this interval, first expiry included; zero disarms.
fn setitimer_prof(interval: libc::timeval) -> Result<(), StartError> {
    let timer = libc::itimerval {
        it_interval: interval,
        it_value: interval,
    };
    // SAFETY: setitimer reads the struct we pass.
    if unsafe { libc::setitimer(libc::ITIMER_PROF, &timer, std::ptr::null_mut()) } != 0 {
        return Err(StartError::System(
            "setitimer(ITIMER_PROF)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eh_frame_pointer_encodings() {
        // version 1, pcrel|sdata4, then -16 relative to the field at hdr+4.
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend((-16i32).to_le_bytes());
        assert_eq!(eh_frame_address(&hdr, 0x1000), Some(0x1000 + 4 - 16));
        let mut abs = vec![1u8, 0x04, 0x03, 0x3b];
        abs.extend(0x4242u64.to_le_bytes());
        assert_eq!(eh_frame_address(&abs, 0x1000), Some(0x4242));
        assert_eq!(
            eh_frame_address(&[2, 0x1b, 0, 0, 0, 0, 0, 0], 0),
            None,
            "unknown version"
        );
    }

    #[test]
    fn stack_reader_stops_at_unreadable_memory() {
        // A page we can read, followed by one we cannot: reads stop at the boundary.
        // SAFETY: mmap of two anonymous pages, the second then unmapped.
        let base = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            // Unreadable rather than unmapped: another test thread could map something in
            // a hole.
            libc::mprotect(
                p.cast::<u8>().add(PAGE as usize).cast(),
                PAGE as usize,
                libc::PROT_NONE,
            );
            (p as *mut u64).write(0x1122_3344_5566_7788);
            p as u64
        };
        let mut copy = vec![0u8; MAX_STACK_COPY];
        let mut reader = StackReader {
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            sp: base,
            copy: &mut copy,
            copied: 0,
        };
        assert_eq!(reader.read(base), Ok(0x1122_3344_5566_7788));
        assert_eq!(reader.read(base + PAGE - 8), Ok(0));
        assert_eq!(
            reader.read(base + PAGE),
            Err(()),
            "the unmapped page is not read"
        );
        assert_eq!(reader.read(base - 8), Err(()), "below the stack pointer");
        assert_eq!(reader.read(base + MAX_STACK_COPY as u64), Err(()));
        // SAFETY: unmapping the two pages mapped above.
        unsafe { libc::munmap(base as *mut libc::c_void, 2 * PAGE as usize) };
    }

    #[test]
    fn stack_reader_reaches_past_a_frame_larger_than_a_step() {
        let stack = vec![7u64; 40 * 1024 / 8];
        let mut copy = vec![0u8; MAX_STACK_COPY];
        let mut reader = StackReader {
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            sp: stack.as_ptr() as u64,
            copy: &mut copy,
            copied: 0,
        };
        let far = stack.as_ptr() as u64 + 36 * 1024;
        assert_eq!(reader.read(far), Ok(7), "36 KiB above sp, two steps away");
    }

    #[test]
    fn buffer_records_round_trip_and_overflow_is_counted() {
        let session = Session {
            unwinder: Unwinder::new(),
            blocked: Box::new([]),
            slots: Box::new([]),
            buffers: [Buffer::new(8), Buffer::new(8)],
            active: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
            pid: 0,
            can_read_stack: true,
            drained: Mutex::new(Drained::default()),
        };
        session.write(7, 0, &[1, 2, 3]);
        session.write(7, 0, &[1, 2, 3]);
        session.write(8, FLAG_BLOCKLISTED, &[9, 9, 9]); // does not fit: 4 + 4 + 4 > 8
        session.drain_inactive();
        session.write(9, 0, &[5]);
        session.drain_inactive();
        let drained = session.drained.lock().unwrap();
        let key = |tid, flags, frames: &[u64]| StackKey {
            tid,
            flags,
            frames: frames.into(),
        };
        assert_eq!(drained.stacks.get(&key(7, 0, &[1, 2, 3])), Some(&2));
        assert_eq!(drained.stacks.get(&key(9, 0, &[5])), Some(&1));
        assert_eq!(drained.stacks.len(), 2);
        assert_eq!(session.lost.load(Ordering::Relaxed), 1);
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
}
