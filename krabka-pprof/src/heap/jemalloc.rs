//! The jemalloc glue: [`Jemalloc`], the allocator users install (it notes that it is in
//! use, which jemalloc cannot tell); the `malloc_conf` that turns sampling on from process
//! start; and, where dumps exist, reading jemalloc's state and dumping its samples through
//! `jemalloc_pprof`'s control handle, without ever letting it panic. Built with the
//! `heap-profiling` feature wherever jemalloc builds (`cfg(jemalloc)`).

use std::alloc::{GlobalAlloc, Layout};
#[cfg(heap_dumps)]
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(heap_dumps)]
use tikv_jemalloc_ctl::raw;

#[cfg(heap_dumps)]
use super::dump::{Parsed, parse};
#[cfg(heap_dumps)]
use super::request::HeapError;

/// Set by the first allocation through [`Jemalloc`]: proof that it is the global
/// allocator without asking jemalloc (see [`serves_the_global_allocator`] for the
/// others, `tikv_jemallocator::Jemalloc` among them).
pub(crate) static IN_USE: AtomicBool = AtomicBool::new(false);

#[cfg(heap_dumps)]
/// Whether jemalloc serves this process's global allocator: through [`Jemalloc`], or
/// through any other wrapper of the same jemalloc (a service already on
/// `tikv_jemallocator::Jemalloc`, whose jemalloc is this crate's: one crate links it,
/// and cargo unifies its `profiling` feature). Asked of jemalloc once: the bytes this
/// thread allocated through it (`thread.allocated`, which the `stats` feature keeps)
/// grow by an allocation made through the global allocator only if jemalloc served it.
/// The answer cannot change for the life of the process.
pub(crate) fn serves_the_global_allocator() -> bool {
    static SERVES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if IN_USE.load(Ordering::Relaxed) {
        return true;
    }
    *SERVES.get_or_init(|| {
        const PROBE: usize = 64 * 1024;
        // SAFETY: "thread.allocated" is a documented read-only u64 (with stats).
        let allocated = || unsafe { raw::read::<u64>(b"thread.allocated\0") }.ok();
        let Some(before) = allocated() else {
            return false;
        };
        let probe = std::hint::black_box(Vec::<u8>::with_capacity(PROBE));
        let after = allocated().unwrap_or(before);
        drop(probe);
        after.saturating_sub(before) >= PROBE as u64
    })
}

/// jemalloc as the global allocator, with heap sampling on from process start.
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;
/// ```
///
/// It is `tikv_jemallocator::Jemalloc` with the `profiling` feature; this crate also
/// links a `malloc_conf` of `prof:true,prof_active:true,lg_prof_sample:19`, so the
/// heap routes work with no environment variable. `_RJEM_MALLOC_CONF` still overrides it
/// at start-up; plain `MALLOC_CONF` is read only by a build whose jemalloc symbols are
/// unprefixed (another crate turning on tikv-jemalloc-sys's
/// `unprefixed_malloc_on_supported_platforms`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Jemalloc;

