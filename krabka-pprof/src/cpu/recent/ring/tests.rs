//! The ring, slice by slice: what a range merges to, what it says is missing, and the two
//! bounds.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::{Ring, SLICE};
use crate::labels::table::SampleLabels;
use crate::objects::Objects;
use crate::sampler::{Collected, Report, StackKey, Tally};

const S: fn(u64) -> Duration = Duration::from_secs;

/// A fixed origin, so that the tests do not depend on the clock.
fn at(secs_f: f64) -> SystemTime {
    let origin = SystemTime::UNIX_EPOCH + S(1_800_000_000);
    if secs_f < 0.0 {
        origin - Duration::from_secs_f64(-secs_f)
    } else {
        origin + Duration::from_secs_f64(secs_f)
    }
}

fn key(tid: u32, leaf: u64) -> StackKey {
    StackKey {
        tid,
        flags: 0,
        labels: SampleLabels::default(),
        frames: vec![leaf, 0x1000, 0x2000].into_boxed_slice(),
    }
}

/// One slice from `start` for `length` seconds: `samples` of each stack whose leaf is
/// listed.
fn slice(start: f64, length: f64, leaves: &[u64], samples: u64) -> Collected {
    Collected {
        stacks: leaves
            .iter()
            .map(|&leaf| {
                (
                    key(7, leaf),
                    Tally {
                        samples,
                        periods: samples,
                    },
                )
            })
            .collect(),
        names: HashMap::from([(7, "worker".into())]),
        lost: Tally::default(),
        blocked: Vec::new(),
        unattributed: Duration::ZERO,
        started: at(start),
        duration: Duration::from_secs_f64(length),
        cpu_time: Duration::from_millis(10 * samples * leaves.len() as u64),
        frequency: 100,
        objects: Objects::default(),
        report: Report {
            unwound: samples * leaves.len() as u64,
            handler_nanos: (1000, 2000),
            ..Report::default()
        },
    }
}

/// Samples per leaf in what a selection merged.
fn by_leaf(collected: &Collected) -> HashMap<u64, u64> {
    collected
        .stacks
        .iter()
        .map(|(key, tally)| (key.frames[0], tally.samples))
        .collect()
}

#[test]
fn a_range_holds_the_slices_mostly_within_it_and_says_what_it_covers() {
    let mut ring = Ring::new(S(600), 8 << 20);
    for second in 0..8 {
        ring.push(slice(f64::from(second), 1.0, &[0xa], 10), None);
    }
    for second in 8..13 {
        ring.push(slice(f64::from(second), 1.0, &[0xb], 10), None);
    }
    // The last 3 s: slices 10, 11 and 12, all of the second phase.
    let last = ring.select(at(10.0), at(13.0));
    let collected = last.collected.expect("slices kept");
    assert_eq!(by_leaf(&collected), HashMap::from([(0xb, 30)]));
    assert_eq!(collected.duration, S(3));
    assert_eq!(collected.started, at(10.0));
    assert!(
        last.notes[0]
            == "krabka-pprof recorder: 3.0 s sampled in 3 slices, from 3.0 s before the end \
                of the 3.0 s window asked for to its end",
        "{:?}",
        last.notes
    );
    // A window that ends in the past: slices 2 to 5, of the first phase; a slice
    // overlapping by half or less is left out.
    let past = ring.select(at(1.5), at(6.4)).collected.unwrap();
    assert_eq!(by_leaf(&past), HashMap::from([(0xa, 40)]));
    // Longer than the process: its whole life, and why nothing is before it.
    let all = ring.select(at(-47.0), at(13.0));
    let collected = all.collected.unwrap();
    assert_eq!(by_leaf(&collected), HashMap::from([(0xa, 80), (0xb, 50)]));
    assert_eq!(collected.duration, S(13));
    assert!(
        all.notes
            .iter()
            .any(|n| n == "the recorder started 13 s before the end: nothing is recorded before it"),
        "{:?}",
        all.notes
    );
    assert_eq!(collected.report.unwound, 130, "the reports are summed");
    assert_eq!(collected.cpu_time, Duration::from_millis(1300));
}

