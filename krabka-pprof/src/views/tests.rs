//! The views, value by value: the top table's columns, lines, flamegraphs, `sample_index`.

use super::*;
use crate::profile::proto::{Function, Line, Location, Sample, ValueType};

/// A CPU-like profile: `stacks` are leaf-first function names with a sample count.
pub(crate) fn profile_of(stacks: &[(&[&str], i64)]) -> Profile {
    let mut strings = vec![String::new()];
    let mut intern = |s: &str| -> i64 {
        if let Some(i) = strings.iter().position(|x| x == s) {
            return i as i64;
        }
        strings.push(s.to_owned());
        (strings.len() - 1) as i64
    };
    let mut profile = Profile {
        sample_type: vec![
            ValueType {
                ty: intern("samples"),
                unit: intern("count"),
            },
            ValueType {
                ty: intern("cpu"),
                unit: intern("nanoseconds"),
            },
        ],
        ..Profile::default()
    };
    let mut ids: HashMap<String, u64> = HashMap::new();
    for (stack, count) in stacks {
        let mut location_id = Vec::new();
        for name in *stack {
            let next = ids.len() as u64 + 1;
            let id = *ids.entry((*name).to_owned()).or_insert_with(|| {
                profile.function.push(Function {
                    id: next,
                    name: intern(name),
                    ..Default::default()
                });
                profile.location.push(Location {
                    id: next,
                    line: vec![Line {
                        function_id: next,
                        line: 0,
                        column: 0,
                    }],
                    ..Default::default()
                });
                next
            });
            location_id.push(id);
        }
        profile.sample.push(Sample {
            location_id,
            value: vec![*count, count * 10_000_000],
            label: vec![],
        });
    }
    profile.string_table = strings;
    profile
}

#[test]
fn flat_and_cum_follow_pprof() {
    let profile = profile_of(&[
        (&["hot", "work", "main"], 50),
        (&["warm", "work", "main"], 30),
        (&["main"], 20),
        (&["rec", "rec", "main"], 10),
    ]);
    let (rows, total) = top_by(&profile, Granularity::Functions);
    assert_eq!(total, 110 * 10_000_000);
    let get = |n: &str| rows.iter().find(|r| r.name == n).unwrap().clone();
    assert_eq!(get("hot").flat, 500_000_000);
    assert_eq!(get("work").flat, 0);
    assert_eq!(get("work").cum, 800_000_000);
    assert_eq!(get("main").cum, total);
    assert_eq!(
        get("rec").cum,
        100_000_000,
        "recursion counts once per sample"
    );
    assert_eq!(rows[0].name, "hot");
}

#[test]
fn inlined_frames_are_frames_and_the_lines_view_lists_each_line() {
    use crate::objects::Objects;
    use crate::profile::{Frame, Meta, ProfileBuilder};
    use crate::symbolize::FunctionLine;
    let named = |name: &str, line: i64| FunctionLine {
        name: name.to_owned(),
        system_name: name.to_owned(),
        filename: format!("/src/{name}.rs"),
        line,
        start_line: 1,
    };
    let objects = Objects::default();
    let mut builder = ProfileBuilder::new(&objects);
    // `step` inlined into `hot` at line 12, twice at two lines of `step`; then `hot`
    // alone at line 14.
    for (step_line, hot_line, count) in [(3, 12, 5), (4, 12, 3)] {
        builder.add(
            vec![
                Frame::Symbolized(vec![named("step", step_line), named("hot", hot_line)]),
                Frame::Symbolized(vec![named("main", 40)]),
            ],
            vec![count],
            Vec::new(),
        );
    }
    builder.add(
        vec![
            Frame::Symbolized(vec![named("hot", 14)]),
            Frame::Symbolized(vec![named("main", 41)]),
        ],
        vec![2],
        Vec::new(),
    );
    let meta = Meta {
        sample_types: &[("samples", "count")],
        period_type: ("cpu", "nanoseconds"),
        period: 1,
        time: std::time::UNIX_EPOCH,
        duration: std::time::Duration::ZERO,
        default_sample_type: None,
        comments: Vec::new(),
    };
    let profile = builder.finish(&meta, &|_| false);

    let (rows, total) = top_by(&profile, Granularity::Functions);
    assert_eq!(total, 10);
    let get = |rows: &[TopRow], n: &str| {
        let row = rows
            .iter()
            .find(|r| r.name == n)
            .unwrap_or_else(|| panic!("{n}: {rows:?}"));
        (row.flat, row.cum)
    };
    assert_eq!(
        get(&rows, "step"),
        (8, 8),
        "an inlined function is a frame of its own"
    );
    assert_eq!(get(&rows, "hot"), (2, 10));
    assert_eq!(get(&rows, "main"), (0, 10));

    let (rows, _) = top_by(&profile, Granularity::Lines);
    assert_eq!(get(&rows, "step /src/step.rs:3"), (5, 5));
    assert_eq!(get(&rows, "step /src/step.rs:4"), (3, 3));
    assert_eq!(get(&rows, "hot /src/hot.rs:12"), (0, 8));
    assert_eq!(get(&rows, "hot /src/hot.rs:14"), (2, 2));
    assert_eq!(get(&rows, "main /src/main.rs:40"), (0, 8));
    let table = top_table_by(&profile, 30, Granularity::Lines);
    assert!(table.contains("  step /src/step.rs:3\n"), "{table}");
    let view = render(&profile, Format::Text, (true, None), "CPU", "").unwrap();
    let ViewBody::Text(text) = view.body else {
        panic!("a text view")
    };
    assert_eq!(text, table);

    // The flamegraph draws the inlined function as a frame on its caller: `hot` spans all
    // 10 samples (its own 2 and `step`'s 8 above it), `step` 8.
    #[cfg(feature = "flamegraph")]
    {
        let svg = flamegraph(&profile, "CPU", "5 s").unwrap();
        for (frame, samples) in [("step", 8), ("hot", 10), ("main", 10)] {
            assert!(
                svg.contains(&format!("<title>{frame} ({samples} samples,")),
                "{frame} over {samples} samples: {svg}"
            );
        }
    }
}

