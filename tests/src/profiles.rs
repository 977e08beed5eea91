//! Reading profiles: gunzip and decode with `pprof::protos`, stacks by function name,
//! totals, the split check, comments and the sampled window.

use std::io::Read as _;
use std::time::{Duration, SystemTime};

use pprof::protos::Message as _;

use crate::Profile;

/// Gunzips and decodes a profile body, failing with a clear message if it is not one.
pub fn decode(body: &[u8]) -> Profile {
    assert!(
        body.starts_with(&[0x1f, 0x8b]),
        "the body is not gzip: {:?}",
        String::from_utf8_lossy(&body[..body.len().min(200)])
    );
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut raw)
        .expect("the gzip stream is complete");
    Profile::decode(raw.as_slice()).expect("the body is a pprof Profile")
}

pub fn string(profile: &Profile, index: i64) -> &str {
    &profile.string_table[usize::try_from(index).expect("a string index")]
}

/// Reads a whole document with an XML parser, failing the test on any error.
pub fn assert_valid_xml(document: &str) {
    let mut reader = quick_xml::Reader::from_str(document);
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(err) => panic!("invalid XML at byte {}: {err}", reader.buffer_position()),
        }
    }
}

/// `(type, unit)` of each sample value.
pub fn sample_types(profile: &Profile) -> Vec<(String, String)> {
    profile
        .sample_type
        .iter()
        .map(|t| {
            (
                string(profile, t.ty).to_owned(),
                string(profile, t.unit).to_owned(),
            )
        })
        .collect()
}

/// Function names of every sample's stack, leaf first, with the sample's values.
pub fn stacks(profile: &Profile) -> Vec<(Vec<String>, Vec<i64>)> {
    profile
        .sample
        .iter()
        .map(|sample| {
            let names = sample
                .location_id
                .iter()
                .flat_map(|id| {
                    let location = profile
                        .location
                        .iter()
                        .find(|l| l.id == *id)
                        .expect("every sample location exists");
                    location.line.iter().map(|line| {
                        let function = profile
                            .function
                            .iter()
                            .find(|f| f.id == line.function_id)
                            .expect("every line's function exists");
                        string(profile, function.name).to_owned()
                    })
                })
                .collect();
            (names, sample.value.clone())
        })
        .collect()
}

