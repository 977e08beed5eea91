//! Profiles of the past: the recorder, an always-on window of the CPU session at the
//! attribute's `frequency` (`recent/recorder.rs`), its samples folded into slices kept for
//! `recent` within `recent_memory` (`recent/ring.rs`), each stack kept once
//! (`recent/stacks.rs`); and `/recent`'s answer, the slices of the window asked for
//! merged into one collection and made a profile by `cpu/report.rs`, as any window's.
//!
//! A part of `cpu/`, not a kind of its own: the recorder is a window of the CPU session
//! (it sits on it, yields it to other frequencies and to `force=true`, and takes it back,
//! under the same lease as the requests' windows in `cpu/sessions.rs`), and what it
//! answers is a CPU profile built by the same report. Answering takes no window: the
//! newest slice is cut at once, and the merge, symbolization and rendering run on the
//! blocking pool.

mod recorder;
mod ring;
mod stacks;

use std::time::{Duration, SystemTime};

use super::report::{log_report, report_profile};
use super::request::{RecentError, RecentRequest, Recorded, RecorderSettings, RecorderStatus};
use crate::profile::Profile;

/// How long a request waits for the recorder to cut its newest slice: it takes a drain,
/// unless the recorder is starting a sampler that moment.
const CUT_WAIT: Duration = Duration::from_millis(250);

/// Starts this process's recorder with `settings`, if it does not run yet.
pub(super) fn switched_off() {
    if let Some(recorder) = recorder::get() {
        recorder.switch_off();
    }
}

pub(super) fn start(settings: RecorderSettings) {
    recorder::start(settings);
}

/// The recorder, if one was started in this process.
pub(super) fn status() -> Option<RecorderStatus> {
    let recorder = recorder::get()?;
    let ring = recorder.ring();
    let kept = ring.kept();
    Some(RecorderStatus {
        settings: recorder.settings,
        span: kept.span,
        sampled: kept.sampled,
        bytes: kept.bytes,
        stacks: kept.stacks,
        paused: ring.paused().map(str::to_owned),
    })
}

/// The CPU profile of the window `request` asks for, from what the recorder kept, handed
/// to `render` on the blocking pool.
pub(super) async fn profile<R, F>(
    settings: RecorderSettings,
    request: RecentRequest,
    render: F,
) -> Result<R, RecentError>
where
    F: FnOnce(Profile) -> Result<R, RecentError> + Send + 'static,
    R: Send + 'static,
{
    // A child made by `fork` has no recorder until it asks.
    let recorder = recorder::start(settings);
    // Everything up to now in the ring. A recorder that does not answer in time leaves
    // the profile a little short of now, and the profile says so.
    let cut_in_time = tokio::time::timeout(CUT_WAIT, recorder.cut())
        .await
        .is_ok_and(|answered| answered.is_ok());
    // Built where a window's profile is (see `on_profiler_thread`).
    let (rendered, report, capped) = crate::offload::on_profiler_thread(
        move || {
            let to = request.end.unwrap_or_else(SystemTime::now);
            let from = to
                .checked_sub(request.seconds)
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let selection = recorder.ring().select(from, to);
            let Some(collected) = selection.collected else {
                return Err(RecentError::NothingKept(selection.notes.join("; ")));
            };
            let report = collected.report.clone();
            let (mut profile, capped) = report_profile(
                collected,
                1,
                request.symbolize,
                crate::symbolize::Resolved::default(),
                super::request::Split::default(),
            );
            let mut notes = selection.notes;
            notes.extend(missing_tail(cut_in_time, request.end).map(str::to_owned));
            comment_first(&mut profile, notes);
            let rendered = render(profile);
            crate::profile::give_back_freed_memory();
            Ok((rendered, report, capped))
        },
        RecentError::Failed,
    )
    .await?;
    log_report(&report, capped, 1);
    rendered
}

/// The window `from .. to` of this process's recorder, for the pusher: `None` while it
/// is not complete (or no recorder runs). Each slice goes to exactly one window: the
/// first after `after`, the `last` of the window before. Symbolized as `/recent` is.
#[cfg_attr(not(feature = "push"), allow(dead_code))]
pub(super) fn window(
    after: Option<SystemTime>,
    from: SystemTime,
    to: SystemTime,
) -> Option<Recorded> {
    let recorder = recorder::get()?;
    let taken = recorder.ring().take(after, from, to, SystemTime::now())?;
    let profile = taken.selection.collected.map(|collected| {
        let (mut profile, _capped) = report_profile(
            collected,
            1,
            crate::symbolize::Symbolize::Full,
            crate::symbolize::Resolved::default(),
            super::request::Split::default(),
        );
        profile.time_nanos = from
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
            });
        comment_first(&mut profile, taken.selection.notes);
        profile
    });
    Some(Recorded {
        profile,
        last: taken.last,
    })
}

/// What a profile says when the recorder did not cut its newest slice within
/// [`CUT_WAIT`], said only of a range that ends now (no `end` asked for). A pure
/// function so its four cases are unit-tested: the recorder's thread answers in time on
/// any machine a test can trust, so a suite never sees the late case.
fn missing_tail(cut_in_time: bool, end: Option<SystemTime>) -> Option<&'static str> {
    (!cut_in_time && end.is_none()).then_some(
        "the recorder did not cut its newest slice in time: the last second or so is missing",
    )
}

/// Puts `notes` before the profile's other comments: what the recorder covered comes
/// first in `go tool pprof -comments`.
fn comment_first(profile: &mut Profile, notes: Vec<String>) {
    let first = profile.string_table.len() as i64;
    let count = notes.len() as i64;
    profile.string_table.extend(notes);
    profile.comment.splice(0..0, first..first + count);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The missing tail is said only of a range that ends now, and only when the cut
    /// came too late.
    #[test]
    fn only_a_late_cut_of_a_range_ending_now_says_its_tail_is_missing() {
        let past = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        assert!(missing_tail(false, None).is_some_and(|note| note.contains("in time")));
        assert_eq!(missing_tail(true, None), None);
        assert_eq!(missing_tail(false, past), None);
        assert_eq!(missing_tail(true, past), None);
    }

    /// What the recorder says of the range comes before the profile's own comments, in
    /// order, each its own string.
    #[test]
    fn the_recorders_notes_come_first_among_the_comments() {
        let mut profile = Profile {
            string_table: vec![String::new(), "sampled at 99 Hz".into(), "lost 0".into()],
            comment: vec![1, 2],
            ..Profile::default()
        };
        comment_first(
            &mut profile,
            vec!["covers 60 s".into(), "not sampled for 2 s".into()],
        );
        let comments: Vec<&str> = profile.comment.iter().map(|&c| profile.string(c)).collect();
        assert_eq!(
            comments,
            [
                "covers 60 s",
                "not sampled for 2 s",
                "sampled at 99 Hz",
                "lost 0"
            ]
        );
    }
}