#[test]
fn gaps_are_named_and_left_out_of_what_is_covered() {
    let mut ring = Ring::new(S(600), 8 << 20);
    ring.push(slice(0.0, 1.0, &[0xa], 10), None);
    ring.push(slice(1.0, 1.0, &[0xa], 10), None);
    // The recorder yielded for 3 s.
    ring.push(
        slice(5.0, 1.0, &[0xa], 10),
        Some("the recorder yielded to a profile at 50 Hz".to_owned()),
    );
    ring.pause(at(6.0), "a request at 50 Hz took the sampler".to_owned());
    let selection = ring.select(at(0.0), at(10.0));
    let collected = selection.collected.unwrap();
    assert_eq!(collected.duration, S(3), "only what was sampled");
    let notes = selection.notes.join("\n");
    assert!(
        notes.contains(
            "not sampled for 3.0 s from 8.0 s before the end: the recorder yielded to a \
             profile at 50 Hz"
        ),
        "{notes}"
    );
    assert!(
        notes.contains("not sampled for the last 4.0 s: a request at 50 Hz took the sampler"),
        "{notes}"
    );
    // Nothing at all in a range: no profile, and why.
    let none = ring.select(at(7.0), at(10.0));
    assert!(none.collected.is_none());
    assert_eq!(
        none.notes,
        ["the recorder has not sampled since then: a request at 50 Hz took the sampler"]
    );
    // Pushing again ends the pause.
    ring.push(slice(10.0, 1.0, &[0xa], 10), Some("yielded".to_owned()));
    assert_eq!(ring.paused(), None);
}

#[test]
fn slices_older_than_recent_are_dropped_with_what_only_they_used() {
    let mut ring = Ring::new(S(10), 8 << 20);
    // Each second its own stack, then one shared by all.
    for second in 0..30u32 {
        ring.push(
            slice(
                f64::from(second),
                1.0,
                &[0x100 + u64::from(second), 0xff],
                5,
            ),
            None,
        );
    }
    let kept = ring.kept();
    assert_eq!(kept.slices, 10, "ten seconds kept");
    // What the dropped slices weighed was taken off the ring's count of bytes.
    assert_counts_what_it_holds(&ring);
    assert_eq!(kept.span, S(10));
    assert_eq!(
        kept.stacks, 11,
        "the ten slices' own stacks and the shared one"
    );
    let selection = ring.select(at(0.0), at(30.0));
    let collected = selection.collected.unwrap();
    assert_eq!(collected.started, at(20.0));
    assert_eq!(by_leaf(&collected)[&0xff], 50);
    assert!(
        selection
            .notes
            .iter()
            .any(|n| n == "history older than recent (10 s) is not kept"),
        "{:?}",
        selection.notes
    );
    // A range entirely before what is kept.
    let gone = ring.select(at(0.0), at(5.0));
    assert!(gone.collected.is_none());
    assert_eq!(gone.notes, ["history older than recent (10 s) is not kept"]);
}

