//! A window's pprof [`Profile`] as Pyroscope's push request
//! (`push.v1.PusherService/Push`): one series labelled `__name__="process_cpu"`,
//! `service_name` and the static labels, holding the profile as pprof bytes, split into
//! several profiles of the same window where it holds more samples than Pyroscope takes
//! in one ([`MAX_SAMPLES`]) or weighs more than it takes ([`MAX_BYTES`]). Pyroscope
//! names the profile types from the sample types: `process_cpu:cpu:nanoseconds:cpu:nanoseconds`
//! and `process_cpu:samples:count:cpu:nanoseconds`, as for its own agents.

use super::proto::{LabelPair, Message, PushRequest, RawProfileSeries, RawSample};
use crate::profile::proto as pprof;

/// The most samples one pushed profile carries: under Pyroscope's default
/// `max-profile-stacktrace-samples` (16,000).
pub(crate) const MAX_SAMPLES: usize = 15_000;
/// The most bytes one pushed profile weighs, uncompressed: under Pyroscope's default
/// `max-profile-size-bytes` (4 MiB).
pub(crate) const MAX_BYTES: usize = 3_500_000;

/// The push request of one window: its CPU profile, and its heap profile where one is
/// pushed (a series of its own, `__name__="memory"`, `__delta__="false"`: its
/// `alloc_*` are the window's already).
pub(crate) fn push_request(
    profile: &pprof::Profile,
    heap: Option<&pprof::Profile>,
    service_name: &str,
    labels: &[(String, String)],
    instance: u64,
) -> PushRequest {
    let mut series = vec![one_series(
        profile,
        "process_cpu",
        service_name,
        labels,
        instance,
    )];
    if let Some(heap) = heap {
        let mut series_labels = vec![("__delta__".to_owned(), "false".to_owned())];
        series_labels.extend(labels.iter().cloned());
        // Its ids apart from the CPU profile's of the same window, still UUIDs (Pyroscope
        // parses them).
        let memory_instance = instance ^ 0x6d65_6d6f_7279; // "memory"
        series.push(one_series(
            heap,
            "memory",
            service_name,
            &series_labels,
            memory_instance,
        ));
    }
    PushRequest { series }
}

/// One series: `profile` named `name`, labelled.
fn one_series(
    profile: &pprof::Profile,
    name: &str,
    service_name: &str,
    labels: &[(String, String)],
    instance: u64,
) -> RawProfileSeries {
    let mut pairs = vec![
        LabelPair {
            name: "__name__".to_owned(),
            value: name.to_owned(),
        },
        LabelPair {
            name: "service_name".to_owned(),
            value: service_name.to_owned(),
        },
    ];
    for (name, value) in labels {
        if pairs.iter().all(|pair| &pair.name != name) {
            pairs.push(LabelPair {
                name: name.clone(),
                value: value.clone(),
            });
        }
    }
    let parts = split(profile);
    let samples = parts
        .iter()
        .enumerate()
        .map(|(part, bytes)| RawSample {
            raw_profile: bytes.clone(),
            id: sample_id(instance, profile.time_nanos, part),
        })
        .collect();
    RawProfileSeries {
        labels: pairs,
        samples,
    }
}

/// `profile` encoded, in as many parts (each with every table, a share of the samples,
/// the same time range) as keep each within [`MAX_SAMPLES`] and [`MAX_BYTES`].
fn split(profile: &pprof::Profile) -> Vec<Vec<u8>> {
    let whole = profile.encode_to_vec();
    if profile.sample.len() <= MAX_SAMPLES && whole.len() <= MAX_BYTES {
        return vec![whole];
    }
    let parts = (profile.sample.len().div_ceil(MAX_SAMPLES))
        .max(whole.len().div_ceil(MAX_BYTES))
        .max(2);
    let per_part = profile.sample.len().div_ceil(parts).max(1);
    profile
        .sample
        .chunks(per_part)
        .map(|samples| {
            pprof::Profile {
                sample: samples.to_vec(),
                ..profile.clone()
            }
            .encode_to_vec()
        })
        .collect()
}

