//! What a window collected, as the pprof `Profile` its request gets: `samples/count` and
//! `cpu/nanoseconds` per distinct (thread name, labels, stack), the markers that say what
//! the profile cannot show (lost samples, threads that block `SIGPROF`), the comments that
//! say how the session went; and the request's log line.
//!
//! A sample's labels are `thread` (the thread's name), the labels active on it
//! (`labels.rs`: the user's and a span's) and, only when asked, `thread_id`: a series
//! store such as Pyroscope keeps one series per distinct label set, and thread ids are
//! many (a blocking pool makes new ones every few seconds) where names are few.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::request::Split;
use crate::labels::table::SampleLabels;
use crate::profile::{LabelValue, Profile};
use crate::sampler::{self, stack_frames};

/// A sample's labels: the thread's name, its id if asked, the labels active on it.
fn labels_of(
    name: &str,
    tid: Option<u32>,
    labels: &SampleLabels,
) -> Vec<(Cow<'static, str>, LabelValue)> {
    crate::profile::thread_labels(name, tid, labels.pairs())
}

/// Puts what the sampler noticed into the request's span, and says what a reader of
/// the profile must know (a reader other than the usual one, a capped rate, a handler
/// replaced) at `warn` or `info`.
pub(super) fn log_report(report: &sampler::Report, capped: bool, shared_with: usize) {
    let span = tracing::Span::current();
    span.record("windows", shared_with);
    span.record("stack_reader", report.reader);
    span.record("threads_timed", report.threads_timed);
    span.record("foreign_signals", report.foreign_signals);
    span.record("handler_p50_ns", report.handler_nanos.0);
    span.record("handler_p99_ns", report.handler_nanos.1);
    span.record("rate_capped", capped);
    span.record("handler_replaced", report.handler_replaced);
    // `pread` of /proc/self/mem is the reader chosen first (`Memory::choose`): only
    // another, or this one chosen because of a seccomp filter, is news.
    if report.reader_usual {
        tracing::debug!(why = %report.reader_why, "stack reader: {}", report.reader);
    } else {
        tracing::info!(why = %report.reader_why, "stack reader: {}", report.reader);
    }
    if capped {
        tracing::info!(
            "the sampling rate was capped by the kernel tick: each sample carries the CPU \
             time of the periods it stands for"
        );
    }
    if report.handler_replaced {
        tracing::warn!(
            "another SIGPROF handler replaced this profiler's during the window; \
             counting stopped there, the profile covers only the time before"
        );
    }
    if let Some(shortfall) = &report.timer_shortfall {
        tracing::warn!("{shortfall}");
    }
}

/// A sample's identity once threads of one name are merged: name, id (when split), flags, frames, labels.
type MergeKey<'a> = (Arc<str>, Option<u32>, u8, &'a [u64], &'a SampleLabels);

/// The slowest kernel tick of Linux, in Hz.
const SLOWEST_TICK_HZ: u32 = 100;