#[test]
fn the_memory_bound_drops_the_oldest_slices_first() {
    let budget = 64 * 1024;
    let mut ring = Ring::new(S(3600), budget);
    let mut leaf = 0x10_0000;
    for second in 0..400u32 {
        // 20 new stacks a second: about 3 KiB.
        let leaves: Vec<u64> = (0..20)
            .map(|_| {
                leaf += 1;
                leaf
            })
            .collect();
        ring.push(slice(f64::from(second), 1.0, &leaves, 1), None);
        assert!(
            ring.bytes() <= budget,
            "{} bytes after {second} s, bound {budget}",
            ring.bytes()
        );
    }
    let kept = ring.kept();
    assert!(
        kept.slices > 5 && kept.span < S(100),
        "the newest seconds are kept: {kept:?}"
    );
    assert_eq!(
        kept.stacks,
        kept.slices * 20,
        "a dropped slice's stacks are freed"
    );
    let selection = ring.select(at(0.0), at(400.0));
    assert!(
        selection
            .notes
            .iter()
            .any(|n| n.starts_with("history from before")
                && n.ends_with("was dropped to stay within recent_memory (64KiB)")),
        "{:?}",
        selection.notes
    );
    // A window wholly before what is kept: no profile, and the same reason.
    let before = ring.select(at(0.0), at(10.0));
    assert!(before.collected.is_none());
    assert_eq!(before.notes.len(), 1, "{:?}", before.notes);
    assert!(
        before.notes[0].starts_with(
            "history that old was dropped to stay within recent_memory (64KiB); the oldest \
             kept begins "
        ),
        "{:?}",
        before.notes
    );
}

#[test]
fn old_slices_fold_into_ten_seconds_and_keep_every_sample() {
    let mut ring = Ring::new(S(600), 8 << 20);
    // Two hundred seconds of one-second slices (and a cut one in between) of the same
    // two stacks.
    let mut start = 0.0;
    for second in 0..200 {
        let length = if second == 50 { 0.4 } else { 1.0 };
        ring.push(slice(start, length, &[0xa, 0xb], 3), None);
        start += length;
    }
    let kept = ring.kept();
    // The last minute in one-second slices, the rest in tens.
    assert!(
        (60 + 14..=60 + 16).contains(&kept.slices),
        "{} slices for {:?}",
        kept.slices,
        kept.span
    );
    assert_eq!(kept.stacks, 2);
    let collected = ring.select(at(0.0), at(start)).collected.unwrap();
    assert_eq!(by_leaf(&collected), HashMap::from([(0xa, 600), (0xb, 600)]));
    assert_eq!(collected.report.unwound, 1200);
    assert!((collected.duration.as_secs_f64() - start).abs() < 1e-6);
    // Folding is bounded by what was missed: a gap starts a slice of its own.
    let mut gapped = Ring::new(S(600), 8 << 20);
    for second in 0..100u32 {
        let gap = (second == 30).then(|| "yielded".to_owned());
        gapped.push(slice(f64::from(second), 1.0, &[0xa], 1), gap);
    }
    let selection = gapped.select(at(0.0), at(100.0));
    assert!(
        selection
            .notes
            .iter()
            .any(|n| n.starts_with("not sampled for 0.0 s")),
        "the gap survives folding: {:?}",
        selection.notes
    );
    // A short window in old history gets the coarse slice it falls in.
    let coarse = ring.select(at(20.5), at(21.5));
    let collected = coarse.collected.unwrap();
    assert!(collected.duration >= S(9), "{:?}", collected.duration);
    assert!(coarse.notes.iter().any(|n| n.contains("slices of 10 s")));
}

#[test]
fn nothing_grows_with_uptime() {
    let mut ring = Ring::new(S(60), 8 << 20);
    let mut sizes = Vec::new();
    for second in 0..3_000u32 {
        // A stack every second for its second only, and one always.
        ring.push(
            slice(
                f64::from(second),
                SLICE.as_secs_f64(),
                &[0xff, 0x10_0000 + u64::from(second)],
                2,
            ),
            None,
        );
        if second % 500 == 499 {
            sizes.push((ring.bytes(), ring.kept().stacks, ring.kept().slices));
        }
    }
    assert!(
        sizes.windows(2).all(|w| w[0] == w[1]),
        "bytes, stacks and slices after each 500 s: {sizes:?}"
    );
}

