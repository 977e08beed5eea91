//! The recorder's history: what each slice of the always-on window collected, newest
//! last, kept for `recent` and within `recent_memory`, the oldest dropped first; and the
//! merge of the slices of a time range into one `Collected`, which `cpu/report.rs` turns
//! into a profile like any window's.
//!
//! Slices are one second long while they are under a minute old (a request cuts the
//! newest short, so that it holds everything up to the request), then folded into slices
//! of ten seconds: a minute of history has the resolution of an incident, ten minutes
//! cost a sixth as much. A slice holds ids of stacks (`stacks.rs`), never stacks. Nothing
//! here grows with uptime: every slice, stack and object list is dropped with the last
//! slice that needs it, and the counted bytes include them all.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::stacks::Stacks;
use crate::objects::Objects;
use crate::sampler::{Collected, Report, StackKey, Tally};

/// How long a fresh slice lasts.
pub(super) const SLICE: Duration = Duration::from_secs(1);
/// Slices younger than this keep their one-second resolution.
const FINE: Duration = Duration::from_secs(60);
/// How long older slices are folded up to.
const COARSE: Duration = Duration::from_secs(10);

/// One stack's count in one slice. Within ten seconds no stack reaches 2^32 samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Count {
    id: u32,
    samples: u32,
    periods: u32,
}

/// What one slice of the recorder's window collected.
struct Slice {
    started: SystemTime,
    duration: Duration,
    /// Sorted by id.
    counts: Box<[Count]>,
    lost: Tally,
    /// By thread name, sorted.
    blocked: Box<[(Arc<str>, Duration)]>,
    unattributed: Duration,
    cpu_time: Duration,
    frequency: u32,
    /// Shared with the slices of the same session (compared when pushed).
    objects: Arc<Objects>,
    /// Without its strings (the ring keeps the newest once).
    report: Report,
    /// Why nothing was sampled between the slice before and this one.
    gap_before: Option<String>,
}

impl Slice {
    fn end(&self) -> SystemTime {
        self.started + self.duration
    }

    /// Which pushed window the slice belongs to (see [`Ring::take`]).
    fn middle(&self) -> SystemTime {
        self.started + self.duration / 2
    }

    fn weight(&self) -> usize {
        size_of::<Slice>()
            + self.counts.len() * size_of::<Count>()
            + self
                .blocked
                .iter()
                .map(|(name, _)| size_of::<(Arc<str>, Duration)>() + name.len())
                .sum::<usize>()
            + self.gap_before.as_ref().map_or(0, String::len)
            + 32
    }
}

/// What was dropped, for what a profile says it is missing.
#[derive(Clone, Copy, Debug, Default)]
struct Dropped {
    /// The end of the newest slice dropped for being older than `recent`.
    for_age: Option<SystemTime>,
    /// The end of the newest slice dropped to stay within `recent_memory`.
    for_memory: Option<SystemTime>,
}

/// The recorder's history.
pub(super) struct Ring {
    stacks: Stacks,
    slices: VecDeque<Slice>,
    /// Bytes of the slices and of their distinct object lists.
    slice_bytes: usize,
    keep: Duration,
    budget: usize,
    dropped: Dropped,
    /// Not sampling now: since when, and why.
    paused: Option<(SystemTime, String)>,
    /// The newest report's strings.
    reader_why: String,
    timer_shortfall: Option<String>,
    /// The pusher's windows, if it pushes: no fold crosses their bounds.
    pushed_in: Option<Duration>,
}

/// The recorder's history as the index page shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kept {
    /// From the oldest slice's start to the newest's end.
    pub(crate) span: Duration,
    /// Of which sampled (without the gaps).
    pub(crate) sampled: Duration,
    pub(crate) bytes: usize,
    pub(crate) slices: usize,
    pub(crate) stacks: usize,
}

/// What a pushed window took from the ring.
#[cfg_attr(not(feature = "push"), allow(dead_code))]
pub(super) struct Taken {
    pub(super) selection: Selection,
    /// The middle of the newest slice it took, the next window's `after`; `None` if it
    /// took none.
    pub(super) last: Option<SystemTime>,
}