/// The pprof profile of a finished session: `samples/count` and `cpu/nanoseconds`, one
/// sample per distinct (thread, stack); and whether the kernel capped the rate (the
/// samples stand for more periods than there were signals).
pub(super) fn report_profile(
    collected: sampler::Collected,
    shared_with: usize,
    symbolize: crate::symbolize::Symbolize,
    before: crate::symbolize::Resolved,
    split: Split,
) -> (Profile, bool) {
    use crate::profile::{Frame, Meta, ProfileBuilder};

    let period = 1_000_000_000 / i64::from(collected.frequency);
    let mut builder = ProfileBuilder::new(&collected.objects)
        .symbolize(symbolize)
        .resolved_before(before);
    let unnamed: Arc<str> = Arc::from(sampler::UNNAMED_THREAD);
    let name_of = |tid: u32| collected.names.get(&tid).unwrap_or(&unnamed).clone();
    let mut signals = collected.lost.samples;
    let mut periods = collected.lost.periods;
    // Samples of threads of one name, with the same labels and stack, are one sample.
    let mut merged: HashMap<MergeKey<'_>, sampler::Tally> = HashMap::new();
    for (stack, tally) in &collected.stacks {
        signals += tally.samples;
        periods += tally.periods;
        let tid = split.thread_ids.then_some(stack.tid);
        let key = (
            name_of(stack.tid),
            tid,
            stack.flags,
            &stack.frames[..],
            &stack.labels,
        );
        let sum = merged.entry(key).or_default();
        sum.samples += tally.samples;
        sum.periods += tally.periods;
    }
    let mut label_sets = std::collections::HashSet::new();
    for ((name, tid, flags, frames, labels), tally) in merged {
        label_sets.insert((name.clone(), tid, labels));
        builder.add(
            stack_frames(frames, flags, &collected.objects),
            vec![tally.samples as i64, tally.periods as i64 * period],
            labels_of(&name, tid, labels),
        );
    }
    if collected.lost.samples > 0 {
        builder.add(
            vec![Frame::Marker("[lost: sample buffer full]".into())],
            vec![
                collected.lost.samples as i64,
                collected.lost.periods as i64 * period,
            ],
            Vec::new(),
        );
    }
    // A thread that blocks SIGPROF keeps its timer's signal pending: its CPU is never
    // charged to another thread, and is shown here from its own clock (drain by drain,
    // see sampler/accounting.rs) so that the total still matches the process's CPU time.
    for &(tid, unsampled) in &collected.blocked {
        let name = name_of(tid);
        let unsampled = unsampled.as_nanos() as i64;
        builder.add(
            vec![Frame::Marker(format!(
                "[thread {name}: blocks SIGPROF, not sampled]"
            ))],
            vec![(unsampled + period / 2) / period, unsampled],
            labels_of(
                &name,
                split.thread_ids.then_some(tid),
                &SampleLabels::default(),
            ),
        );
    }
    // CPU no thread's clock accounts for: threads that lived and died between two
    // drains, where the kernel gave the backstop's signals to threads that drop them; and,
    // where the kernel refused some threads a timer of their own (their CPU is then the
    // backstop's to sample), long-lived threads too: the marker says which it can be.
    let unattributed = collected.unattributed.as_nanos() as i64;
    if unattributed > 2 * period {
        let marker = if collected.report.timer_shortfall.is_some() {
            "[threads without a CPU timer of their own, or too short-lived to be sampled]"
        } else {
            "[threads too short-lived to be sampled]"
        };
        builder.add(
            vec![Frame::Marker(marker.to_owned())],
            vec![(unattributed + period / 2) / period, unattributed],
            Vec::new(),
        );
    }
    // The tick caps a rate only above it, and no Linux kernel ticks slower than 100 Hz
    // (`CONFIG_HZ` is 100, 250, 300 or 1000). At or below that, periods beyond the
    // signals are signals delivered late (a thread that waited for a core, a virtual
    // machine's vCPU that missed ticks): kept in the samples' CPU time, not called a cap.
    let capped = collected.frequency > SLOWEST_TICK_HZ && periods > signals + signals / 8;
    let report = &collected.report;
    let mut comments = vec![
        format!(
            "krabka-pprof: {} Hz per-thread CPU timers on {} threads; stacks read with {}",
            collected.frequency, report.threads_timed, report.reader
        ),
        format!(
            "process CPU time over the window: {} ms",
            collected.cpu_time.as_millis()
        ),
    ];
    if capped {
        comments.push(format!(
            "{signals} signals stood for {periods} periods: the kernel tick capped the \
             rate, and each sample carries the CPU time it stands for"
        ));
    }
    if shared_with > 1 {
        comments.push(format!(
            "{shared_with} windows shared the sampler while this one was open; this profile \
             holds the samples of its own window only"
        ));
    }
    if report.handler_replaced {
        comments
            .push("another SIGPROF handler replaced this profiler's during the window".to_owned());
    }
    comments.push(format!(
        "signal handler: median {} ns, p99 {} ns per sample, {:.1} frames on average",
        report.handler_nanos.0, report.handler_nanos.1, report.mean_depth
    ));
    comments.push(format!(
        "{} stacks unwound: {} to their outermost frame, {} read without a system call",
        report.unwound, report.complete, report.direct
    ));
    if report.unwinder_rebuilds > 0 {
        comments.push(format!(
            "libraries were loaded or unloaded during the window: the unwinder followed them \
             ({} times)",
            report.unwinder_rebuilds
        ));
    }
    comments.push(format!(
        "{} distinct label sets (thread name and labels{})",
        label_sets.len(),
        if split.thread_ids {
            ", and thread id"
        } else {
            ""
        }
    ));
    let (sets, bytes) = crate::labels::table::usage();
    comments.push(format!(
        "label sets alive in the process: {sets}, {bytes} bytes of keys and values"
    ));
    if !report.labels {
        comments.push(
            "labels unavailable: krabka-pprof is in a shared library here, whose thread-locals \
             a signal handler cannot read safely"
                .to_owned(),
        );
    }
    if report.foreign_signals > 0 {
        comments.push(format!(
            "{} foreign SIGPROF signals ignored (kill, raise, or another timer)",
            report.foreign_signals
        ));
    }
    let profile = builder.finish(
        &Meta {
            sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
            period_type: ("cpu", "nanoseconds"),
            period,
            time: collected.started,
            duration: collected.duration,
            default_sample_type: None,
            comments,
        },
        &|_| false,
    );
    (profile, capped)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::{Duration, SystemTime};

    use crate::objects::Objects;
    use crate::sampler::{Collected, Report, StackKey, Tally};

    /// The profile of a window that had the sampler to itself.
    fn report_profile(collected: Collected) -> (crate::profile::proto::Profile, bool) {
        super::report_profile(
            collected,
            1,
            crate::symbolize::Symbolize::Full,
            crate::symbolize::Resolved::default(),
            super::Split::default(),
        )
    }

    /// A session's collection: one stack in this test's own code, and what was lost.
    fn collected(stack: Tally, lost: Tally) -> Collected {
        let here = collected as fn(Tally, Tally) -> Collected as usize as u64;
        let mut stacks = HashMap::new();
        stacks.insert(
            StackKey {
                tid: std::process::id(),
                flags: 0,
                labels: Default::default(),
                frames: vec![here].into_boxed_slice(),
            },
            stack,
        );
        Collected {
            stacks,
            names: HashMap::new(),
            lost,
            started: SystemTime::now(),
            duration: Duration::from_secs(1),
            cpu_time: Duration::from_millis(500),
            frequency: 100,
            objects: Objects::current(),
            blocked: Vec::new(),
            unattributed: Duration::ZERO,
            report: Report::default(),
        }
    }

    /// The values of the sample whose only frame is named `name`.
    fn marker_values(profile: &crate::profile::proto::Profile, name: &str) -> Option<Vec<i64>> {
        let function = profile
            .function
            .iter()
            .find(|f| profile.string_table[f.name as usize] == name)?;
        let location = profile
            .location
            .iter()
            .find(|l| l.line.iter().any(|line| line.function_id == function.id))?;
        profile
            .sample
            .iter()
            .find(|s| s.location_id == [location.id])
            .map(|s| s.value.clone())
    }

    #[test]
    fn lost_samples_are_a_marker_with_their_periods() {
        let (profile, capped) = report_profile(collected(
            Tally {
                samples: 20,
                periods: 20,
            },
            Tally {
                samples: 3,
                periods: 5,
            },
        ));
        assert_eq!(
            marker_values(&profile, "[lost: sample buffer full]"),
            Some(vec![3, 5 * 10_000_000]),
            "3 samples standing for 5 periods of 10 ms"
        );
        assert!(
            !capped,
            "25 periods from 23 signals is within the 1/8 margin"
        );
        let none = report_profile(collected(
            Tally {
                samples: 20,
                periods: 20,
            },
            Tally::default(),
        ))
        .0;
        assert_eq!(marker_values(&none, "[lost: sample buffer full]"), None);
    }

    #[test]
    fn samples_standing_for_more_periods_keep_their_cpu_time_and_say_so() {
        let at = |frequency: u32, samples: u64, periods: u64| {
            let mut collected = collected(Tally { samples, periods }, Tally::default());
            collected.frequency = frequency;
            report_profile(collected)
        };
        let (profile, capped) = at(1000, 10, 40);
        assert!(capped);
        let total: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(
            total,
            40 * 1_000_000,
            "cpu/nanoseconds counts periods, not signals"
        );
        let counts: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(counts, 10, "samples/count counts signals");
        let said = comments(&profile);
        assert!(
            said.iter()
                .any(|c| c.starts_with("10 signals stood for 40 periods")),
            "{said:?}"
        );
        // 120 periods from 100 signals is beyond the 1/8 margin.
        assert!(at(1000, 100, 120).1);
        // At the margin: 45 periods from 40 signals is not a cap.
        assert!(!at(1000, 40, 45).1);
        // At 100 Hz and below no tick caps the rate: signals that came late keep their
        // CPU time, and are not called a cap.
        let (profile, capped) = at(100, 10, 40);
        assert!(!capped);
        let total: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(total, 40 * 10_000_000);
        let said = comments(&profile);
        assert!(!said.iter().any(|c| c.contains("capped")), "{said:?}");
        assert!(at(101, 10, 40).1, "above 100 Hz a tick may cap it");
    }

    /// The profile's comments.
    fn comments(profile: &crate::profile::proto::Profile) -> Vec<String> {
        profile
            .comment
            .iter()
            .map(|&i| profile.string_table[i as usize].clone())
            .collect()
    }

    #[test]
    fn cpu_no_thread_accounts_for_is_a_marker_beyond_two_periods() {
        let stack = Tally {
            samples: 20,
            periods: 20,
        };
        // 100 Hz: a period is 10 ms. Two periods of it are noise, 35 ms are shown.
        for (unattributed, marker) in [(20, None), (35, Some(vec![4, 35_000_000]))] {
            let mut collected = collected(stack, Tally::default());
            collected.unattributed = Duration::from_millis(unattributed);
            let (profile, _) = report_profile(collected);
            assert_eq!(
                marker_values(&profile, "[threads too short-lived to be sampled]"),
                marker,
                "{unattributed} ms"
            );
        }
        // Where some threads have no timer of their own, their CPU can be in it too.
        let mut collected = collected(stack, Tally::default());
        collected.unattributed = Duration::from_millis(35);
        collected.report.timer_shortfall = Some("EAGAIN".to_owned());
        let (profile, _) = report_profile(collected);
        assert_eq!(
            marker_values(
                &profile,
                "[threads without a CPU timer of their own, or too short-lived to be sampled]"
            ),
            Some(vec![4, 35_000_000])
        );
        assert_eq!(
            marker_values(&profile, "[threads too short-lived to be sampled]"),
            None
        );
    }

    #[test]
    fn what_the_session_noticed_is_said_in_comments_and_nothing_else_is() {
        let stack = Tally {
            samples: 20,
            periods: 20,
        };
        let quiet = comments(&report_profile(collected(stack, Tally::default())).0);
        let mut noticed = collected(stack, Tally::default());
        noticed.report = Report {
            handler_replaced: true,
            unwinder_rebuilds: 2,
            labels: true,
            foreign_signals: 4,
            ..Report::default()
        };
        let loud = comments(
            &super::report_profile(
                noticed,
                3,
                crate::symbolize::Symbolize::Full,
                crate::symbolize::Resolved::default(),
                super::Split::default(),
            )
            .0,
        );
        let says = |comments: &[String], part: &str| comments.iter().any(|c| c.contains(part));
        for (said, part) in [
            ("3 windows shared", "windows shared the sampler"),
            (
                "another SIGPROF handler replaced",
                "another SIGPROF handler replaced",
            ),
            ("followed them (2 times)", "the unwinder followed them"),
            (
                "4 foreign SIGPROF signals",
                "foreign SIGPROF signals ignored",
            ),
        ] {
            assert!(says(&loud, said), "{said}: {loud:?}");
            assert!(!says(&quiet, part), "{part}: {quiet:?}");
        }
        // Labels: said unavailable where the report says so (the default), not otherwise.
        assert!(says(&quiet, "labels unavailable"), "{quiet:?}");
        assert!(!says(&loud, "labels unavailable"), "{loud:?}");
    }

    #[test]
    fn every_sample_names_its_thread() {
        let (profile, _) = report_profile(collected(
            Tally {
                samples: 20,
                periods: 20,
            },
            Tally::default(),
        ));
        let thread = profile
            .string_table
            .iter()
            .position(|s| s == "thread")
            .expect("a thread label") as i64;
        assert!(!profile.sample.is_empty());
        for sample in &profile.sample {
            assert!(sample.label.iter().any(|l| l.key == thread), "{sample:?}");
        }
    }
}
