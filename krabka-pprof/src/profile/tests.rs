//! The profile builder: locations, inlined lines, trimming at the leaf, mappings.

use super::{Frame, LabelValue, Meta, ProfileBuilder};
use crate::objects::Objects;
use crate::symbolize::FunctionLine;

fn named(name: &str, filename: &str, line: i64) -> FunctionLine {
    FunctionLine {
        name: name.to_owned(),
        system_name: format!("_ZN{name}E"),
        filename: filename.to_owned(),
        line,
        start_line: 0,
    }
}

fn meta() -> Meta {
    Meta {
        sample_types: &[("samples", "count")],
        period_type: ("cpu", "nanoseconds"),
        period: 1,
        time: std::time::UNIX_EPOCH,
        duration: std::time::Duration::ZERO,
        default_sample_type: None,
        comments: Vec::new(),
    }
}

#[test]
fn a_symbolized_frame_is_one_location_with_a_line_per_inlined_function() {
    let objects = Objects::current();
    let mut builder = ProfileBuilder::new(&objects);
    let leaf = Frame::Symbolized(vec![
        named("inner", "src/a.rs", 7),
        named("outer", "src/b.rs", 42),
    ]);
    let caller = Frame::Symbolized(vec![named("main", "src/main.rs", 3)]);
    for _ in 0..2 {
        builder.add(
            vec![leaf.clone(), caller.clone()],
            vec![5],
            vec![("thread".into(), LabelValue::Str("worker".into()))],
        );
    }
    let profile = builder.finish(&meta(), &|_| false);
    let string = |i: i64| profile.string_table[i as usize].as_str();

    assert_eq!(profile.location.len(), 2, "one location per distinct frame");
    assert_eq!(profile.sample.len(), 2);
    assert_eq!(profile.sample[0].location_id, profile.sample[1].location_id);
    let location = &profile.location[0];
    let lines: Vec<(&str, &str, &str, i64)> = location
        .line
        .iter()
        .map(|line| {
            let function = &profile.function[line.function_id as usize - 1];
            (
                string(function.name),
                string(function.system_name),
                string(function.filename),
                line.line,
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("inner", "_ZNinnerE", "src/a.rs", 7),
            ("outer", "_ZNouterE", "src/b.rs", 42)
        ],
        "innermost first, the caller it was inlined into last"
    );
    assert_eq!(profile.function.len(), 3);
}

#[test]
fn trimming_drops_allocator_locations_and_the_allocator_lines_inlined_into_the_site() {
    let objects = Objects::current();
    let mut builder = ProfileBuilder::new(&objects);
    let allocator = Frame::Symbolized(vec![named("imalloc", "", 0), named("malloc", "", 0)]);
    // malloc and its plumbing inlined into the program's own function.
    let inlined = Frame::Symbolized(vec![
        named("malloc", "", 0),
        named("raw_vec", "", 0),
        named("site", "", 0),
    ]);
    let caller = Frame::Symbolized(vec![named("main", "", 0)]);
    builder.add(
        vec![allocator.clone(), inlined.clone(), caller.clone()],
        vec![1],
        Vec::new(),
    );
    // The same location further out: nothing of it is trimmed there.
    let leaf = Frame::Symbolized(vec![named("leaf", "", 0)]);
    builder.add(vec![leaf, inlined, caller], vec![1], Vec::new());
    // A stack of allocator frames only keeps its outermost.
    builder.add(vec![allocator.clone(), allocator], vec![1], Vec::new());
    let hidden = ["imalloc", "malloc", "raw_vec"];
    let profile = builder.finish(&meta(), &|name| hidden.contains(&name));
    let names = |sample: usize| -> Vec<Vec<String>> {
        profile.sample[sample]
            .location_id
            .iter()
            .map(|id| {
                profile.location[*id as usize - 1]
                    .line
                    .iter()
                    .map(|line| {
                        let function = &profile.function[line.function_id as usize - 1];
                        profile.string_table[function.name as usize].clone()
                    })
                    .collect()
            })
            .collect()
    };
    assert_eq!(names(0), [vec!["site"], vec!["main"]], "starts at the site");
    assert_eq!(
        names(1),
        [
            vec!["leaf"],
            vec!["malloc", "raw_vec", "site"],
            vec!["main"]
        ],
        "not at the leaf: whole"
    );
    assert_eq!(names(2), [vec!["imalloc", "malloc"]]);
    let (trimmed, whole) = (
        &profile.location[profile.sample[0].location_id[0] as usize - 1],
        &profile.location[profile.sample[1].location_id[1] as usize - 1],
    );
    assert_ne!(trimmed.id, whole.id, "two locations");
    assert_eq!(trimmed.address, whole.address, "at one address");
    assert_eq!(trimmed.mapping_id, whole.mapping_id);
    for (i, location) in profile.location.iter().enumerate() {
        assert_eq!(location.id, i as u64 + 1, "a location's id is its place");
    }
    // The program's function inlined into an allocator function is its own path.
    let mut builder = ProfileBuilder::new(&objects);
    let closure = Frame::Symbolized(vec![named("closure", "", 0), named("malloc", "", 0)]);
    builder.add(
        vec![closure, Frame::Symbolized(vec![named("main", "", 0)])],
        vec![1],
        Vec::new(),
    );
    let profile = builder.finish(&meta(), &|name| name == "malloc");
    assert_eq!(profile.sample[0].location_id.len(), 2);
    assert_eq!(profile.location[0].line.len(), 2, "kept whole");
}

/// A profile of one stack: this function's code, as `objects` names it.
#[cfg(elf)]
fn profile_here(objects: &Objects, symbolize: crate::symbolize::Symbolize) -> super::Profile {
    let here = a_function_named_by_its_symbol as *const () as u64;
    let mut builder = ProfileBuilder::new(objects).symbolize(symbolize);
    builder.add(vec![Frame::Code(here + 4)], vec![1], Vec::new());
    builder.finish(&meta(), &|_| false)
}

#[inline(never)]
fn a_function_named_by_its_symbol() -> u64 {
    std::hint::black_box(7u64).wrapping_mul(std::hint::black_box(6))
}

/// Each line of each location: function name, file, line.
fn lines_of(profile: &super::Profile) -> Vec<Vec<(String, String, i64)>> {
    let string = |i: i64| profile.string_table[i as usize].clone();
    profile
        .location
        .iter()
        .map(|location| {
            location
                .line
                .iter()
                .map(|line| {
                    let function = &profile.function[line.function_id as usize - 1];
                    (string(function.name), string(function.filename), line.line)
                })
                .collect()
        })
        .collect()
}

#[cfg(elf)]
#[test]
fn without_dwarf_a_frame_has_the_symbol_tables_name_and_with_it_the_same_name_and_a_line() {
    use crate::symbolize::dwarf::tests::{Scratch, as_if_loaded_from, split};

    let objects = Objects::current();
    let here = a_function_named_by_its_symbol as *const () as u64;
    let (index, object) = objects.find(here).unwrap();
    let symbol = crate::symbolize::symbol_of(object, &[here + 4 - object.bias])[0]
        .clone()
        .expect("the symbol table names it");

    let scratch = Scratch::new("profile");
    let (stripped, _debug) = split(&scratch.0);
    let without = objects.with(index, as_if_loaded_from(object, &stripped));
    let profile = profile_here(&without, crate::symbolize::Symbolize::Full);
    assert_eq!(
        lines_of(&profile),
        [[(symbol.name.clone(), String::new(), 0)]],
        "no DWARF: the symbol table's name, as before lines existed"
    );
    let mapping = &profile.mapping[0];
    assert!(mapping.has_functions);
    assert!(!mapping.has_line_numbers && !mapping.has_filenames && !mapping.has_inline_frames);

    let profile = profile_here(&objects, crate::symbolize::Symbolize::Full);
    let lines = lines_of(&profile);
    let (name, file, line) = lines[0].last().unwrap().clone();
    assert_eq!(name, symbol.name, "DWARF changes no name");
    assert!(
        file.ends_with("krabka-pprof/src/profile/tests.rs"),
        "{file}"
    );
    assert!(line > 0, "{lines:?}");
    let function = profile.function.last().unwrap();
    assert!(function.start_line > 0, "{function:?}");
    assert_eq!(
        profile.string_table[function.system_name as usize], symbol.raw,
        "the system name stays the symbol's"
    );
    let mapping = &profile.mapping[0];
    assert!(mapping.has_line_numbers && mapping.has_filenames && mapping.has_inline_frames);
}

#[cfg(elf)]
#[test]
fn symbolize_none_keeps_addresses_and_mappings_and_names_nothing() {
    let objects = Objects::current();
    let here = a_function_named_by_its_symbol as *const () as u64;
    let (_, object) = objects.find(here).unwrap();
    let mut builder = ProfileBuilder::new(&objects).symbolize(crate::symbolize::Symbolize::None);
    builder.add(
        vec![Frame::Code(here + 4), Frame::Marker("[truncated]".into())],
        vec![1],
        Vec::new(),
    );
    let profile = builder.finish(&meta(), &|_| false);
    let code = &profile.location[0];
    assert_eq!(code.address, here + 4);
    assert!(code.line.is_empty(), "{code:?}");
    let mapping = &profile.mapping[code.mapping_id as usize - 1];
    assert!(!mapping.has_functions);
    assert!(!mapping.has_line_numbers);
    assert_eq!(profile.string_table[mapping.filename as usize], object.name);
    assert!(object.build_id.is_some() && mapping.build_id != 0);
    // The profiler's own markers are not code: they keep their text.
    assert_eq!(
        lines_of(&profile)[1],
        [("[truncated]".to_owned(), String::new(), 0)]
    );
    assert_eq!(profile.function.len(), 1, "only the marker is a function");
}

#[cfg(elf)]
#[test]
fn addresses_symbolized_early_give_the_profile_they_would_have_given_late() {
    let objects = Objects::current();
    let here = a_function_named_by_its_symbol as *const () as u64;
    let getpid = libc::getpid as *const () as u64;
    let stacks = [
        vec![Frame::Code(here + 4), Frame::Code(getpid)],
        vec![Frame::Code(here + 8), Frame::Marker("[truncated]".into())],
    ];
    let build = |before: Option<crate::symbolize::Resolved>| {
        let mut builder = ProfileBuilder::new(&objects);
        if let Some(before) = before {
            builder = builder.resolved_before(before);
        }
        for stack in &stacks {
            builder.add(stack.clone(), vec![1], Vec::new());
        }
        builder.finish(&meta(), &|_| false)
    };
    let late = build(None);
    // Some addresses looked up before the profile is built (as a window does a fifth
    // of the way before its end), the others when it is.
    let early = build(Some(crate::symbolize::Resolved::of(
        &objects,
        vec![here + 4, getpid],
    )));
    assert_eq!(lines_of(&early), lines_of(&late));
    let own = lines_of(&late)[0].last().cloned().unwrap();
    assert!(
        own.1.ends_with("krabka-pprof/src/profile/tests.rs"),
        "{own:?}"
    );
    let flags = |profile: &super::Profile| -> Vec<(u64, bool, bool, bool)> {
        profile
            .mapping
            .iter()
            .map(|m| {
                (
                    m.memory_start,
                    m.has_functions,
                    m.has_line_numbers,
                    m.has_inline_frames,
                )
            })
            .collect()
    };
    assert_eq!(flags(&early), flags(&late));
    assert_eq!(late.location.len(), early.location.len());
}

#[test]
fn the_profile_carries_its_meta_whole() {
    let objects = Objects::current();
    let mut builder = ProfileBuilder::new(&objects);
    builder.add(
        vec![Frame::Symbolized(vec![named("main", "src/main.rs", 3)])],
        vec![3, 30_000_000],
        Vec::new(),
    );
    let meta = Meta {
        sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
        period_type: ("cpu", "nanoseconds"),
        period: 10_101_010,
        time: std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_000_123_456_789),
        duration: std::time::Duration::from_millis(2_500),
        default_sample_type: Some("cpu"),
        comments: vec!["one note".into(), "another".into()],
    };
    let profile = builder.finish(&meta, &|_| false);
    let string = |i: i64| profile.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (string(t.ty), string(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period_type = profile.period_type.as_ref().expect("a period type");
    assert_eq!(
        (string(period_type.ty), string(period_type.unit)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(profile.period, 10_101_010);
    assert_eq!(profile.time_nanos, 1_700_000_000_123_456_789);
    assert_eq!(profile.duration_nanos, 2_500_000_000);
    assert_eq!(string(profile.default_sample_type), "cpu");
    let comments: Vec<&str> = profile.comment.iter().map(|&c| string(c)).collect();
    assert_eq!(comments, ["one note", "another"]);
    assert_eq!(profile.sample[0].value, [3, 30_000_000]);
}

/// The frame maps' hasher gives distinct addresses distinct hashes through each of its
/// entry points: a hasher that ignores what it is fed still makes a correct map, but
/// one whose every lookup walks every key.
#[test]
fn the_frame_hasher_tells_addresses_apart_however_they_are_fed() {
    use std::hash::Hasher;
    let addresses: Vec<u64> = (0..1_000u64).map(|i| 0x5555_0000_0000 + i * 16).collect();
    let distinct = |hash: &dyn Fn(u64) -> u64| {
        addresses
            .iter()
            .map(|&a| hash(a))
            .collect::<std::collections::HashSet<u64>>()
            .len()
    };
    let by_u64 = |a: u64| {
        let mut h = super::FrameHasher::default();
        h.write_u64(a);
        h.finish()
    };
    let by_usize = |a: u64| {
        let mut h = super::FrameHasher::default();
        h.write_usize(a as usize);
        h.finish()
    };
    // Twelve bytes: two words, the address in the second, so the last short chunk counts.
    let by_bytes = |a: u64| {
        let mut bytes = [0u8; 12];
        bytes[4..].copy_from_slice(&a.to_le_bytes());
        let mut h = super::FrameHasher::default();
        h.write(&bytes);
        h.finish()
    };
    assert_eq!(distinct(&by_u64), addresses.len());
    assert_eq!(distinct(&by_usize), addresses.len());
    assert_eq!(distinct(&by_bytes), addresses.len());
    // And the low bits, which pick a map's bucket, spread them too.
    let buckets = addresses
        .iter()
        .map(|&a| by_u64(a) & 1023)
        .collect::<std::collections::HashSet<u64>>()
        .len();
    assert!(
        buckets > 500,
        "{buckets} buckets of 1024 for 1000 addresses"
    );
}

#[test]
fn a_samples_labels_keep_their_keys_and_their_text_or_number() {
    let objects = Objects::current();
    let mut builder = ProfileBuilder::new(&objects);
    builder.add(
        vec![Frame::Symbolized(vec![named("main", "src/main.rs", 3)])],
        vec![1],
        vec![
            ("thread".into(), LabelValue::Str("worker-1".into())),
            ("bytes".into(), LabelValue::Num(4096)),
        ],
    );
    let profile = builder.finish(&meta(), &|_| false);
    let string = |i: i64| profile.string_table[i as usize].as_str();
    let labels: Vec<(&str, &str, i64)> = profile.sample[0]
        .label
        .iter()
        .map(|l| (string(l.key), string(l.str), l.num))
        .collect();
    assert_eq!(labels, [("thread", "worker-1", 0), ("bytes", "", 4096)]);
}
