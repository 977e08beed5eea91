//! A heap profile from its parts: the dump's in-use stacks and, where they exist, the
//! allocated counts of each stack (this crate's table, or `prof_accum`'s brackets),
//! matched by their exact addresses (both come from jemalloc's one copy of each stack);
//! Go's four sample types in Go's order where the counts exist, only the two in-use ones
//! where they do not, never zeros in their place; comments that say which, since when,
//! and what was left out. Stacks start at the allocation site (`dump.rs`'s
//! `allocator_lines`), unless `symbolize=none` keeps every address.

use std::time::{Duration, Instant, SystemTime};

use super::dump::{Parsed, allocator_lines};
use super::request::HeapRoute;
use crate::profile::{Frame, FrameMap, Meta, Profile, ProfileBuilder};
use crate::symbolize::Symbolize;

const FOUR: &[(&str, &str)] = &[
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];
const INUSE: &[(&str, &str)] = &[("inuse_objects", "count"), ("inuse_space", "bytes")];

/// The stack that stands for the samples whose stacks the table had no room for.
pub(super) const FULL_MARKER: &str = "[alloc_stacks full]";

/// What the `alloc_*` columns hold.
pub(super) enum Alloc {
    /// Nothing: the profile has only `inuse_*` (its comments say why).
    None,
    /// Per stack (its addresses), unbiased objects and bytes; and what was counted
    /// without a stack (samples, objects, bytes), shown under [`FULL_MARKER`].
    Counted {
        stacks: Vec<(Vec<u64>, f64, f64)>,
        overflow: (u64, f64, f64),
        /// Whether a stack in use with no count of its own deserves a comment: in a
        /// profile since the counts began, it was sampled before them (or overflowed);
        /// in a window, it simply allocated nothing then.
        cumulative: bool,
    },
}

/// How the profile's time is stated.
pub(super) enum Span {
    /// The heap as it is now: `time_nanos` now, no duration.
    Now,
    /// A window from `started` (and its wall-clock time) to now.
    Window(Instant, SystemTime),
    /// A window from a wall-clock time, this long: the pusher's, from one reading of the
    /// counts to the next, so that its windows meet.
    #[cfg_attr(not(feature = "push"), allow(dead_code))]
    Between(SystemTime, Duration),
}