#[test]
fn table_has_go_columns() {
    let profile = profile_of(&[(&["hot", "main"], 75), (&["main"], 25)]);
    let table = top_table(&profile, 30);
    assert!(table.contains("Type: cpu"), "{table}");
    assert!(
        table.contains("      flat   flat%    sum%        cum    cum%\n"),
        "{table}"
    );
    assert!(
        table.contains("     750ms     75%     75%      750ms     75%  hot\n"),
        "{table}"
    );
    assert!(
        table.contains("     250ms     25%    100%         1s    100%  main\n"),
        "{table}"
    );
}

#[cfg(feature = "flamegraph")]
#[test]
fn flamegraph_is_svg_with_every_function() {
    let profile = profile_of(&[(&["hot", "main"], 75), (&["cold;odd", "main"], 25)]);
    let svg = flamegraph(&profile, "CPU", "5 s").unwrap();
    assert!(svg.contains("<svg"), "{svg}");
    assert!(svg.contains(">hot") && svg.contains("main") && svg.contains("cold:odd"));
    let empty = profile_of(&[]);
    assert!(
        flamegraph(&empty, "CPU", "5 s")
            .unwrap()
            .contains("no samples")
    );
}

#[cfg(feature = "flamegraph")]
#[test]
fn a_cpu_flamegraph_is_drawn_in_samples_unless_another_column_is_asked_for() {
    let mut profile = profile_of(&[(&["hot", "main"], 75), (&["cold", "main"], 25)]);
    // Weights that disagree with the counts (samples standing for no CPU): the samples,
    // the column a CPU flamegraph is drawn in by default, still show `cold`.
    profile.sample[1].value[1] = 0;
    let svg = flamegraph(&profile, "CPU", "5 s").unwrap();
    assert!(
        svg.contains(">cold") && svg.contains("cold (25 samples"),
        "{svg}"
    );
    let svg = flamegraph_in(&profile, Some(1), "CPU", "5 s").unwrap();
    assert!(!svg.contains("cold"), "{svg}");
}

/// A heap-like profile: Go's four types, `/allocs`' default.
fn allocations() -> Profile {
    let mut profile = profile_of(&[(&["churn", "main"], 1), (&["keep", "main"], 1)]);
    let mut intern = |s: &str| {
        profile.string_table.push(s.to_owned());
        (profile.string_table.len() - 1) as i64
    };
    let (count, bytes) = (intern("count"), intern("bytes"));
    let types: Vec<ValueType> = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ]
    .iter()
    .enumerate()
    .map(|(i, ty)| ValueType {
        ty: intern(ty),
        unit: if i % 2 == 0 { count } else { bytes },
    })
    .collect();
    profile.default_sample_type = types[1].ty;
    profile.sample_type = types;
    // churn allocated much and holds nothing; keep allocated little and holds it all.
    profile.sample[0].value = vec![500, 32 << 20, 0, 0];
    profile.sample[1].value = vec![256, 64 << 20, 256, 64 << 20];
    profile
}