/// The id of one part of a window's profile, as a UUID's text: the same for the same
/// instance, window and part whenever it is sent again.
fn sample_id(instance: u64, time_nanos: i64, part: usize) -> String {
    let low = (time_nanos as u64) ^ (part as u64).rotate_right(16);
    let hex = format!("{instance:016x}{low:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(samples: usize) -> pprof::Profile {
        pprof::Profile {
            sample_type: vec![pprof::ValueType { ty: 1, unit: 2 }],
            sample: (0..samples)
                .map(|at| pprof::Sample {
                    location_id: vec![at as u64 + 1],
                    value: vec![1],
                    label: Vec::new(),
                })
                .collect(),
            string_table: vec![String::new(), "samples".into(), "count".into()],
            time_nanos: 1_800_000_000_000_000_000,
            ..pprof::Profile::default()
        }
    }

    #[test]
    fn one_series_names_the_profile_the_service_and_the_labels() {
        let labels = [
            ("env".to_owned(), "prod".to_owned()),
            ("service_name".to_owned(), "not this one".to_owned()),
        ];
        let request = push_request(&profile(3), None, "checkout", &labels, 9);
        assert_eq!(request.series.len(), 1);
        let names: Vec<(&str, &str)> = request.series[0]
            .labels
            .iter()
            .map(|pair| (pair.name.as_str(), pair.value.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("__name__", "process_cpu"),
                ("service_name", "checkout"),
                ("env", "prod")
            ]
        );
        let samples = &request.series[0].samples;
        assert_eq!(samples.len(), 1);
        assert_eq!(
            pprof::Profile::decode(&*samples[0].raw_profile).unwrap(),
            profile(3)
        );
        assert_eq!(samples[0].id, "00000000-0000-0009-18fa-e27693b40000");
    }

    /// A heap profile is a series of its own, named `memory`, saying it holds no
    /// cumulative counts, its ids apart from the CPU profile's.
    #[test]
    fn a_heap_profile_is_a_memory_series_of_its_own() {
        let labels = [("env".to_owned(), "prod".to_owned())];
        let request = push_request(&profile(3), Some(&profile(2)), "checkout", &labels, 9);
        assert_eq!(request.series.len(), 2);
        let names = |series: &RawProfileSeries| -> Vec<(String, String)> {
            series
                .labels
                .iter()
                .map(|pair| (pair.name.clone(), pair.value.clone()))
                .collect()
        };
        assert_eq!(
            names(&request.series[1]),
            [
                ("__name__".to_owned(), "memory".to_owned()),
                ("service_name".to_owned(), "checkout".to_owned()),
                ("__delta__".to_owned(), "false".to_owned()),
                ("env".to_owned(), "prod".to_owned()),
            ]
        );
        let (cpu, memory) = (
            &request.series[0].samples[0].id,
            &request.series[1].samples[0].id,
        );
        assert_ne!(cpu, memory);
        for id in [cpu, memory] {
            let hex: String = id.chars().filter(|&c| c != '-').collect();
            assert!(
                id.len() == 36 && hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()),
                "{id} is a UUID"
            );
        }
        assert_eq!(
            pprof::Profile::decode(&*request.series[1].samples[0].raw_profile).unwrap(),
            profile(2)
        );
    }

    /// More samples than Pyroscope takes in one profile: parts of the same window, each
    /// within the bound, every sample in exactly one, ids apart.
    #[test]
    fn a_window_over_the_sample_bound_is_split() {
        let big = profile(MAX_SAMPLES * 2 + 1);
        let request = push_request(&big, None, "checkout", &[], 9);
        let parts: Vec<pprof::Profile> = request.series[0]
            .samples
            .iter()
            .map(|sample| pprof::Profile::decode(&*sample.raw_profile).unwrap())
            .collect();
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|part| part.sample.len() <= MAX_SAMPLES));
        assert!(parts.iter().all(|part| part.time_nanos == big.time_nanos));
        let joined: Vec<pprof::Sample> = parts.into_iter().flat_map(|part| part.sample).collect();
        assert_eq!(joined, big.sample);
        let ids: std::collections::HashSet<&str> = request.series[0]
            .samples
            .iter()
            .map(|sample| sample.id.as_str())
            .collect();
        assert_eq!(ids.len(), 3);
    }
}
