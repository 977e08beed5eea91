//! The pure half of heap profiles: jemalloc's `heap_v2` dump parsed into unbiased stacks,
//! and the allocator frames trimmed from their leaf end. No jemalloc and no `cfg` here, so
//! both are compiled and unit-tested on every target and without features; `heap.rs`
//! calls them where dumps exist.

use crate::symbolize::FunctionLine;

/// One stack of a jemalloc `heap_v2` dump, its sampled counts unbiased.
#[derive(Debug, PartialEq)]
pub(super) struct HeapStack {
    /// Return addresses, allocator first.
    pub(super) addresses: Vec<u64>,
    /// In use.
    pub(super) objects: f64,
    pub(super) bytes: f64,
    /// Allocated since start: the brackets, which jemalloc fills only with `prof_accum`.
    pub(super) alloc_objects: f64,
    pub(super) alloc_bytes: f64,
}

#[derive(Debug, PartialEq)]
pub(super) struct Parsed {
    pub(super) period: u64,
    pub(super) stacks: Vec<HeapStack>,
}

/// Parses a `heap_v2/<period>` dump. jemalloc samples an allocation of `size` bytes
/// with probability `1 - exp(-size / period)`; like jeprof, each stack's counts are
/// divided by that probability (with its average object size), which estimates what is
/// really live: both `inuse_space` and `inuse_objects` are derived this way, and the
/// bracketed allocated counts (`[objects: bytes]`, non-zero only with `prof_accum`) the
/// same way. A stack is kept if either pair is non-zero.
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
            // `t*: <objects>: <bytes> [<allocated objects>: <allocated bytes>]`.
            let mut numbers = rest
                .split(|c: char| matches!(c, ':' | '[' | ']') || c.is_whitespace())
                .filter(|s| !s.is_empty());
            let objects: f64 = numbers
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or("objects")?;
            let bytes: f64 = numbers.next().and_then(|n| n.parse().ok()).ok_or("bytes")?;
            // Absent brackets (an older dump) are nothing allocated.
            let mut bracket = || numbers.next().and_then(|n| n.parse::<f64>().ok());
            let (alloc_objects, alloc_bytes) = (bracket().unwrap_or(0.0), bracket().unwrap_or(0.0));
            for n in [objects, bytes, alloc_objects, alloc_bytes] {
                if !n.is_finite() {
                    return Err(format!("counts that are not numbers in {line:?}"));
                }
            }
            let (objects, bytes) = unbias(objects, bytes, period, line)?;
            let (alloc_objects, alloc_bytes) = unbias(alloc_objects, alloc_bytes, period, line)?;
            if bytes == 0.0 && alloc_bytes == 0.0 {
                continue;
            }
            stacks.push(HeapStack {
                addresses,
                objects,
                bytes,
                alloc_objects,
                alloc_bytes,
            });
        }
    }
    Ok(Parsed { period, stacks })
}

/// jeprof's estimate of what sampled counts stand for: divided by the chance that an
/// object of their average size was sampled. Counts that are not both positive are
/// nothing.
fn unbias(objects: f64, bytes: f64, period: u64, line: &str) -> Result<(f64, f64), String> {
    if objects <= 0.0 || bytes <= 0.0 {
        return Ok((0.0, 0.0));
    }
    let ratio = (bytes / objects) / period as f64;
    // 1 - e^-ratio, exact for tiny ratios too (where 1 - exp() rounds to 0).
    let probability = -(-ratio).exp_m1();
    let (objects, bytes) = (objects / probability, bytes / probability);
    if !objects.is_finite() || !bytes.is_finite() {
        return Err(format!("counts out of range in {line:?}"));
    }
    Ok((objects, bytes))
}

/// How many of a location's lines (innermost first) are the allocator's, from the leaf:
/// all of them if the location is the allocator's own code, else the leading lines
/// inlined into the program's function (`alloc::alloc::alloc`, `RawVec…`, the allocator's
/// `alloc`, inlined into the function that made the `Vec`), which the profile trims so
/// that the stack starts at the allocation site. A location jemalloc's C code owns (its
/// outermost function the allocator's) is the allocator's whole, whatever C helpers were
/// inlined into it: jemalloc never inlines the program's code. A location with no
/// functions (`symbolize=none`) is kept whole.
pub(super) fn allocator_lines(lines: &[FunctionLine]) -> usize {
    let leading = lines
        .iter()
        .take_while(|line| is_allocator_line(line))
        .count();
    let Some((outer, inner)) = lines.split_last() else {
        return 0;
    };
    if leading < lines.len()
        && is_allocator_line(outer)
        && inner
            .iter()
            .all(|line| is_allocator_line(line) || is_c_source(&line.filename))
    {
        return lines.len();
    }
    leading
}