#[test]
fn sample_index_picks_the_column_the_text_view_and_the_flamegraph_show() {
    let profile = allocations();
    let text = |index: Option<&str>| {
        let view = render_with(&profile, Format::Text, (false, None), index, "t", "s").unwrap();
        let ViewBody::Text(text) = view.body else {
            panic!("text")
        };
        text
    };
    let default = text(None);
    assert!(default.starts_with("Type: alloc_space\n"), "{default}");
    assert!(
        default.contains("32MB") && default.contains("churn"),
        "{default}"
    );
    let inuse = text(Some("inuse_space"));
    assert!(inuse.starts_with("Type: inuse_space\n"), "{inuse}");
    let churn = inuse.lines().find(|l| l.ends_with("  churn")).unwrap();
    assert!(churn.trim_start().starts_with("0B"), "{inuse}");
    assert!(text(Some("alloc_objects")).contains("Type: alloc_objects\n"));
    let err = render_with(
        &profile,
        Format::Text,
        (false, None),
        Some("samples"),
        "t",
        "s",
    )
    .err()
    .unwrap();
    assert_eq!(
        err,
        "`sample_index` must be one of this profile's sample types, alloc_objects, \
         alloc_space, inuse_objects, inuse_space; found \"samples\""
    );
    #[cfg(feature = "flamegraph")]
    {
        let svg = flamegraph_in(&profile, Some(3), "t", "s").unwrap();
        assert!(
            svg.contains("keep") && !svg.contains("churn"),
            "inuse: churn holds 0"
        );
        let svg = flamegraph_in(&profile, Some(1), "t", "s").unwrap();
        assert!(svg.contains("churn"));
    }
}

#[test]
fn sample_index_becomes_the_pprof_formats_default() {
    use crate::profile::proto::Message as _;
    use std::io::Read as _;
    let profile = allocations();
    let view = render_with(
        &profile,
        Format::Pprof,
        (false, None),
        Some("inuse_space"),
        "",
        "",
    )
    .unwrap();
    let ViewBody::Pprof(gz) = view.body else {
        panic!("pprof")
    };
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let decoded = Profile::decode(raw.as_slice()).unwrap();
    assert_eq!(decoded.string(decoded.default_sample_type), "inuse_space");
    assert_eq!(decoded.sample, profile.sample, "nothing else changes");
}

#[test]
fn values_scale_like_pprof() {
    assert_eq!(format_value(1_500_000_000, "nanoseconds"), "1.5s");
    assert_eq!(format_value(20_000_000, "nanoseconds"), "20ms");
    assert_eq!(format_value(64 * 1024 * 1024, "bytes"), "64MB");
    assert_eq!(format_value(512, "bytes"), "512B");
    assert_eq!(format_value(1234, "count"), "1234");
}

/// `profile`'s string index of `s`, interned if new.
fn intern_in(profile: &mut Profile, s: &str) -> i64 {
    if let Some(i) = profile.string_table.iter().position(|x| x == s) {
        return i as i64;
    }
    profile.string_table.push(s.to_owned());
    (profile.string_table.len() - 1) as i64
}

/// Labels sample `i` of `profile` with `labels` (key, value).
fn label_sample(profile: &mut Profile, i: usize, labels: &[(&str, &str)]) {
    for (key, value) in labels {
        let label = crate::profile::proto::Label {
            key: intern_in(profile, key),
            str: intern_in(profile, value),
            ..Default::default()
        };
        profile.sample[i].label.push(label);
    }
}