#[inline]
fn mark() {
    // A read almost always, a write once: the flag's cache line stays shared.
    if !IN_USE.load(Ordering::Relaxed) {
        IN_USE.store(true, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to tikv_jemallocator's implementation, which upholds
// the `GlobalAlloc` contract.
unsafe impl GlobalAlloc for Jemalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        mark();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { tikv_jemallocator::Jemalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        mark();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { tikv_jemallocator::Jemalloc.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { tikv_jemallocator::Jemalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size) }
    }
}

/// jemalloc reads `malloc_conf` before `main`. The symbol is `_rjem_malloc_conf` when
/// jemalloc's symbols are prefixed (tikv-jemalloc-sys's default) and `malloc_conf` when
/// another crate in the build turns on `unprefixed_malloc_on_supported_platforms`; both are
/// defined, so either build reads this setting. `#[used]` plus the export makes rustc's
/// synthetic object reference them, so the linker keeps them even though nothing in Rust
/// does (jemalloc's own weak definition would otherwise win silently).
#[cfg(heap_dumps)]
mod conf {
    /// A C string pointer that may live in a `static`.
    #[repr(transparent)]
    pub struct ConfString(*const u8);

    // SAFETY: it points to a string literal, immutable and 'static.
    unsafe impl Sync for ConfString {}

    const CONF: &[u8] = b"prof:true,prof_active:true,lg_prof_sample:19\0";

    #[used]
    #[unsafe(export_name = "_rjem_malloc_conf")]
    pub static PREFIXED: ConfString = ConfString(CONF.as_ptr());

    #[used]
    #[unsafe(export_name = "malloc_conf")]
    pub static UNPREFIXED: ConfString = ConfString(CONF.as_ptr());
}

#[cfg(heap_dumps)]
/// Whether jemalloc samples this process's heap, and whether sampling is active now.
pub(super) fn state() -> Result<bool, HeapError> {
    if !serves_the_global_allocator() {
        return Err(HeapError::NotJemalloc);
    }
    // Read `opt.prof` ourselves first: jemalloc_pprof's PROF_CTL unwraps it and would
    // panic (and poison itself) in a jemalloc built without profiling.
    // SAFETY: "opt.prof" is a documented read-only bool.
    match unsafe { raw::read::<bool>(b"opt.prof\0") } {
        Err(_) => Err(HeapError::NoProfilingSupport),
        Ok(false) => Err(HeapError::ProfilingOff),
        // SAFETY: "prof.active" is a documented read-write bool.
        Ok(true) => unsafe { raw::read::<bool>(b"prof.active\0") }
            .map_err(|e| HeapError::Failed(format!("reading prof.active failed: {e}"))),
    }
}

#[cfg(heap_dumps)]
/// Whether jemalloc keeps the allocated counts of every sampled stack (`prof_accum:true`,
/// which only a user's `_RJEM_MALLOC_CONF` turns on): its dumps' brackets then hold them.
/// Read only where `opt.prof` is on (it reads back as configured even when it is off).
pub(super) fn prof_accum() -> bool {
    // SAFETY: documented read-only bools.
    unsafe {
        raw::read::<bool>(b"opt.prof\0").unwrap_or(false)
            && raw::read::<bool>(b"opt.prof_accum\0").unwrap_or(false)
    }
}

#[cfg(heap_dumps)]
/// Switches sampling on for a window.
pub(super) fn switch_sampling_on() -> Result<(), HeapError> {
    let ctl = jemalloc_pprof::PROF_CTL
        .as_ref()
        .ok_or(HeapError::ProfilingOff)?;
    ctl.blocking_lock()
        .activate()
        .map_err(|e| HeapError::Failed(format!("activating heap sampling failed: {e}")))
}

#[cfg(heap_dumps)]
/// Switches sampling off after a window, and resets jemalloc's samples so that the next
/// window starts empty, unless jemalloc keeps allocated counts (`prof_accum`): a reset
/// would then leak every stack it keeps and make the counts go down, so sampling is only
/// switched off.
pub(super) fn switch_sampling_off() {
    if prof_accum() {
        // SAFETY: "prof.active" is a documented read-write bool.
        let _ = unsafe { raw::write(b"prof.active\0", false) };
    } else if let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() {
        let _ = ctl.blocking_lock().deactivate();
    }
}

#[cfg(heap_dumps)]
/// Dumps jemalloc's samples, parsed. jemalloc writes a dump only to a named file: the name
/// given is `/proc/self/fd/N` of an in-memory file (`memfd_create`), so no filesystem
/// needs to be writable (a read-only root, no `TMPDIR`). Where the kernel has no memfd
/// (before 3.17), `jemalloc_pprof`'s temporary file as before.
pub(super) fn dump() -> Result<Parsed, HeapError> {
    use std::io::{Seek as _, SeekFrom};
    use std::os::fd::{AsRawFd as _, FromRawFd as _};

    let ctl = jemalloc_pprof::PROF_CTL
        .as_ref()
        .ok_or(HeapError::ProfilingOff)?;
    // Held across the dump: jemalloc_pprof's own dumps and (de)activations wait for it.
    let mut ctl = ctl.blocking_lock();
    // SAFETY: a NUL-terminated name; memfd_create has no other precondition.
    let fd = unsafe { libc::memfd_create(c"krabka-pprof-heap".as_ptr(), libc::MFD_CLOEXEC) };
    let mut file = if fd >= 0 {
        // SAFETY: a new descriptor that nothing else owns.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        let path = format!("/proc/self/fd/{}\0", file.as_raw_fd());
        // SAFETY: "prof.dump" takes a NUL-terminated file name, which outlives the call.
        unsafe { raw::write(b"prof.dump\0", path.as_ptr()) }.map_err(|e| {
            HeapError::Failed(format!(
                "jemalloc's heap dump into memory failed ({e}): is /proc mounted?"
            ))
        })?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| HeapError::Failed(format!("jemalloc's heap dump is unreadable: {e}")))?;
        file
    } else {
        ctl.dump().map_err(|e| {
            HeapError::Failed(format!(
                "jemalloc's heap dump failed: {e} (this kernel has no memfd_create, so the \
                 dump goes through a file in TMPDIR, which must be writable)"
            ))
        })?
    };
    drop(ctl);
    let parsed = parse(BufReader::new(&mut file));
    parsed.map_err(|e| HeapError::Failed(format!("jemalloc's heap dump is unreadable: {e}")))
}