/// One line of a location is the allocator's or Rust's allocation plumbing: by its name
/// ([`is_allocator_frame`]), or, for the plain names that DWARF of `line-tables-only`
/// builds gives inlined functions (`with_capacity<u8>`, `alloc`, `try_allocate_in`, no
/// path), by the source file its code is in: Rust's `alloc` and `core` libraries, the
/// jemalloc allocator crates, this crate's `Jemalloc`.
fn is_allocator_line(line: &FunctionLine) -> bool {
    let file = line.filename.as_str();
    is_allocator_frame(&line.name)
        || file.contains("library/alloc/src/")
        || file.contains("library/core/src/")
        || file.contains("tikv-jemallocator")
        || file.contains("tikv-jemalloc-sys")
        || (file.contains("krabka-pprof") && file.ends_with("src/heap/jemalloc.rs"))
}

fn is_c_source(filename: &str) -> bool {
    filename.ends_with(".c") || filename.ends_with(".h")
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
        "krabka_pprof::heap::jemalloc::",
        "<krabka_pprof::heap::jemalloc::",
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
        || is_global_alloc_method(name)
}

/// A method of any `GlobalAlloc` impl: `<my_app::Counting as
/// core::alloc::global::GlobalAlloc>::alloc`. Services wrap their allocator (to count, to
/// choose one at start-up); the wrapper is the allocator as much as jemalloc is.
fn is_global_alloc_method(name: &str) -> bool {
    name.starts_with('<') && name.contains(" as core::alloc::global::GlobalAlloc>::")
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn counts_that_are_not_both_positive_are_nothing() {
        for (objects, bytes) in [(0.0, 4096.0), (3.0, 0.0), (0.0, 0.0), (-1.0, 4096.0)] {
            assert_eq!(
                unbias(objects, bytes, 524_288, "line"),
                Ok((0.0, 0.0)),
                "{objects} objects of {bytes} bytes"
            );
        }
        let (objects, bytes) = unbias(1.0, 524_288.0, 524_288, "line").unwrap();
        let p = 1.0 - (-1.0f64).exp();
        assert!((objects - 1.0 / p).abs() < 1e-9 && (bytes - 524_288.0 / p).abs() < 1e-6);
    }

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

    /// A dump's lines, jemalloc's and not: headers, stacks, counts of every kind (huge,
    /// negative, not numbers), the library section, and anything at all.
    fn dump_lines() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|n| n.to_string()),
            prop::sample::select(vec!["NaN", "inf", "-inf", "-1", "0", "1e308", "", "x"])
                .prop_map(str::to_owned),
        ];
        let line = prop_oneof![
            number.clone().prop_map(|n| format!("heap_v2/{n}")),
            prop::collection::vec(any::<u64>(), 0..4).prop_map(|addresses| {
                let hex: Vec<String> = addresses.iter().map(|a| format!("0x{a:x}")).collect();
                format!("@ {}", hex.join(" "))
            }),
            (number.clone(), number.clone(), number.clone(), number)
                .prop_map(|(o, b, ao, ab)| format!("  t*: {o}: {b} [{ao}: {ab}]")),
            Just("MAPPED_LIBRARIES:".to_owned()),
            any::<String>(),
        ];
        prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n"))
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn any_text_is_a_dump_or_an_error_never_a_panic(
            text in prop_oneof![
                dump_lines(),
                dump_lines().prop_map(|lines| format!("heap_v2/524288\n{lines}")),
                any::<String>(),
            ]
        ) {
            if let Ok(parsed) = parse(text.as_bytes()) {
                for stack in &parsed.stacks {
                    for n in [stack.objects, stack.bytes, stack.alloc_objects, stack.alloc_bytes] {
                        prop_assert!(n.is_finite() && n >= 0.0, "{stack:?} from {text:?}");
                    }
                    prop_assert!(
                        stack.bytes > 0.0 || stack.alloc_bytes > 0.0,
                        "{stack:?} from {text:?}"
                    );
                    prop_assert_eq!(stack.objects > 0.0, stack.bytes > 0.0);
                }
            }
        }
    }

    #[test]
    fn bad_dumps_are_errors() {
        assert!(parse("".as_bytes()).is_err());
        assert!(parse("heap_v1/x\n".as_bytes()).is_err());
        assert!(parse("heap_v2/524288\n@ 0xzz\n".as_bytes()).is_err());
        assert!(parse("heap_v2/524288\n@ 0x10\nt*: NaN: 1 [0: 0]\n".as_bytes()).is_err());
        // Either count alone not a number is enough, and is called that.
        for line in ["t*: inf: 4096 [0: 0]", "t*: 1: inf [0: 0]"] {
            let dump = format!("heap_v2/524288\n@ 0x10\n{line}\n");
            let err = parse(dump.as_bytes()).expect_err("an error");
            assert!(err.contains("counts that are not numbers"), "{line}: {err}");
        }
        // A tiny ratio: 1 - exp(-x) rounds to 0 (an infinite weight); exp_m1 does not.
        let tiny = "heap_v2/524288\n@ 0x10\nt*: 1: 1e-12 [0: 0]\n";
        let parsed = parse(tiny.as_bytes()).unwrap();
        assert!((parsed.stacks[0].bytes - 524_288.0).abs() < 1.0);
        // So tiny that the weight overflows all the same: an error, not infinity.
        let tinier = "heap_v2/524288\n@ 0x10\nt*: 1: 1e-310 [0: 0]\n";
        assert!(parse(tinier.as_bytes()).is_err());
    }

    #[test]
    fn the_brackets_are_what_prof_accum_counted_unbiased_the_same_way() {
        let dump = "heap_v2/524288\n@ 0x10\n  t*: 0: 0 [367: 7351620]\n@ 0x11\n  t*: 2: 131072 [8: 524288]\n";
        let parsed = parse(dump.as_bytes()).unwrap();
        assert_eq!(
            parsed.stacks.len(),
            2,
            "a stack with nothing live is kept for what it allocated"
        );
        let freed = &parsed.stacks[0];
        assert_eq!((freed.objects, freed.bytes), (0.0, 0.0));
        let p = -(-(7_351_620.0f64 / 367.0) / 524_288.0).exp_m1();
        assert!((freed.alloc_bytes - 7_351_620.0 / p).abs() < 1.0);
        assert!((freed.alloc_objects - 367.0 / p).abs() < 1e-6);
        let live = &parsed.stacks[1];
        let p = -(-(65_536.0f64) / 524_288.0).exp_m1();
        assert!((live.bytes - 131_072.0 / p).abs() < 1.0);
        assert!((live.alloc_bytes - 524_288.0 / p).abs() < 1.0);
        // Without brackets (or with jemalloc's `[0: 0]`), nothing allocated.
        let bare = parse("heap_v2/524288\n@ 0x10\n  t*: 1: 4096\n".as_bytes()).unwrap();
        assert_eq!(bare.stacks[0].alloc_bytes, 0.0);
    }

    fn line(name: &str, filename: &str) -> FunctionLine {
        FunctionLine {
            name: name.to_owned(),
            system_name: name.to_owned(),
            filename: filename.to_owned(),
            line: 1,
            start_line: 1,
        }
    }

    #[test]
    fn allocator_lines_trims_what_was_inlined_into_the_allocation_site() {
        // A release build with line tables: the allocator inlined into the site.
        let site = [
            line(
                "<tikv_jemallocator::Jemalloc as core::alloc::global::GlobalAlloc>::alloc",
                "lib.rs",
            ),
            line("__rust_alloc", "lib.rs"),
            line("alloc::alloc::alloc", "alloc.rs"),
            line("alloc::raw_vec::RawVecInner<A>::try_allocate_in", "mod.rs"),
            line("alloc::vec::Vec<T>::with_capacity", "mod.rs"),
            line("my_app::leaf", "src/leaf.rs"),
            line("my_app::caller", "src/leaf.rs"),
        ];
        assert_eq!(
            allocator_lines(&site),
            5,
            "the site and what it was inlined into stay"
        );
        // jemalloc's own code, with its C helpers inlined, whatever their names.
        let c = [
            line(
                "te_event_advance",
                "include/jemalloc/internal/thread_event.h",
            ),
            line("imalloc_body", "src/jemalloc.c"),
            line("_rjem_je_malloc_default", "src/jemalloc.c"),
        ];
        assert_eq!(allocator_lines(&c), 3);
        assert_eq!(allocator_lines(&[line("prof_backtrace_impl", "")]), 1);
        // The program's closure inlined into an allocator function: the real path.
        let closure = [
            line("my_app::fill::{{closure}}", "src/fill.rs"),
            line("core::iter::adapters::map::map_fold::{{closure}}", "map.rs"),
            line(
                "<alloc::vec::Vec<T> as alloc::vec::spec_extend::SpecExtend<T,I>>::spec_extend",
                "spec.rs",
            ),
        ];
        assert_eq!(allocator_lines(&closure), 0);
        // No functions (symbolize=none), or the program's own: kept whole.
        assert_eq!(allocator_lines(&[]), 0);
        assert_eq!(allocator_lines(&[line("my_app::leaf", "src/leaf.rs")]), 0);
        // A C library's own allocation site is not jemalloc's.
        assert_eq!(allocator_lines(&[line("sqlite3Malloc", "sqlite3.c")]), 0);
    }

    #[test]
    fn allocator_lines_knows_the_plain_names_of_line_tables_only_builds_by_their_files() {
        // `debug = "line-tables-only"`: inlined functions have DWARF's plain names; the
        // outermost is the symbol table's.
        let std = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        let site = [
            line(
                "alloc",
                "/home/u/.cargo/registry/src/index/tikv-jemallocator-0.7.0/src/lib.rs",
            ),
            line("alloc", "/src/krabka-pprof/src/heap/jemalloc.rs"),
            line("__rust_alloc", "src/main.rs"),
            line("alloc", &format!("{std}/alloc/src/alloc.rs")),
            line(
                "try_allocate_in",
                &format!("{std}/alloc/src/raw_vec/mod.rs"),
            ),
            line("with_capacity<u8>", &format!("{std}/alloc/src/vec/mod.rs")),
            line("leaf", "src/main.rs"),
            line("my_app::caller", "src/main.rs"),
        ];
        assert_eq!(allocator_lines(&site), 6);
        // std's own precompiled code, its outermost function named by the symbol table.
        let from_elem = [
            line(
                "with_capacity_zeroed_in<alloc::alloc::Global>",
                &format!("{std}/alloc/src/raw_vec/mod.rs"),
            ),
            line(
                "with_capacity_zeroed_in<u8, alloc::alloc::Global>",
                &format!("{std}/alloc/src/raw_vec/mod.rs"),
            ),
            line(
                "<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem",
                &format!("{std}/alloc/src/vec/spec_from_elem.rs"),
            ),
        ];
        assert_eq!(allocator_lines(&from_elem), 3);
        // The program's own function called `alloc` is the program's; so are this
        // crate's other files, and a program's own `heap/jemalloc.rs`.
        assert_eq!(
            allocator_lines(&[
                line("alloc", "src/pool.rs"),
                line("my_app::pool", "src/pool.rs")
            ]),
            0
        );
        assert_eq!(
            allocator_lines(&[line("start", "/src/krabka-pprof/src/cpu.rs")]),
            0
        );
        assert_eq!(
            allocator_lines(&[line("alloc", "/src/my_app/src/heap/jemalloc.rs")]),
            0
        );
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
            "<krabka_pprof::heap::jemalloc::Jemalloc as core::alloc::global::GlobalAlloc>::alloc",
            "__rustc::__rust_alloc",
            "<my_app::Counting as core::alloc::global::GlobalAlloc>::alloc",
            "<my_app::Counting<tikv_jemallocator::Jemalloc> as core::alloc::global::GlobalAlloc>::realloc",
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
            // A space before ` as ` inside the type: the split is at ` as `, so the trait
            // (the program's) is judged, not `core::fmt::Formatter as my_app::Emit`.
            "<&mut core::fmt::Formatter as my_app::Emit>::emit",
            // An ` as ` nested in the trait's generics is not the outer one.
            "<core::X as my_app::Tr<<T as core::Y>::Out>>::f",
        ] {
            assert!(!is_allocator_frame(kept), "{kept}");
        }
    }
}