#[test]
fn the_grouped_table_sums_each_label_value_heaviest_first_and_lists_each_groups_functions() {
    let mut profile = profile_of(&[
        (&["a_work", "main"], 30),
        (&["b_work", "main"], 50),
        (&["b_more", "main"], 20),
        (&["unlabelled", "main"], 5),
        (&["a_work", "main"], 4),
    ]);
    profile.duration_nanos = 2_000_000_000;
    label_sample(&mut profile, 0, &[("tenant", "a")]);
    label_sample(&mut profile, 1, &[("route", "/x"), ("tenant", "b")]);
    label_sample(&mut profile, 2, &[("tenant", "b")]);
    label_sample(&mut profile, 3, &[("route", "/y")]);
    label_sample(&mut profile, 4, &[("tenant", "a")]);
    let text = grouped_table(&profile, "tenant", Granularity::Functions, Some(0));
    let expected = "\
Type: samples
Duration: 2s, Total samples = 109
Grouped by label tenant: 3 groups
      flat   flat%  group
        70  64.22%  tenant=b
        34  31.19%  tenant=a
         5   4.59%  [no tenant]

tenant=b: 70 (64.22% of the total)
Showing nodes accounting for 70, 64.22% of 109 total
      flat   flat%    sum%        cum    cum%
        50  45.87%  45.87%         50  45.87%  b_work
        20  18.35%  64.22%         20  18.35%  b_more
         0      0%  64.22%         70  64.22%  main

tenant=a: 34 (31.19% of the total)
Showing nodes accounting for 34, 31.19% of 109 total
      flat   flat%    sum%        cum    cum%
        34  31.19%  31.19%         34  31.19%  a_work
         0      0%  31.19%         34  31.19%  main

[no tenant]: 5 (4.59% of the total)
Showing nodes accounting for 5, 4.59% of 109 total
      flat   flat%    sum%        cum    cum%
         5   4.59%   4.59%          5   4.59%  unlabelled
         0      0%   4.59%          5   4.59%  main
";
    assert_eq!(text, expected);

    // The unlabelled stay last however heavy; no window, no duration line; a label
    // with an empty value is no value.
    profile.sample[3].value[0] = 500;
    profile.duration_nanos = 0;
    label_sample(&mut profile, 3, &[("tenant", "")]);
    profile.sample[3].label.last_mut().unwrap().str = 0;
    let text = grouped_table(&profile, "tenant", Granularity::Functions, Some(0));
    let groups: Vec<&str> = text.lines().skip(3).take(3).collect();
    assert_eq!(
        groups,
        [
            "        70  11.59%  tenant=b",
            "        34   5.63%  tenant=a",
            "       500  82.78%  [no tenant]"
        ],
        "{text}"
    );
    assert!(
        text.starts_with("Type: samples\nGrouped by label tenant: 3 groups\n"),
        "{text}"
    );

    // Twenty groups are detailed; the rest are counted.
    let stacks: Vec<(Vec<String>, i64)> = (0..22)
        .map(|i| (vec![format!("work_{i}")], 100 + i as i64))
        .collect();
    let borrowed: Vec<(Vec<&str>, i64)> = stacks
        .iter()
        .map(|(s, v)| (s.iter().map(String::as_str).collect(), *v))
        .collect();
    let as_slices: Vec<(&[&str], i64)> = borrowed.iter().map(|(s, v)| (s.as_slice(), *v)).collect();
    let mut many = profile_of(&as_slices);
    for i in 0..22 {
        label_sample(&mut many, i, &[("tenant", &format!("t{i:02}"))]);
    }
    let text = grouped_table(&many, "tenant", Granularity::Functions, Some(0));
    assert!(
        text.contains("Grouped by label tenant: 22 groups\n"),
        "{text}"
    );
    assert_eq!(text.matches("\ntenant=").count(), 20, "{text}");
    assert!(
        !text.contains("\ntenant=t00:") && text.contains("\ntenant=t21:"),
        "{text}"
    );
    assert!(
        text.ends_with("\n2 more groups; `go tool pprof -tagfocus tenant=VALUE` shows any one\n"),
        "{text}"
    );
}

#[test]
fn exactly_twenty_groups_are_all_detailed_and_none_counted() {
    let stacks: Vec<String> = (0..20).map(|i| format!("work_{i}")).collect();
    let as_slices: Vec<[&str; 1]> = stacks.iter().map(|s| [s.as_str()]).collect();
    let with_values: Vec<(&[&str], i64)> = as_slices.iter().map(|s| (&s[..], 1)).collect();
    let mut profile = profile_of(&with_values);
    for i in 0..20 {
        label_sample(&mut profile, i, &[("tenant", &format!("t{i:02}"))]);
    }
    let text = grouped_table(&profile, "tenant", Granularity::Functions, Some(0));
    assert_eq!(text.matches("\ntenant=").count(), 20, "{text}");
    assert!(!text.contains("more groups"), "{text}");
}

/// The lines view names a line only where it has a file and a line number; else the
/// function alone.
#[test]
fn the_lines_view_names_a_line_only_with_its_file_and_number() {
    let mut profile = profile_of(&[(&["both"], 3), (&["no_file"], 2), (&["line_zero"], 1)]);
    let file = intern_in(&mut profile, "src/x.rs");
    for (i, (filename, line)) in [(file, 7), (0, 8), (file, 0)].into_iter().enumerate() {
        profile.function[i].filename = filename;
        profile.location[i].line[0].line = line;
    }
    let text = top_table_by(&profile, 10, Granularity::Lines);
    let names: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("flat%"))
        .skip(1)
        .map(|l| l.split("  ").last().unwrap().trim())
        .collect();
    assert_eq!(names, ["both src/x.rs:7", "no_file", "line_zero"], "{text}");
}

#[test]
fn the_top_table_says_how_many_nodes_it_leaves_out() {
    let profile = profile_of(&[(&["a"], 3), (&["b"], 2), (&["c"], 1)]);
    let text = top_table(&profile, 2);
    assert!(text.contains("\nShowing top 2 nodes out of 3\n"), "{text}");
    let text = top_table(&profile, 3);
    assert!(!text.contains("Showing top"), "{text}");
}
