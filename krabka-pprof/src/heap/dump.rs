//! The pure half of heap profiles: jemalloc's `heap_v2` dump parsed into unbiased stacks,
//! and the allocator frames hidden from their leaf end. No jemalloc and no `cfg` here, so
//! both are compiled and unit-tested on every target and without features; `heap.rs`
//! calls them where dumps exist.

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
            // `t*: <objects>: <bytes> [<allocated objects>: <allocated bytes>]`: only the
            // first two are read, so the brackets need no separating.
            let mut numbers = rest
                .split(|c: char| c == ':' || c.is_whitespace())
                .filter(|s| !s.is_empty());
            let objects: f64 = numbers
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or("objects")?;
            let bytes: f64 = numbers.next().and_then(|n| n.parse().ok()).ok_or("bytes")?;
            if !objects.is_finite() || !bytes.is_finite() {
                return Err(format!("counts that are not numbers in {line:?}"));
            }
            if objects <= 0.0 || bytes <= 0.0 {
                continue;
            }
            let ratio = (bytes / objects) / period as f64;
            // 1 - e^-ratio, exact for tiny ratios too (where 1 - exp() rounds to 0).
            let probability = -(-ratio).exp_m1();
            let (objects, bytes) = (objects / probability, bytes / probability);
            if !objects.is_finite() || !bytes.is_finite() {
                return Err(format!("counts out of range in {line:?}"));
            }
            stacks.push(HeapStack {
                addresses,
                objects,
                bytes,
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
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name) || is_core_or_alloc(name)
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
            (number.clone(), number).prop_map(|(o, b)| format!("  t*: {o}: {b} [0: 0]")),
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
                    prop_assert!(
                        stack.objects.is_finite() && stack.objects > 0.0,
                        "{stack:?} from {text:?}"
                    );
                    prop_assert!(
                        stack.bytes.is_finite() && stack.bytes > 0.0,
                        "{stack:?} from {text:?}"
                    );
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