/// Builds the profile.
pub(super) fn build(
    dump: &Parsed,
    alloc: Alloc,
    route: HeapRoute,
    span: Span,
    symbolize: Symbolize,
    sample_index: Option<&'static str>,
    mut comments: Vec<String>,
) -> Profile {
    let objects = crate::objects::Objects::current();
    let mut builder = ProfileBuilder::new(&objects).symbolize(symbolize);
    let frames = |addresses: &[u64]| -> Vec<Frame> {
        // Every address is a return address: minus one lands inside the call.
        addresses
            .iter()
            .map(|a| Frame::Code(a.saturating_sub(1)))
            .collect()
    };
    let counted = !matches!(alloc, Alloc::None);
    match alloc {
        Alloc::None => {
            for stack in &dump.stacks {
                let values = [stack.objects, stack.bytes].map(|v| v.round() as i64);
                if values.iter().any(|v| *v != 0) {
                    builder.add(frames(&stack.addresses), values.to_vec(), Vec::new());
                }
            }
        }
        Alloc::Counted {
            stacks,
            overflow,
            cumulative,
        } => {
            let mut allocated: FrameMap<Vec<u64>, (f64, f64)> = FrameMap::default();
            let mut order = Vec::with_capacity(stacks.len());
            for (addresses, objects, bytes) in stacks {
                let entry = allocated.entry(addresses.clone()).or_default();
                if *entry == (0.0, 0.0) {
                    order.push(addresses);
                }
                *entry = (entry.0 + objects, entry.1 + bytes);
            }
            let mut without = 0usize;
            for stack in &dump.stacks {
                let (objects, bytes) = allocated.remove(&stack.addresses).unwrap_or_else(|| {
                    without += usize::from(stack.bytes > 0.0);
                    (0.0, 0.0)
                });
                let values = [objects, bytes, stack.objects, stack.bytes].map(|v| v.round() as i64);
                if values.iter().any(|v| *v != 0) {
                    builder.add(frames(&stack.addresses), values.to_vec(), Vec::new());
                }
            }
            // Stacks that allocated and hold nothing now, in the order they were counted.
            for addresses in order {
                if let Some((objects, bytes)) = allocated.remove(&addresses) {
                    let values = [objects.round() as i64, bytes.round() as i64, 0, 0];
                    if values.iter().any(|v| *v != 0) {
                        builder.add(frames(&addresses), values.to_vec(), Vec::new());
                    }
                }
            }
            let (samples, objects, bytes) = overflow;
            if samples > 0 {
                builder.add(
                    vec![Frame::Marker(FULL_MARKER.to_owned())],
                    vec![objects.round() as i64, bytes.round() as i64, 0, 0],
                    Vec::new(),
                );
            }
            if cumulative && without > 0 {
                comments.push(format!(
                    "{without} stacks in use have no allocation counts of their own: they were \
                     sampled before the counts began, or counted under {FULL_MARKER}"
                ));
            }
        }
    }
    let default_sample_type = sample_index.unwrap_or(match (route, counted) {
        (HeapRoute::Allocs, true) => "alloc_space",
        _ => "inuse_space",
    });
    let (time, duration) = match span {
        Span::Now => (SystemTime::now(), Duration::ZERO),
        Span::Window(started, at) => (at, started.elapsed()),
        Span::Between(at, length) => (at, length),
    };
    builder.finish_trimmed(
        &Meta {
            sample_types: if counted { FOUR } else { INUSE },
            period_type: ("space", "bytes"),
            period: dump.period as i64,
            time,
            duration,
            default_sample_type: Some(default_sample_type),
            comments,
        },
        &|lines| match symbolize {
            Symbolize::Full => allocator_lines(lines),
            Symbolize::None => 0,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::dump::HeapStack;
    use super::*;

    fn in_use(address: u64, objects: f64, bytes: f64) -> HeapStack {
        HeapStack {
            addresses: vec![address, 0x9000],
            objects,
            bytes,
            alloc_objects: 0.0,
            alloc_bytes: 0.0,
        }
    }

    fn build_of(dump: &Parsed, alloc: Alloc, route: HeapRoute) -> Profile {
        build(
            dump,
            alloc,
            route,
            Span::Now,
            Symbolize::None,
            None,
            Vec::new(),
        )
    }

    fn text(profile: &Profile, index: i64) -> &str {
        &profile.string_table[index as usize]
    }

    /// Each sample's values, sorted.
    fn values(profile: &Profile) -> Vec<Vec<i64>> {
        let mut values: Vec<Vec<i64>> = profile.sample.iter().map(|s| s.value.clone()).collect();
        values.sort();
        values
    }

    fn types(profile: &Profile) -> Vec<&str> {
        profile
            .sample_type
            .iter()
            .map(|t| text(profile, t.ty))
            .collect()
    }

    #[test]
    fn without_counts_a_profile_has_the_two_in_use_types_and_no_empty_stack() {
        let dump = Parsed {
            period: 524_288,
            stacks: vec![in_use(0x1000, 2.4, 100.0), in_use(0x2000, 0.0, 0.0)],
        };
        let profile = build_of(&dump, Alloc::None, HeapRoute::Allocs);
        assert_eq!(types(&profile), ["inuse_objects", "inuse_space"]);
        assert_eq!(values(&profile), [vec![2, 100]]);
        assert_eq!(text(&profile, profile.default_sample_type), "inuse_space");
        assert_eq!(profile.period, 524_288);
    }

    #[test]
    fn counts_are_matched_to_stacks_in_use_by_address_and_the_rest_follow() {
        let dump = Parsed {
            period: 524_288,
            stacks: vec![
                in_use(0x1000, 2.0, 100.0),
                in_use(0x2000, 1.0, 50.0),
                in_use(0x4000, 0.0, 0.0),
                in_use(0x6000, 1.0, 20.0),
            ],
        };
        let full = (2, 4.0, 400.0);
        let counted = |cumulative, overflow| Alloc::Counted {
            stacks: vec![
                (vec![0x1000, 0x9000], 5.0, 500.0),
                (vec![0x3000, 0x9000], 3.0, 300.0),
                (vec![0x1000, 0x9000], 1.0, 100.0),
                (vec![0x5000, 0x9000], 0.0, 0.0),
            ],
            overflow,
            cumulative,
        };
        let profile = build_of(&dump, counted(true, full), HeapRoute::Allocs);
        assert_eq!(
            types(&profile),
            [
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space"
            ]
        );
        // In use with counts (two entries, summed); in use without (two); counted and
        // freed; the table's overflow under its marker. Nothing for a stack of zeros.
        assert_eq!(
            values(&profile),
            [
                vec![0, 0, 1, 20],
                vec![0, 0, 1, 50],
                vec![3, 300, 0, 0],
                vec![4, 400, 0, 0],
                vec![6, 600, 2, 100],
            ]
        );
        assert_eq!(text(&profile, profile.default_sample_type), "alloc_space");
        let comments: Vec<&str> = profile.comment.iter().map(|&i| text(&profile, i)).collect();
        assert!(
            comments
                .iter()
                .any(|c| c.starts_with("2 stacks in use have no allocation counts")),
            "{comments:?}"
        );
        // In a window, a stack in use that allocated nothing in it is no news; on /heap
        // the in-use space is the default.
        let window = build_of(&dump, counted(false, full), HeapRoute::Heap);
        assert!(
            window
                .comment
                .iter()
                .all(|&i| !text(&window, i).contains("no allocation counts"))
        );
        assert_eq!(text(&window, window.default_sample_type), "inuse_space");
        // No overflow, no marker.
        let without = build_of(&dump, counted(true, (0, 0.0, 0.0)), HeapRoute::Allocs);
        assert_eq!(without.sample.len(), 4);
        // Every stack that holds bytes has counts of its own: nothing to say about them.
        let all_counted = Parsed {
            period: 524_288,
            stacks: vec![in_use(0x1000, 2.0, 100.0), in_use(0x4000, 0.0, 0.0)],
        };
        let profile = build_of(
            &all_counted,
            counted(true, (0, 0.0, 0.0)),
            HeapRoute::Allocs,
        );
        assert!(
            profile
                .comment
                .iter()
                .all(|&i| !text(&profile, i).contains("no allocation counts")),
            "{:?}",
            profile.comment
        );
    }
}