/// Threads are kept by name: two workers of one name with the same stack are one stack,
/// counted together, a thread that ended unnamed is `[short-lived thread]`, and the CPU
/// of threads that blocked `SIGPROF` is summed per name; the merged window names each
/// thread id it gives.
#[test]
fn threads_of_one_name_are_one_and_the_merge_names_every_id() {
    let mut ring = Ring::new(S(600), 8 << 20);
    let mut collected = slice(0.0, 1.0, &[], 0);
    let tally = |samples| Tally {
        samples,
        periods: samples,
    };
    collected.stacks = HashMap::from([
        (key(7, 0xa), tally(3)),
        (key(8, 0xa), tally(4)),
        (key(9, 0xa), tally(5)),
    ]);
    collected.names = HashMap::from([(7, "worker".into()), (8, "worker".into())]);
    collected.blocked = vec![(7, S(1)), (8, S(2))];
    ring.push(collected, None);
    assert_eq!(ring.kept().stacks, 2, "one per thread name");
    assert_eq!(
        ring.slices.back().unwrap().counts.len(),
        2,
        "one entry per stack in the slice, not one per thread"
    );

    let merged = ring.select(at(0.0), at(1.0)).collected.unwrap();
    let named: HashMap<&str, u64> = merged
        .stacks
        .iter()
        .map(|(key, tally)| (&*merged.names[&key.tid], tally.samples))
        .collect();
    assert_eq!(
        named,
        HashMap::from([("worker", 7), ("[short-lived thread]", 5)])
    );
    let blocked: Vec<(&str, Duration)> = merged
        .blocked
        .iter()
        .map(|(tid, unsampled)| (&*merged.names[tid], *unsampled))
        .collect();
    assert_eq!(blocked, [("worker", S(3))]);
}

/// Two rings given the same pushes but one: what each holds, side by side (their deques
/// grow alike, so the difference is what the one push differs in).
fn bytes_of(pushes: Vec<(Collected, Option<String>)>) -> usize {
    let mut ring = Ring::new(S(3600), 64 << 20);
    for (collected, gap) in pushes {
        ring.push(collected, gap);
    }
    ring.bytes()
}

#[test]
fn a_slice_weighs_its_counts_its_blocked_threads_names_and_its_gap_note() {
    let all: Vec<u64> = (1..=20).collect();
    let with = |leaves: &[u64], name: &str, gap: &str| {
        let mut second = slice(1.0, 1.0, leaves, 1);
        second.names.insert(8, name.into());
        second.blocked = vec![(8, Duration::from_millis(3))];
        vec![
            (slice(0.0, 1.0, &all, 1), None),
            (second, Some(gap.to_owned())),
        ]
    };
    let base = bytes_of(with(&all, "n", "g"));
    assert_eq!(
        base - bytes_of(with(&all[..10], "n", "g")),
        10 * size_of::<super::Count>(),
        "ten counts more"
    );
    assert_eq!(
        bytes_of(with(&all, &"n".repeat(500), "g")) - base,
        499,
        "a longer name"
    );
    assert_eq!(
        bytes_of(with(&all, "n", &"g".repeat(1000))) - base,
        999,
        "a longer note"
    );
    let without_blocked = {
        let mut pushes = with(&all, "n", "g");
        pushes[1].0.blocked.clear();
        bytes_of(pushes)
    };
    assert_eq!(
        base - without_blocked,
        size_of::<(std::sync::Arc<str>, Duration)>() + 1,
        "a blocked thread"
    );
}

/// A session's objects are counted once, however many slices share them.
#[test]
fn the_objects_of_consecutive_slices_are_counted_once() {
    let current = Objects::current();
    let with = |first: &Objects, second: &Objects| {
        let mut one = slice(0.0, 1.0, &[1], 1);
        one.objects = first.clone();
        let mut two = slice(1.0, 1.0, &[1], 1);
        two.objects = second.clone();
        bytes_of(vec![(one, None), (two, None)])
    };
    let none = Objects::default();
    let weight = super::objects_weight(&current);
    assert!(weight > 0);
    assert_eq!(with(&none, &current) - with(&none, &none), weight);
    // An empty list weighs nothing; the same list again, nothing more.
    assert_eq!(with(&current, &current), with(&current, &none));
    assert_eq!(with(&current, &current), with(&none, &current));
}