/// The column of the sample type named `name`, failing the test if there is none.
pub fn column(profile: &Profile, name: &str) -> usize {
    sample_types(profile)
        .iter()
        .position(|(ty, _)| ty == name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", sample_types(profile)))
}

/// The profile's `default_sample_type`, or `""`.
pub fn default_sample_type(profile: &Profile) -> &str {
    string(profile, profile.default_sample_type)
}

/// Each sample's location addresses, leaf first, with its values: how Alloy's client-side
/// delta (fastdelta) tells one stack from another.
pub fn stacks_by_address(profile: &Profile) -> Vec<(Vec<u64>, Vec<i64>)> {
    profile
        .sample
        .iter()
        .map(|sample| {
            let addresses = sample
                .location_id
                .iter()
                .map(|id| {
                    profile
                        .location
                        .iter()
                        .find(|l| l.id == *id)
                        .expect("every sample location exists")
                        .address
                })
                .collect();
            (addresses, sample.value.clone())
        })
        .collect()
}

/// The sum of one value column over all samples.
pub fn total(profile: &Profile, column: usize) -> i64 {
    profile.sample.iter().map(|s| s.value[column]).sum()
}

/// The sum of `column` over samples whose stack contains a function matching `name`.
pub fn total_in(profile: &Profile, column: usize, name: &str) -> i64 {
    stacks(profile)
        .iter()
        .filter(|(stack, _)| stack.iter().any(|f| f.contains(name)))
        .map(|(_, values)| values[column])
        .sum()
}

/// Checks that a profile splits the samples of three functions as their own CPU clocks
/// did (`measured`, nanoseconds): each share within `points`. `nominal` is what the
/// workload was built to give, within `workload_tolerance` points, so that a workload
/// gone lopsided fails as such. Returns the samples of each function; or, where a machine
/// busy with other work folded the periods into too few signals to judge a split to
/// `points` (under 2000, while `cpu/nanoseconds` holds at least 2000 periods of the
/// workload's CPU), why it cannot be judged, for the test to [`skip`](crate::skip).
pub fn assert_split(
    profile: &Profile,
    functions: [&str; 3],
    measured: [f64; 3],
    nominal: [f64; 3],
    workload_tolerance: f64,
    points: f64,
) -> Result<[i64; 3], String> {
    let parts = functions.map(|f| total_in(profile, 0, f));
    let sum: i64 = parts.iter().sum();
    let periods: i64 = functions
        .map(|f| total_in(profile, 1, f))
        .iter()
        .sum::<i64>()
        / profile.period.max(1);
    if sum <= 2000 && periods > 2000 {
        return Err(format!(
            "{sum} samples stand for {periods} periods of the workload's CPU: a busy \
             machine folded them into too few signals to judge a split to {points} points"
        ));
    }
    assert!(
        sum > 2000,
        "{sum} samples in the workload ({periods} periods of CPU): too few to judge a split"
    );
    eprintln!("split of {functions:?}: {parts:?} of {sum} samples; measured CPU {measured:?} ns");
    let measured_sum: f64 = measured.iter().sum();
    for ((part, truth), nominal) in parts.iter().zip(measured).zip(nominal) {
        let share = *part as f64 * 100.0 / sum as f64;
        let expected = truth * 100.0 / measured_sum;
        assert!(
            (expected - nominal).abs() <= workload_tolerance,
            "the workload itself is off: {expected:.1}% where about {nominal}% was meant"
        );
        assert!(
            (share - expected).abs() <= points,
            "the profile says {share:.1}%, the CPU clock {expected:.1}% ({parts:?} of {sum} samples)"
        );
    }
    Ok(parts)
}

/// The profile's comments, as `go tool pprof -comments` prints them.
pub fn comments(profile: &Profile) -> Vec<&str> {
    profile
        .comment
        .iter()
        .map(|index| string(profile, *index))
        .collect()
}

/// The samples (the `samples/count` column) of the threads named `name`, by the samples'
/// `thread` label.
pub fn thread_samples(profile: &Profile, name: &str) -> i64 {
    thread_total(profile, 0, name)
}

/// The sum of `column` over the samples of the threads named `name`, by the samples'
/// `thread` label.
pub fn thread_total(profile: &Profile, column: usize, name: &str) -> i64 {
    profile
        .sample
        .iter()
        .filter(|sample| {
            sample.label.iter().any(|label| {
                string(profile, label.key) == "thread" && string(profile, label.str) == name
            })
        })
        .map(|sample| sample.value[column])
        .sum()
}

/// Whether one of the profile's comments contains `text`.
pub fn says(profile: &Profile, text: &str) -> bool {
    comments(profile).iter().any(|c| c.contains(text))
}

/// The wall-clock window a profile says it sampled.
pub fn profile_window(profile: &Profile) -> (SystemTime, SystemTime) {
    let start = SystemTime::UNIX_EPOCH + Duration::from_nanos(profile.time_nanos as u64);
    (
        start,
        start + Duration::from_nanos(profile.duration_nanos as u64),
    )
}

/// Checks a profile's window against the client's wall clock around its request: it
/// cannot start before the request was sent (a window that joined a running session and
/// carried the session's start would) nor end after its answer arrived. Returns the
/// window. `what` names the request in the messages.
pub fn assert_window_inside(
    profile: &Profile,
    sent: SystemTime,
    received: SystemTime,
    what: &str,
) -> (SystemTime, SystemTime) {
    let (start, end) = profile_window(profile);
    assert!(
        start >= sent,
        "{what}: the profile says its window started {:?} before the client sent the request",
        sent.duration_since(start).unwrap_or_default()
    );
    assert!(
        end <= received,
        "{what}: the profile says its window ended {:?} after the client had its answer",
        end.duration_since(received).unwrap_or_default()
    );
    (start, end)
}