/// The slices of a time range, merged.
pub(super) struct Selection {
    /// What they collected together, as one window would have; `None` if no slice is
    /// kept for the range.
    pub(super) collected: Option<Collected>,
    /// What the profile must say: what it covers, what is missing and why.
    pub(super) notes: Vec<String>,
}

impl Ring {
    pub(super) fn new(keep: Duration, budget: usize) -> Ring {
        Ring {
            stacks: Stacks::default(),
            slices: VecDeque::new(),
            slice_bytes: 0,
            keep,
            budget,
            dropped: Dropped::default(),
            paused: None,
            reader_why: String::new(),
            timer_shortfall: None,
            pushed_in: None,
        }
    }

    /// Folds only within the pusher's windows of `interval` (`take` gives a window its
    /// slices by their middles: a slice folded across a window's bound would be sent in
    /// two windows, or in none).
    pub(super) fn pushed_in(mut self, interval: Option<Duration>) -> Ring {
        self.pushed_in = interval.filter(|interval| !interval.is_zero());
        self
    }

    /// Whether `a` and `b` may fold into one slice: they lie in one pushed window.
    fn same_window(&self, a: &Slice, b: &Slice) -> bool {
        let Some(interval) = self.pushed_in else {
            return true;
        };
        let window = |slice: &Slice| {
            slice
                .middle()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() / interval.as_nanos())
        };
        window(a) == window(b)
    }

    /// Adds the newest slice, then folds, and drops what is too old or too much.
    /// `gap_before`: why nothing was sampled since the slice before, if the recorder
    /// paused in between.
    pub(super) fn push(&mut self, collected: Collected, gap_before: Option<String>) {
        let Collected {
            stacks,
            names,
            lost,
            blocked,
            unattributed,
            started,
            duration,
            cpu_time,
            frequency,
            objects,
            mut report,
        } = collected;
        let unnamed: Arc<str> = Arc::from(crate::sampler::UNNAMED_THREAD);
        let name_of = |tid: u32| names.get(&tid).unwrap_or(&unnamed).clone();
        let mut counts: Vec<Count> = stacks
            .into_iter()
            .map(|(key, tally)| Count {
                id: self.stacks.hold(name_of(key.tid), key),
                samples: u32::try_from(tally.samples).unwrap_or(u32::MAX),
                periods: u32::try_from(tally.periods).unwrap_or(u32::MAX),
            })
            .collect();
        counts.sort_unstable_by_key(|c| c.id);
        // Threads of one name with the same stack (a runtime's workers) are one entry,
        // held once.
        counts.dedup_by(|later, kept| {
            let same = later.id == kept.id;
            if same {
                self.stacks.release(later.id);
                kept.samples = kept.samples.saturating_add(later.samples);
                kept.periods = kept.periods.saturating_add(later.periods);
            }
            same
        });
        let blocked = merge_blocked(
            &[],
            &blocked
                .into_iter()
                .map(|(tid, unsampled)| (name_of(tid), unsampled))
                .collect::<Vec<_>>(),
        );
        self.reader_why = std::mem::take(&mut report.reader_why);
        self.timer_shortfall = report.timer_shortfall.take();
        let objects = match self.slices.back() {
            Some(last) if same_objects(&last.objects, &objects) => last.objects.clone(),
            _ => {
                self.slice_bytes += objects_weight(&objects);
                Arc::new(objects)
            }
        };
        let slice = Slice {
            started,
            duration,
            counts: counts.into_boxed_slice(),
            lost,
            blocked: blocked.into_boxed_slice(),
            unattributed,
            cpu_time,
            frequency,
            objects,
            report,
            gap_before,
        };
        self.paused = None;
        self.slice_bytes += slice.weight();
        self.slices.push_back(slice);
        self.fold();
        self.drop_old();
    }

    /// The recorder stopped sampling at `since` (it yielded, or could not start).
    pub(super) fn pause(&mut self, since: SystemTime, why: String) {
        self.paused = Some((since, why));
    }

    /// Why the recorder does not sample now, if it does not.
    pub(super) fn paused(&self) -> Option<&str> {
        self.paused.as_ref().map(|(_, why)| why.as_str())
    }

    pub(super) fn kept(&self) -> Kept {
        Kept {
            span: match (self.slices.front(), self.slices.back()) {
                (Some(first), Some(last)) => {
                    last.end().duration_since(first.started).unwrap_or_default()
                }
                _ => Duration::ZERO,
            },
            sampled: self.slices.iter().map(|s| s.duration).sum(),
            bytes: self.bytes(),
            slices: self.slices.len(),
            stacks: self.stacks.len(),
        }
    }

    /// Everything counted against the memory bound.
    fn bytes(&self) -> usize {
        self.stacks.bytes() + self.slice_bytes + self.slices.capacity() * size_of::<Slice>()
    }

    /// Folds slices older than a minute into slices of up to ten seconds, each with the
    /// one after it when nothing was missed between them.
    fn fold(&mut self) {
        let Some(newest) = self.slices.back().map(Slice::end) else {
            return;
        };
        let Some(cutoff) = newest.checked_sub(FINE) else {
            return;
        };
        let mut i = 1;
        while i < self.slices.len() && self.slices[i].end() <= cutoff {
            let (before, this) = (&self.slices[i - 1], &self.slices[i]);
            if this.gap_before.is_none()
                && this.frequency == before.frequency
                && self.same_window(before, this)
                && before.duration + this.duration <= COARSE + SLICE / 2
            {
                let this = self.slices.remove(i).expect("within bounds");
                let mut before = self.slices.remove(i - 1).expect("within bounds");
                self.slice_bytes -= this.weight() + before.weight();
                self.merge_into(&mut before, this);
                self.slice_bytes += before.weight();
                self.slices.insert(i - 1, before);
            } else {
                i += 1;
            }
        }
    }

    /// Adds `later` (the slice right after `into`) to `into`.
    fn merge_into(&mut self, into: &mut Slice, later: Slice) {
        let mut counts = Vec::with_capacity(into.counts.len() + later.counts.len());
        let (mut a, mut b) = (
            into.counts.iter().peekable(),
            later.counts.iter().peekable(),
        );
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.id == y.id => {
                    // One slice now holds it where two did.
                    self.stacks.release(x.id);
                    let sum = Count {
                        id: x.id,
                        samples: x.samples.saturating_add(y.samples),
                        periods: x.periods.saturating_add(y.periods),
                    };
                    a.next();
                    b.next();
                    sum
                }
                (Some(x), Some(y)) if x.id < y.id => *a.next().expect("peeked"),
                (Some(_), Some(_)) | (None, Some(_)) => *b.next().expect("peeked"),
                (Some(_), None) => *a.next().expect("peeked"),
                (None, None) => break,
            };
            counts.push(next);
        }
        into.counts = counts.into_boxed_slice();
        into.duration += later.duration;
        into.lost.samples += later.lost.samples;
        into.lost.periods += later.lost.periods;
        into.blocked = merge_blocked(&into.blocked, &later.blocked).into_boxed_slice();
        into.unattributed += later.unattributed;
        into.cpu_time += later.cpu_time;
        merge_report(&mut into.report, &later.report);
        if !Arc::ptr_eq(&into.objects, &later.objects) {
            self.forget_objects(&into.objects);
            self.forget_objects(&later.objects);
            let merged = later.objects.merged_with(&into.objects);
            self.slice_bytes += objects_weight(&merged);
            into.objects = Arc::new(merged);
        }
    }

    /// Drops slices older than `recent`, then the oldest until the bytes are within the
    /// bound (the newest slice stays, whatever it weighs).
    fn drop_old(&mut self) {
        let Some(newest) = self.slices.back().map(Slice::end) else {
            return;
        };
        let oldest_kept = newest.checked_sub(self.keep);
        while let Some(first) = self.slices.front() {
            let end = first.end();
            if oldest_kept.is_some_and(|oldest| end <= oldest) && self.slices.len() > 1 {
                self.dropped.for_age = Some(end);
            } else if self.bytes() > self.budget && self.slices.len() > 1 {
                self.dropped.for_memory = Some(end);
            } else {
                break;
            }
            let first = self.slices.pop_front().expect("looked at");
            self.forget(first);
        }
        if self.slices.capacity() > 4 * self.slices.len().max(16) {
            self.slices.shrink_to_fit();
        }
    }

    /// Frees what only `slice` used.
    fn forget(&mut self, slice: Slice) {
        self.slice_bytes -= slice.weight();
        for count in &slice.counts {
            self.stacks.release(count.id);
        }
        self.forget_objects(&slice.objects);
    }

    /// `objects` loses a slice; if no other slice shares it, its bytes go.
    fn forget_objects(&mut self, objects: &Arc<Objects>) {
        // The slice that let go of it is out of the ring already.
        let others = self
            .slices
            .iter()
            .any(|slice| Arc::ptr_eq(&slice.objects, objects));
        if !others {
            self.slice_bytes -= objects_weight(objects);
        }
    }

    /// The slices of `from ..= to`, merged: each slice that lies mostly within it (or, if
    /// none does, the one that overlaps it most), and what the profile must say.
    pub(super) fn select(&self, from: SystemTime, to: SystemTime) -> Selection {
        let overlap = |slice: &Slice| {
            let start = slice.started.max(from);
            let end = slice.end().min(to);
            end.duration_since(start).unwrap_or_default()
        };
        let mut chosen: Vec<usize> = (0..self.slices.len())
            .filter(|&i| overlap(&self.slices[i]) * 2 > self.slices[i].duration)
            .collect();
        if chosen.is_empty()
            && let Some(best) = (0..self.slices.len())
                .filter(|&i| overlap(&self.slices[i]) > Duration::ZERO)
                .max_by_key(|&i| overlap(&self.slices[i]))
        {
            chosen.push(best);
        }
        self.selection(&chosen, from, to)
    }

    /// The slices a pushed window `[from, to)` takes (`crate::push`): those whose middle
    /// lies before `to` and after `after`, the middle of the last slice an earlier window
    /// took. Each slice is so taken by exactly one window, whatever their lengths: windows
    /// are contiguous, never overlap, and a slice that arrives late goes to the next
    /// window rather than nowhere. `None` while the window is not complete: the newest
    /// slice does not reach `to` and the recorder samples (a slice is under way), or
    /// while it was never pushed a slice at all.
    #[cfg_attr(not(feature = "push"), allow(dead_code))]
    pub(super) fn take(
        &self,
        after: Option<SystemTime>,
        from: SystemTime,
        to: SystemTime,
        now: SystemTime,
    ) -> Option<Taken> {
        let newest_end = self.slices.back().map(Slice::end);
        let complete =
            newest_end.is_some_and(|end| end >= to) || (self.paused.is_some() && now >= to);
        if !complete {
            return None;
        }
        let chosen: Vec<usize> = (0..self.slices.len())
            .filter(|&i| {
                let middle = self.slices[i].middle();
                middle < to && after.is_none_or(|after| middle > after)
            })
            .collect();
        let last = chosen.last().map(|&i| self.slices[i].middle());
        Some(Taken {
            selection: self.selection(&chosen, from, to),
            last,
        })
    }

    /// What `chosen` (indices, oldest first) hold for the window `from ..= to`, merged, and
    /// what the profile must say.
    fn selection(&self, chosen: &[usize], from: SystemTime, to: SystemTime) -> Selection {
        let mut notes = Vec::new();
        let asked = to.duration_since(from).unwrap_or_default();
        let ago = |at: SystemTime| secs(to.duration_since(at).unwrap_or_default());
        let (Some(&first), Some(&last)) = (chosen.first(), chosen.last()) else {
            notes.push(self.nothing_kept(from, to));
            return Selection {
                collected: None,
                notes,
            };
        };
        let slices: Vec<&Slice> = chosen.iter().map(|&i| &self.slices[i]).collect();
        let covered: Duration = slices.iter().map(|s| s.duration).sum();
        let to_end = match to.duration_since(self.slices[last].end()) {
            Ok(before) if before >= SLICE / 2 => format!("to {} before it", secs(before)),
            _ => "to its end".to_owned(),
        };
        notes.push(format!(
            "krabka-pprof recorder: {} sampled in {} slice{}, from {} before the end of the \
             {} window asked for {to_end}",
            secs(covered),
            slices.len(),
            if slices.len() == 1 { "" } else { "s" },
            ago(self.slices[first].started),
            secs(asked),
        ));
        if self.slices[first].started > from + SLICE {
            notes.push(self.missing_before(self.slices[first].started, to));
        }
        for pair in (first..=last).collect::<Vec<_>>().windows(2) {
            let (before, this) = (&self.slices[pair[0]], &self.slices[pair[1]]);
            if let Some(why) = &this.gap_before {
                let gap = this
                    .started
                    .duration_since(before.end())
                    .unwrap_or_default();
                notes.push(format!(
                    "not sampled for {} from {} before the end: {why}",
                    secs(gap),
                    ago(before.end()),
                ));
            }
        }
        let newest_end = self.slices[last].end();
        if newest_end + SLICE < to {
            let why = match &self.paused {
                Some((_, why)) => why.clone(),
                None => "no slice was kept for it".to_owned(),
            };
            notes.push(format!(
                "not sampled for the last {}: {why}",
                secs(to.duration_since(newest_end).unwrap_or_default())
            ));
        }
        if slices.iter().any(|s| s.duration > SLICE * 2) {
            notes.push(format!(
                "history older than {} is kept in slices of {}: the ends of the window are \
                 that coarse there",
                secs(FINE),
                secs(COARSE)
            ));
        }
        Selection {
            collected: Some(self.merge(&slices, covered)),
            notes,
        }
    }

    /// Why nothing is kept from before `oldest`, as a note.
    fn missing_before(&self, oldest: SystemTime, to: SystemTime) -> String {
        let ago = secs(to.duration_since(oldest).unwrap_or_default());
        match self.dropped {
            Dropped {
                for_memory: Some(_),
                ..
            } => format!(
                "history from before {ago} before the end was dropped to stay within \
                 recent_memory ({})",
                crate::config::Bytes(self.budget)
            ),
            Dropped {
                for_age: Some(_), ..
            } => format!(
                "history older than recent ({}) is not kept",
                secs(self.keep)
            ),
            _ => {
                format!("the recorder started {ago} before the end: nothing is recorded before it")
            }
        }
    }

    /// The note for a range no slice is kept for.
    fn nothing_kept(&self, from: SystemTime, to: SystemTime) -> String {
        let (Some(first), Some(last)) = (self.slices.front(), self.slices.back()) else {
            return match &self.paused {
                Some((_, why)) => format!("the recorder has not sampled yet: {why}"),
                None => "the recorder has not sampled yet".to_owned(),
            };
        };
        if to <= first.started {
            let after = secs(first.started.duration_since(to).unwrap_or_default());
            return match self.dropped {
                Dropped {
                    for_memory: Some(_),
                    ..
                } => format!(
                    "history that old was dropped to stay within recent_memory ({}); the \
                     oldest kept begins {after} after it",
                    crate::config::Bytes(self.budget)
                ),
                Dropped {
                    for_age: Some(_), ..
                } => format!(
                    "history older than recent ({}) is not kept",
                    secs(self.keep)
                ),
                _ => format!("the recorder started {after} after it"),
            };
        }
        if from >= last.end() {
            return match &self.paused {
                Some((_, why)) => format!("the recorder has not sampled since then: {why}"),
                None => "the recorder has not sampled in that time yet".to_owned(),
            };
        }
        "the recorder did not sample then".to_owned()
    }

    /// `slices` merged into one window's collection, `covered` long, from the first's
    /// start.
    fn merge(&self, slices: &[&Slice], covered: Duration) -> Collected {
        let mut counts: HashMap<u32, Tally> = HashMap::new();
        let mut report = Report::default();
        let (mut lost, mut blocked) = (Tally::default(), Vec::new());
        let (mut unattributed, mut cpu_time) = (Duration::ZERO, Duration::ZERO);
        let mut objects: Option<Arc<Objects>> = None;
        for slice in slices {
            for count in &slice.counts {
                let tally = counts.entry(count.id).or_default();
                tally.samples += u64::from(count.samples);
                tally.periods += u64::from(count.periods);
            }
            lost.samples += slice.lost.samples;
            lost.periods += slice.lost.periods;
            blocked = merge_blocked(&blocked, &slice.blocked);
            unattributed += slice.unattributed;
            cpu_time += slice.cpu_time;
            merge_report(&mut report, &slice.report);
            objects = Some(match objects {
                Some(older) if !Arc::ptr_eq(&older, &slice.objects) => {
                    Arc::new(slice.objects.merged_with(&older))
                }
                Some(same) => same,
                None => slice.objects.clone(),
            });
        }
        report.reader_why.clone_from(&self.reader_why);
        report.timer_shortfall.clone_from(&self.timer_shortfall);
        // Threads are kept by name: each name gets an id of its own here, which the
        // profile shows as that name (it has no thread ids).
        let mut ids: HashMap<Arc<str>, u32> = HashMap::new();
        let mut id_of = |name: &Arc<str>| {
            let next = ids.len() as u32 + 1;
            *ids.entry(name.clone()).or_insert(next)
        };
        let stacks = counts
            .into_iter()
            .filter_map(|(id, tally)| {
                let held = self.stacks.key(id)?;
                let key = StackKey {
                    tid: id_of(&held.thread),
                    ..held.key.clone()
                };
                Some((key, tally))
            })
            .collect();
        let blocked = blocked
            .iter()
            .map(|(name, unsampled)| (id_of(name), *unsampled))
            .collect();
        let names = ids.into_iter().map(|(name, id)| (id, name)).collect();
        let newest = slices.last().expect("at least one slice");
        Collected {
            stacks,
            names,
            lost,
            blocked,
            unattributed,
            started: slices[0].started,
            duration: covered,
            cpu_time,
            frequency: newest.frequency,
            objects: objects.map(|o| (*o).clone()).unwrap_or_default(),
            report,
        }
    }
}