#[test]
fn a_paused_recorder_says_why_until_the_next_slice() {
    let mut ring = Ring::new(S(600), 8 << 20);
    assert_eq!(ring.paused(), None);
    ring.pause(at(0.0), "another profile runs".to_owned());
    assert_eq!(ring.paused(), Some("another profile runs"));
    ring.push(slice(1.0, 1.0, &[1], 1), None);
    assert_eq!(ring.paused(), None);
}

/// The bytes the ring counts are the bytes it holds: each slice's weight, and each
/// distinct object list once.
fn assert_counts_what_it_holds(ring: &Ring) {
    let mut lists: Vec<&std::sync::Arc<Objects>> = Vec::new();
    for slice in &ring.slices {
        if !lists
            .iter()
            .any(|l| std::sync::Arc::ptr_eq(l, &slice.objects))
        {
            lists.push(&slice.objects);
        }
    }
    let held = ring.slices.iter().map(super::Slice::weight).sum::<usize>()
        + lists
            .iter()
            .map(|l| super::objects_weight(l))
            .sum::<usize>();
    assert_eq!(ring.slice_bytes, held);
    // And each slice holds each stack once, by id: what a lookup and the next merge
    // rely on.
    for slice in &ring.slices {
        assert!(slice.counts.windows(2).all(|w| w[0].id < w[1].id));
    }
}

/// Slices with different stacks fold into one that sums each stack, what was lost, left
/// unattributed, spent and blocked, and the ring's count of bytes follows.
#[test]
fn folded_slices_sum_every_stack_and_tally_and_the_bytes_follow() {
    let mut ring = Ring::new(S(600), 8 << 20);
    let objects = Objects::current();
    let mut pushed_cpu = Duration::ZERO;
    for second in 0..120u32 {
        let leaves: &[u64] = if second % 2 == 0 {
            &[0xa, 0xc]
        } else {
            &[0xb, 0xc, 0xd]
        };
        let mut collected = slice(f64::from(second), 1.0, leaves, 2);
        collected.lost = Tally {
            samples: 1,
            periods: 3,
        };
        collected.unattributed = Duration::from_millis(1);
        collected.blocked = vec![(7, Duration::from_millis(2))];
        // A quarter of the seconds see another list of objects (a library unloaded,
        // say): the fold merges the two lists.
        collected.objects = if second % 4 == 0 {
            Objects::default()
        } else {
            objects.clone()
        };
        pushed_cpu += collected.cpu_time;
        ring.push(collected, None);
        assert_counts_what_it_holds(&ring);
    }
    assert!(ring.kept().slices < 80, "{:?}", ring.kept());
    let collected = ring.select(at(0.0), at(120.0)).collected.unwrap();
    assert_eq!(
        by_leaf(&collected),
        HashMap::from([(0xa, 120), (0xb, 120), (0xc, 240), (0xd, 120)])
    );
    assert_eq!((collected.lost.samples, collected.lost.periods), (120, 360));
    assert_eq!(collected.unattributed, Duration::from_millis(120));
    assert_eq!(collected.cpu_time, pushed_cpu);
    // Blocked threads are kept by name (an id stands for every thread of that name).
    let [(id, blocked)] = collected.blocked[..] else {
        panic!("{:?}", collected.blocked);
    };
    assert_eq!(
        (&*collected.names[&id], blocked),
        ("worker", Duration::from_millis(240))
    );
    assert_eq!(collected.duration, S(120));
}

