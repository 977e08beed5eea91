//! Heap profiles from jemalloc's allocation sampling (feature `heap-profiling`): the
//! allocator users install, the `malloc_conf` that turns sampling on from process start,
//! availability checks that answer instead of panicking, the timed window for processes
//! where sampling is off, and the dump turned into a pprof `Profile` whose stacks start
//! at the allocation site.

use std::time::Duration;

#[cfg(not(all(
    feature = "heap-profiling",
    target_os = "linux",
    not(target_env = "musl")
)))]
use crate::proto::Profile;

/// Why heap profiles cannot be taken in this build, if they cannot: the 503's sentence and
/// the index page's note.
pub(crate) const UNAVAILABLE: Option<&str> = if !cfg!(target_os = "linux") {
    Some("heap profiling needs Linux: jemalloc_pprof reads the process's mappings from /proc")
} else if cfg!(target_env = "musl") {
    // jemalloc's configure finds no unwinder in musl and falls back to walking frame
    // pointers, which Rust code and musl do not keep: the first sampled allocation
    // would crash the process. So sampling stays off there.
    Some(
        "heap profiling needs a glibc build (…-linux-gnu): with musl, jemalloc can only \
         walk stacks by frame pointers, which would crash the process",
    )
} else if !cfg!(feature = "heap-profiling") {
    Some("heap profiling is compiled out: enable krabka-pprof's `heap-profiling` feature")
} else {
    None
};

/// What a heap request asks for, after defaults and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeapRequest {
    /// How long to sample if sampling is not already active.
    pub(crate) window: Duration,
}

/// Why a heap profile could not be produced.
#[derive(Debug)]
#[allow(
    dead_code,
    reason = "which variants can occur depends on the target and the features"
)]
pub(crate) enum HeapError {
    /// The crate was built without `heap-profiling`, or not for Linux.
    Unsupported(&'static str),
    /// jemalloc is not the global allocator.
    NotJemalloc,
    /// jemalloc was built without profiling support.
    NoProfilingSupport,
    /// jemalloc profiling is off (`prof:false` in `MALLOC_CONF`/`_RJEM_MALLOC_CONF`).
    ProfilingOff,
    /// A timed window is running; it ends in `retry_after`.
    Busy { retry_after: Duration },
    /// The dump or its parsing failed.
    Failed(String),
}

#[cfg(all(feature = "heap-profiling", not(target_env = "msvc")))]
pub use allocator::Jemalloc;

#[cfg(all(feature = "heap-profiling", not(target_env = "msvc")))]
mod allocator {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Set by the first allocation through [`Jemalloc`]: proof that it is the global
    /// allocator, which jemalloc itself cannot tell (its `stats` are compiled out).
    pub(crate) static IN_USE: AtomicBool = AtomicBool::new(false);

    /// jemalloc as the global allocator, with heap sampling on from process start.
    ///
    /// ```ignore
    /// #[global_allocator]
    /// static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;
    /// ```
    ///
    /// It is `tikv_jemallocator::Jemalloc` with the `profiling` feature; this crate also
    /// links a `malloc_conf` of `prof:true,prof_active:true,lg_prof_sample:19`, so the
    /// heap routes work with no environment variable. `MALLOC_CONF` (or
    /// `_RJEM_MALLOC_CONF`) still overrides it at start-up.
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
}

/// jemalloc reads `malloc_conf` before `main`. The symbol is `_rjem_malloc_conf` when
/// jemalloc's symbols are prefixed (tikv-jemalloc-sys's default) and `malloc_conf` when
/// another crate in the build turns on `unprefixed_malloc_on_supported_platforms`; both are
/// defined, so either build reads this setting. `#[used]` plus the export makes rustc's
/// synthetic object reference them, so the linker keeps them even though nothing in Rust
/// does (jemalloc's own weak definition would otherwise win silently).
#[cfg(all(
    feature = "heap-profiling",
    target_os = "linux",
    not(target_env = "musl")
))]
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