/// Two per-thread lists of unsampled CPU, summed per thread name, sorted.
fn merge_blocked(
    a: &[(Arc<str>, Duration)],
    b: &[(Arc<str>, Duration)],
) -> Vec<(Arc<str>, Duration)> {
    let mut by_thread: Vec<(Arc<str>, Duration)> = a.iter().chain(b).cloned().collect();
    by_thread.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    by_thread.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
    by_thread
}

/// `newer`'s report added to `into`: counts summed; the handler's cost as the median of
/// the slices' medians weighted by their samples, and the highest p99; the rest as the
/// newer says.
fn merge_report(into: &mut Report, newer: &Report) {
    let (old, new) = (into.unwound as f64, newer.unwound as f64);
    if old + new > 0.0 {
        into.handler_nanos.0 = ((into.handler_nanos.0 as f64 * old
            + newer.handler_nanos.0 as f64 * new)
            / (old + new)) as u64;
        into.mean_depth = (into.mean_depth * old + newer.mean_depth * new) / (old + new);
    }
    into.handler_nanos.1 = into.handler_nanos.1.max(newer.handler_nanos.1);
    into.reader = newer.reader;
    into.reader_usual = newer.reader_usual;
    into.threads_timed = newer.threads_timed;
    into.foreign_signals += newer.foreign_signals;
    into.handler_replaced |= newer.handler_replaced;
    into.unwound += newer.unwound;
    into.direct += newer.direct;
    into.complete += newer.complete;
    into.unwinder_rebuilds += newer.unwinder_rebuilds;
}

/// Whether two lists name the same objects at the same places.
fn same_objects(a: &Objects, b: &Objects) -> bool {
    a.iter()
        .map(|o| (&o.range, &o.name))
        .eq(b.iter().map(|o| (&o.range, &o.name)))
}

/// What an object list weighs, in bytes.
fn objects_weight(objects: &Objects) -> usize {
    objects
        .iter()
        .map(|o| {
            size_of_val(o)
                + o.name.len()
                + o.file.as_ref().map_or(0, |f| f.as_os_str().len())
                + size_of_val(&o.segments[..])
                + o.build_id.as_ref().map_or(0, Vec::len)
                + 64
        })
        .sum()
}

/// A duration in a note: whole seconds from ten on, tenths below.
fn secs(d: Duration) -> String {
    if d >= Duration::from_secs(10) {
        format!("{:.0} s", d.as_secs_f64())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
#[path = "ring/tests.rs"]
mod tests;