/// The newest slice stays whatever the bounds say; a ring exactly at its memory bound
/// drops nothing.
#[test]
fn the_newest_slice_stays_and_the_bound_is_inclusive() {
    let mut tiny = Ring::new(S(600), 1);
    let mut no_history = Ring::new(S(0), 64 << 20);
    for second in 0..3u32 {
        tiny.push(slice(f64::from(second), 1.0, &[0xa], 1), None);
        no_history.push(slice(f64::from(second), 1.0, &[0xa], 1), None);
    }
    assert_eq!(tiny.kept().slices, 1);
    assert_eq!(no_history.kept().slices, 1);
    let pushes = || (0..2u32).map(|second| slice(f64::from(second), 1.0, &[0xa, 0xb], 1));
    let exact = bytes_of(pushes().map(|c| (c, None)).collect());
    let mut at_bound = Ring::new(S(600), exact);
    for collected in pushes() {
        at_bound.push(collected, None);
    }
    assert_eq!(at_bound.bytes(), exact);
    assert_eq!(at_bound.kept().slices, 2);
}

/// A fold merges a slice whose stacks came before those of the slice it joins: the
/// merged counts stay in id order (what the next merge and a lookup rely on).
#[test]
fn a_fold_keeps_the_counts_in_id_order_whichever_slice_had_a_stack_first() {
    let mut ring = Ring::new(S(600), 8 << 20);
    // 0xa and 0xb get their ids in the first slice, in an order of the hash map's
    // choosing; after each gap, a slice with one of them folds with a slice with the
    // other, in both orders: one of the two folds takes the higher id first, whichever
    // that is.
    ring.push(slice(0.0, 1.0, &[0xa, 0xb], 2), None);
    ring.push(slice(1.0, 1.0, &[0xb], 2), Some("yielded".to_owned()));
    ring.push(slice(2.0, 1.0, &[0xa], 2), None);
    ring.push(slice(20.0, 1.0, &[0xa], 2), Some("yielded".to_owned()));
    ring.push(slice(21.0, 1.0, &[0xb], 2), None);
    // A minute and more later: the five are old enough to fold.
    ring.push(slice(85.0, 1.0, &[0xc], 2), None);
    assert!(ring.slices.len() < 6, "folded: {}", ring.slices.len());
    assert_counts_what_it_holds(&ring);
    let collected = ring.select(at(0.0), at(86.0)).collected.unwrap();
    assert_eq!(
        by_leaf(&collected),
        HashMap::from([(0xa, 6), (0xb, 6), (0xc, 2)])
    );
    // Each sample here stands for one period: the periods are summed as the samples are.
    for tally in collected.stacks.values() {
        assert_eq!(tally.periods, tally.samples, "{tally:?}");
    }
}

/// Two slices' reports merge as one window's would have read: counts summed, the
/// handler's median weighted by the samples unwound, the worst p99, flags kept.
#[test]
fn reports_merge_weighted_by_samples_and_summed() {
    let mut into = Report {
        unwound: 300,
        direct: 200,
        complete: 250,
        handler_nanos: (1000, 5000),
        mean_depth: 10.0,
        foreign_signals: 2,
        unwinder_rebuilds: 1,
        threads_timed: 4,
        reader: "/proc/self/mem",
        reader_usual: true,
        ..Report::default()
    };
    let newer = Report {
        unwound: 100,
        direct: 50,
        complete: 60,
        handler_nanos: (3000, 4000),
        mean_depth: 30.0,
        foreign_signals: 3,
        unwinder_rebuilds: 2,
        threads_timed: 6,
        reader: "process_vm_readv",
        handler_replaced: true,
        ..Report::default()
    };
    super::merge_report(&mut into, &newer);
    assert_eq!(
        (into.unwound, into.direct, into.complete),
        (400, 250, 310),
        "summed"
    );
    assert_eq!(
        into.handler_nanos,
        (1500, 5000),
        "(1000 * 300 + 3000 * 100) / 400"
    );
    assert!((into.mean_depth - 15.0).abs() < 1e-9, "{}", into.mean_depth);
    assert_eq!((into.foreign_signals, into.unwinder_rebuilds), (5, 3));
    assert_eq!(
        (into.threads_timed, into.reader, into.reader_usual),
        (6, "process_vm_readv", false),
        "the newer slice's reader, and whether it is news"
    );
    assert!(into.handler_replaced);
    // A replaced handler stays said; a slice that unwound nothing moves no average.
    super::merge_report(&mut into, &Report::default());
    assert!(into.handler_replaced);
    assert_eq!(into.handler_nanos, (1500, 5000));
    assert!((into.mean_depth - 15.0).abs() < 1e-9);
    let mut empty = Report::default();
    super::merge_report(&mut empty, &Report::default());
    assert_eq!(
        empty.handler_nanos,
        (0, 0),
        "no samples: no division by zero"
    );
    assert_eq!(empty.mean_depth, 0.0, "no samples: no 0 / 0");
    // Into a report that unwound nothing (a selection's first slice merged into the
    // default), the newer's averages whole.
    let mut first = Report::default();
    super::merge_report(&mut first, &newer);
    assert_eq!(first.handler_nanos, (3000, 4000), "the newer's, as it is");
    assert!(
        (first.mean_depth - 30.0).abs() < 1e-9,
        "{}",
        first.mean_depth
    );
}