/// Takes one heap profile and hands it to `render` on the blocking pool.
#[cfg(not(all(
    feature = "heap-profiling",
    target_os = "linux",
    not(target_env = "musl")
)))]
pub(crate) async fn profile<R, F>(_request: HeapRequest, _render: F) -> Result<R, HeapError>
where
    F: FnOnce(Profile) -> Result<R, HeapError> + Send + 'static,
    R: Send + 'static,
{
    Err(HeapError::Unsupported(
        UNAVAILABLE.unwrap_or("heap profiling is not available"),
    ))
}

#[cfg(all(
    feature = "heap-profiling",
    target_os = "linux",
    not(target_env = "musl")
))]
pub(crate) use linux::profile;

#[cfg(all(
    feature = "heap-profiling",
    target_os = "linux",
    not(target_env = "musl")
))]
mod linux {
    use std::io::BufReader;
    use std::sync::atomic::Ordering;
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, Instant, SystemTime};

    use crate::proto::Profile;
    use tikv_jemalloc_ctl::raw;

    use super::{HeapError, HeapRequest};
    use crate::objects::Objects;
    use crate::profile::{Frame, Meta, ProfileBuilder};

    /// The end of the running timed window, if one runs.
    static WINDOW: Mutex<Option<Instant>> = Mutex::new(None);

    /// Holds the timed window for one request. [`finish`](Self::finish) switches sampling
    /// back off and frees the window before the response leaves; dropping it unfinished
    /// (the client hung up) does the same on the blocking pool.
    struct WindowSlot {
        finished: bool,
    }

    /// What a request gets to do, decided under the window lock so that no request can
    /// see sampling active because another request's window just switched it on.
    enum Plan {
        /// Sampling is active on its own: dump at once.
        DumpNow,
        /// Sampling is off: this request runs a window.
        Window(WindowSlot),
    }

    fn plan(window: Duration) -> Result<Plan, HeapError> {
        let mut running = WINDOW.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ends_at) = *running {
            return Err(HeapError::Busy {
                retry_after: ends_at.saturating_duration_since(Instant::now()),
            });
        }
        if state()? {
            return Ok(Plan::DumpNow);
        }
        *running = Some(Instant::now() + window);
        Ok(Plan::Window(WindowSlot { finished: false }))
    }

    /// Switches sampling off (which also resets jemalloc's samples) and frees the window.
    fn end_window() {
        if let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() {
            let _ = ctl.blocking_lock().deactivate();
        }
        *WINDOW.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    impl WindowSlot {
        /// Ends the window; call on the blocking pool.
        fn finish(mut self) {
            self.finished = true;
            end_window();
        }
    }

    impl Drop for WindowSlot {
        fn drop(&mut self) {
            if self.finished {
                return;
            }
            // Resetting walks jemalloc's samples: not on an async worker.
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => drop(handle.spawn_blocking(end_window)),
                Err(_) => end_window(),
            }
        }
    }

    async fn blocking<T, F>(f: F) -> Result<T, HeapError>
    where
        F: FnOnce() -> Result<T, HeapError> + Send + 'static,
        T: Send + 'static,
    {
        crate::on_blocking_pool(f, HeapError::Failed).await
    }

    /// Whether jemalloc samples this process's heap, and whether sampling is active now.
    fn state() -> Result<bool, HeapError> {
        if !super::allocator::IN_USE.load(Ordering::Relaxed) {
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

    /// Takes one heap profile and hands it to `render` on the blocking pool: at once if
    /// sampling is active, else after sampling for `request.window`.
    pub(crate) async fn profile<R, F>(request: HeapRequest, render: F) -> Result<R, HeapError>
    where
        F: FnOnce(Profile) -> Result<R, HeapError> + Send + 'static,
        R: Send + 'static,
    {
        let window = request.window;
        // Deciding, taking the window and switching sampling on happen in one blocking
        // call, and the slot exists only once sampling is on: if the client hangs up at
        // any point, dropping the slot (here, or with the call's unread result) switches
        // sampling off after it was switched on, never before.
        let slot = match blocking(move || match plan(window)? {
            Plan::DumpNow => Ok(None),
            Plan::Window(slot) => {
                let ctl = jemalloc_pprof::PROF_CTL
                    .as_ref()
                    .ok_or(HeapError::ProfilingOff)?;
                ctl.blocking_lock().activate().map_err(|e| {
                    HeapError::Failed(format!("activating heap sampling failed: {e}"))
                })?;
                Ok(Some(slot))
            }
        })
        .await?
        {
            None => return blocking(move || render(dump(Duration::ZERO)?)).await,
            Some(slot) => slot,
        };
        tokio::time::sleep(window).await;
        blocking(move || {
            let profile = dump(window);
            slot.finish();
            render(profile?)
        })
        .await
    }

    /// Dumps jemalloc's samples and builds the profile.
    fn dump(window: Duration) -> Result<Profile, HeapError> {
        let ctl = jemalloc_pprof::PROF_CTL
            .as_ref()
            .ok_or(HeapError::ProfilingOff)?;
        let file = ctl
            .blocking_lock()
            .dump()
            .map_err(|e| HeapError::Failed(format!("jemalloc's heap dump failed: {e}")))?;
        let parsed = parse(BufReader::new(file))
            .map_err(|e| HeapError::Failed(format!("jemalloc's heap dump is unreadable: {e}")))?;
        Ok(build(&parsed, window))
    }

    /// One stack of a jemalloc `heap_v2` dump, its sampled counts unbiased.
    #[derive(Debug, PartialEq)]
    pub(super) struct HeapStack {
        /// Return addresses, allocator first.
        pub(super) addresses: Vec<u64>,
        pub(super) objects: f64,
        pub(super) bytes: f64,
    }

    #[derive(Debug, PartialEq)]
    pub(super) struct Parsed {
        pub(super) period: u64,
        pub(super) stacks: Vec<HeapStack>,
    }

    /// Parses a `heap_v2/<period>` dump. jemalloc samples an allocation of `size` bytes
    /// with probability `1 - exp(-size / period)`; like jeprof, each stack's counts are
    /// divided by that probability (with its average object size), which estimates what is
    /// really live: both `inuse_space` and `inuse_objects` are derived this way.
    pub(super) fn parse(reader: impl std::io::BufRead) -> Result<Parsed, String> {
        let mut lines = reader.lines();
        let first = lines
            .next()
            .ok_or("the dump is empty")?
            .map_err(|e| e.to_string())?;
        let period: u64 = first
            .trim()
            .strip_prefix("heap_v2/")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("unexpected first line {first:?}"))?;
        let mut stacks = Vec::new();
        let mut pending: Option<Vec<u64>> = None;
        for line in lines {
            let line = line.map_err(|e| e.to_string())?;
            let line = line.trim();
            if line == "MAPPED_LIBRARIES:" {
                break;
            }
            if let Some(rest) = line.strip_prefix('@') {
                let addresses = rest
                    .split_whitespace()
                    .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("bad address in {line:?}: {e}"))?;
                pending = Some(addresses);
            } else if let Some(rest) = line.strip_prefix("t*:") {
                let Some(addresses) = pending.take() else {
                    continue; // the process-wide total before the first stack
                };
                let mut numbers = rest
                    .split(|c: char| c == ':' || c == '[' || c == ']' || c.is_whitespace())
                    .filter(|s| !s.is_empty());
                let objects: f64 = numbers
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("objects")?;
                let bytes: f64 = numbers.next().and_then(|n| n.parse().ok()).ok_or("bytes")?;
                if objects <= 0.0 || bytes <= 0.0 {
                    continue;
                }
                let ratio = (bytes / objects) / period as f64;
                let scale = 1.0 / (1.0 - (-ratio).exp());
                stacks.push(HeapStack {
                    addresses,
                    objects: objects * scale,
                    bytes: bytes * scale,
                });
            }
        }
        Ok(Parsed { period, stacks })
    }

    /// Frames of the allocator and of Rust's allocation plumbing, hidden from the leaf end
    /// of every stack so that it starts where the program allocated: jemalloc, the
    /// allocator shims, and generic code of `alloc` and `core` (`core` has no allocator:
    /// a `core` frame above an allocation is plumbing between `alloc` and the caller).
    /// The program's own impls of core traits (`<my::Type as core::fmt::Display>::fmt`)
    /// are kept: they are where the program allocated.
    pub(super) fn is_allocator_frame(name: &str) -> bool {
        const PREFIXES: &[&str] = &[
            // jemalloc, static functions and prefixed exports.
            "prof_",
            "_rjem_",
            "je_",
            "imalloc",
            "ialloc",
            "irealloc",
            "iralloc",
            "arena_",
            "tcache_",
            // Rust's allocator shims (`__rustc::` in v0 mangling).
            "__rust_",
            "__rg_",
            "__rdl_",
            "__rustc::",
            // The global allocators.
            "tikv_jemallocator::",
            "<tikv_jemallocator::",
            "std::alloc::",
            "<std::alloc::",
            "krabka_pprof::heap::allocator::",
            "<krabka_pprof::heap::allocator::",
        ];
        const NAMES: &[&str] = &[
            "malloc",
            "calloc",
            "realloc",
            "free",
            "mallocx",
            "rallocx",
            "xallocx",
            "posix_memalign",
            "aligned_alloc",
            "memalign",
            "valloc",
            "do_rallocx",
            "[unknown]",
        ];
        PREFIXES.iter().any(|p| name.starts_with(p))
            || NAMES.contains(&name)
            || is_core_or_alloc(name)
    }

    /// `core::…`, `alloc::…`, `<core or alloc type>::…`, and `<T as Trait>::…` where both
    /// the type and the trait are core's or alloc's (a primitive or a type parameter
    /// counts as core's).
    fn is_core_or_alloc(name: &str) -> bool {
        let library = |path: &str| path.starts_with("core::") || path.starts_with("alloc::");
        let Some(qualified) = name.strip_prefix('<') else {
            return library(name);
        };
        // Split `Type as Trait>::method` at the ` as ` and `>` of the outer brackets.
        let mut depth = 0usize;
        let mut split = None;
        let mut end = None;
        for (i, c) in qualified.char_indices() {
            match c {
                '<' | '[' | '(' => depth += 1,
                ']' | ')' => depth = depth.saturating_sub(1),
                '>' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                '>' => depth -= 1,
                ' ' if depth == 0 && split.is_none() && qualified[i..].starts_with(" as ") => {
                    split = Some(i);
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            return false;
        };
        let library_type = |ty: &str| {
            let ty = ty
                .trim_start_matches(['&', '*'])
                .trim_start_matches("mut ")
                .trim();
            library(ty) || !ty.contains("::")
        };
        match split {
            Some(at) => library_type(&qualified[..at]) && library(&qualified[at + 4..end]),
            None => library(&qualified[..end]),
        }
    }

    fn build(parsed: &Parsed, window: Duration) -> Profile {
        let objects = Objects::current();
        let mut builder = ProfileBuilder::new(&objects);
        for stack in &parsed.stacks {
            // Every address is a return address: minus one lands inside the call.
            let frames = stack
                .addresses
                .iter()
                .map(|a| Frame::Code(a.saturating_sub(1)))
                .collect();
            builder.add(
                frames,
                vec![stack.objects.round() as i64, stack.bytes.round() as i64],
                Vec::new(),
            );
        }
        let time_nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        builder.finish(
            &Meta {
                sample_types: &[("inuse_objects", "count"), ("inuse_space", "bytes")],
                period_type: ("space", "bytes"),
                period: parsed.period as i64,
                time_nanos,
                duration_nanos: window.as_nanos() as i64,
                default_sample_type: Some("inuse_space"),
                comments: Vec::new(),
            },
            &is_allocator_frame,
        )
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const DUMP: &str = "heap_v2/524288
  t*: 30: 67108864 [0: 0]
  t0: 30: 67108864 [0: 0]
@ 0x10 0x20 0x30
  t*: 1: 1048576 [0: 0]
  t0: 1: 1048576 [0: 0]
@ 0x11 0x21
  t*: 4: 1024 [0: 0]
@ 0x12
  t*: 0: 0 [0: 0]

MAPPED_LIBRARIES:
55d5b4e4b000-55d5b4e9a000 r--p 00000000 08:01 1234 /bin/app
";

        #[test]
        fn parses_and_unbiases_like_jeprof() {
            let parsed = parse(DUMP.as_bytes()).unwrap();
            assert_eq!(parsed.period, 524_288);
            assert_eq!(parsed.stacks.len(), 2, "empty stacks are skipped");
            let big = &parsed.stacks[0];
            assert_eq!(big.addresses, [0x10, 0x20, 0x30]);
            // 1 MiB objects are sampled with probability 1 - e^-2.
            let p = 1.0 - (-2.0f64).exp();
            assert!((big.bytes - 1_048_576.0 / p).abs() < 1.0);
            assert!((big.objects - 1.0 / p).abs() < 1e-9);
            // 256-byte objects are rarely sampled: each sample stands for ~2048 of them.
            let small = &parsed.stacks[1];
            let p = 1.0 - (-(256.0f64 / 524_288.0)).exp();
            assert!((small.objects - 4.0 / p).abs() < 1e-6);
        }

        #[test]
        fn bad_dumps_are_errors() {
            assert!(parse("".as_bytes()).is_err());
            assert!(parse("heap_v1/x\n".as_bytes()).is_err());
            assert!(parse("heap_v2/524288\n@ 0xzz\n".as_bytes()).is_err());
        }

        #[test]
        fn allocator_frames() {
            for hidden in [
                "prof_backtrace_impl",
                "_rjem_je_prof_backtrace",
                "_rjem_malloc",
                "malloc",
                "__rust_alloc",
                "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
                "<alloc::alloc::Global as core::alloc::Allocator>::allocate",
                "<tikv_jemallocator::Jemalloc as core::alloc::global::GlobalAlloc>::alloc",
                "<krabka_pprof::heap::allocator::Jemalloc as core::alloc::global::GlobalAlloc>::alloc",
                "__rustc::__rust_alloc",
                "<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem",
                "core::option::Option<T>::map_or_else",
                "core::iter::traits::iterator::Iterator::collect",
                "<core::iter::adapters::map::Map<I,F> as core::iter::traits::iterator::Iterator>::fold",
                "<alloc::vec::Vec<T> as alloc::vec::spec_from_iter::SpecFromIter<T,I>>::from_iter",
                "<[T] as alloc::slice::hack::ConvertVec>::to_vec",
                "<&str as alloc::string::ToString>::to_string",
            ] {
                assert!(is_allocator_frame(hidden), "{hidden}");
            }
            for kept in [
                "my_app::cache::fill",
                "mallocation_site",
                "std::io::read_to_end",
                "<my_app::Cache as my_app::Fill>::fill",
                "<my_app::Report as core::fmt::Display>::fmt",
                "<core::option::Option<my_app::X> as my_app::Load>::load",
                "<my_app::Name as alloc::borrow::ToOwned>::to_owned",
                "my_app::fill_name_index::{{closure}}",
            ] {
                assert!(!is_allocator_frame(kept), "{kept}");
            }
        }
    }
}