/// Each note's threshold, met exactly and just passed: a window that ends half a slice
/// after the newest slice names that half; one that ends a whole slice after it is not
/// yet "not sampled"; one that starts a slice before the oldest is not yet "nothing
/// before it"; a slice two slices long is not yet coarse.
#[test]
fn each_notes_threshold_is_met_exactly_and_then_passed() {
    let mut ring = Ring::new(S(600), 8 << 20);
    for second in 0..4 {
        ring.push(slice(f64::from(second), 1.0, &[0xa], 10), None);
    }
    ring.push(slice(4.0, 2.0, &[0xa], 20), None);
    let summary = |to: &str, asked: &str, ago: &str| {
        format!(
            "krabka-pprof recorder: 6.0 s sampled in 5 slices, from {ago} before the end of \
             the {asked} window asked for {to}"
        )
    };
    let notes = |from: f64, to: f64| ring.select(at(from), at(to)).notes;
    assert_eq!(
        notes(-1.0, 7.0),
        [summary("to 1.0 s before it", "8.0 s", "7.0 s")]
    );
    assert_eq!(
        notes(-1.0, 6.5),
        [summary("to 0.5 s before it", "7.5 s", "6.5 s")]
    );
    assert_eq!(notes(-1.0, 6.4), [summary("to its end", "7.4 s", "6.4 s")]);
    let later = notes(-1.0, 7.5);
    assert_eq!(
        later[1..],
        ["not sampled for the last 1.5 s: no slice was kept for it"]
    );
    let earlier = notes(-1.5, 7.0);
    assert_eq!(earlier.len(), 2, "{earlier:?}");
    assert!(
        earlier[1].contains("nothing is recorded before it"),
        "{earlier:?}"
    );
    // Nothing kept: a window that ends where the first slice starts is before the
    // recording; one that starts where the last slice ends, after it.
    assert_eq!(notes(-2.0, 0.0), ["the recorder started 0.0 s after it"]);
    assert_eq!(
        notes(6.0, 8.0),
        ["the recorder has not sampled in that time yet"]
    );
}

/// A selection names its addresses with every object list its slices saw: libraries
/// only in the newer list (loaded since) and only in the older (unloaded since) alike.
#[test]
fn a_selection_holds_the_objects_of_every_slice_it_merges() {
    let current = Objects::current();
    let names = |objects: &Objects| -> Vec<String> {
        objects.iter().map(|object| object.name.clone()).collect()
    };
    assert!(!names(&current).is_empty());
    for (older, newer) in [
        (Objects::default(), current.clone()),
        (current.clone(), Objects::default()),
    ] {
        let mut ring = Ring::new(S(600), 8 << 20);
        let mut one = slice(0.0, 1.0, &[1], 1);
        one.objects = older;
        let mut two = slice(1.0, 1.0, &[1], 1);
        two.objects = newer;
        ring.push(one, None);
        ring.push(two, None);
        let merged = ring.select(at(0.0), at(2.0)).collected.unwrap();
        assert_eq!(names(&merged.objects), names(&current));
    }
}

/// Pushed windows take each slice once, by its middle, whatever the slices' lengths (a
/// request's cut makes one short): consecutive windows hold every sample between them,
/// none twice, and a window is not taken before the recorder reached its end.
#[test]
fn pushed_windows_take_each_slice_once_by_its_middle() {
    let mut ring = Ring::new(S(600), 8 << 20);
    // Slices cut on whole seconds, one cut short by a request (2.0 .. 2.3 .. 3.0), and
    // one that straddles the windows' boundary at 4 s with its middle after it.
    for (start, length, leaf) in [
        (0.0, 1.0, 0xa),
        (1.0, 1.0, 0xb),
        (2.0, 0.3, 0xc),
        (2.3, 0.7, 0xd),
        (3.0, 0.9, 0xe),
        (3.9, 1.1, 0xf),
    ] {
        ring.push(slice(start, length, &[leaf], 10), None);
    }
    let now = at(5.0);
    assert!(
        ring.take(None, at(4.0), at(6.0), now).is_none(),
        "the recorder has not reached 6 s: the window is not complete"
    );
    let first = ring.take(None, at(0.0), at(4.0), now).expect("complete");
    let leaves = by_leaf(first.selection.collected.as_ref().unwrap());
    assert_eq!(
        leaves,
        HashMap::from([(0xa, 10), (0xb, 10), (0xc, 10), (0xd, 10), (0xe, 10)])
    );
    assert_eq!(first.last, Some(at(3.45)));
    ring.push(slice(5.0, 1.0, &[0x10], 10), None);
    let second = ring
        .take(first.last, at(4.0), at(6.0), now)
        .expect("complete");
    let leaves = by_leaf(second.selection.collected.as_ref().unwrap());
    assert_eq!(
        leaves,
        HashMap::from([(0xf, 10), (0x10, 10)]),
        "0xe is not taken again"
    );
    // Nothing recorded in a later window while the recorder is paused: complete once the
    // wall clock passed its end, and empty.
    ring.pause(at(6.0), "yielded".into());
    assert!(ring.take(second.last, at(6.0), at(8.0), at(7.0)).is_none());
    let empty = ring
        .take(second.last, at(6.0), at(8.0), at(8.5))
        .expect("paused and past its end");
    assert!(empty.selection.collected.is_none());
    assert_eq!(empty.last, None);
}

/// With a pusher's windows, history older than a minute folds only within them: the
/// windows taken after the fold (a pusher catching up after an outage) still hold each
/// sample once, and no folded slice straddles a window's bound.
#[test]
fn folds_keep_within_the_pushed_windows() {
    let mut ring = Ring::new(S(600), 8 << 20).pushed_in(Some(S(15)));
    for second in 0..90 {
        ring.push(slice(f64::from(second), 1.0, &[0xa], 10), None);
    }
    let window = |at: SystemTime| at.duration_since(at_origin()).unwrap().as_secs() / 15;
    assert!(
        ring.slices.iter().any(|s| s.duration > S(2)),
        "the old history was folded"
    );
    for slice in &ring.slices {
        assert_eq!(
            window(slice.started),
            window(slice.end() - Duration::from_millis(1)),
            "a slice from {:?} for {:?} straddles a window",
            slice.started,
            slice.duration
        );
    }
    let mut after = None;
    let mut total = 0;
    for start in (0..90).step_by(15) {
        let taken = ring
            .take(
                after,
                at(f64::from(start)),
                at(f64::from(start + 15)),
                at(100.0),
            )
            .expect("complete");
        total += by_leaf(taken.selection.collected.as_ref().unwrap())[&0xa];
        after = taken.last.or(after);
    }
    assert_eq!(total, 900, "every sample once");
}

fn at_origin() -> SystemTime {
    at(0.0)
}
