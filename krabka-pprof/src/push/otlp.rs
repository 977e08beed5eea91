//! A window's pprof [`Profile`] as an OTLP profiles export (`profiles/v1development`,
//! proto v1.10): one request, one dictionary, one `Profile` per pprof sample type
//! (`samples/count` and `cpu/nanoseconds`, both with period type `cpu/nanoseconds`), as
//! the OpenTelemetry specification's pprof mapping has it.
//!
//! Every table starts with its zero value and holds no duplicate and no entry nothing
//! points at (profcheck's rules, `-check-dupes -check-orphans`). Labels become sample
//! attributes (`thread` as the semantic conventions' `thread.name`), except `span_id` and
//! `trace_id`, which become the sample's `Link` (16 and 8 bytes) where both are there.
//! Resource attributes are written inline (`key`, `string_value`): Pyroscope's OTLP
//! ingest reads `service.name` only so.

use std::collections::HashMap;

use super::proto::{
    AnyValue, ArrayValue, ExportProfilesServiceRequest, Function, InstrumentationScope, KeyValue,
    KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary, Resource,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType, any_value,
};
use crate::profile::proto as pprof;

/// Interns strings into the dictionary's table, the empty string first.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i32>,
}

impl Strings {
    fn new() -> Strings {
        let mut strings = Strings::default();
        strings.of("");
        strings
    }

    fn of(&mut self, text: &str) -> i32 {
        if let Some(&at) = self.index.get(text) {
            return at;
        }
        let at = i32::try_from(self.table.len()).unwrap_or(i32::MAX);
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), at);
        at
    }
}

/// Interns equal entries of one table once, its zero value first.
struct Table<T> {
    entries: Vec<T>,
    index: HashMap<T, i32>,
}

impl<T: Clone + Eq + std::hash::Hash + Default> Table<T> {
    fn new() -> Table<T> {
        let mut table = Table {
            entries: Vec::new(),
            index: HashMap::new(),
        };
        table.of(T::default());
        table
    }

    fn of(&mut self, entry: T) -> i32 {
        if let Some(&at) = self.index.get(&entry) {
            return at;
        }
        let at = i32::try_from(self.entries.len()).unwrap_or(i32::MAX);
        self.entries.push(entry.clone());
        self.index.insert(entry, at);
        at
    }
}

/// What describes the process the profiles come from: the OTLP resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    /// Resource attributes in order, `service.name` among them.
    pub(crate) resource: Vec<(String, String)>,
    /// The instance's id, from which each profile's id is made.
    pub(crate) instance: u64,
}

/// The OTLP export of one window's profiles (its CPU profile, and its heap profile where
/// one is pushed): one request, one dictionary they share, one `Profile` per pprof
/// sample type.
pub(crate) fn export(window: &[&pprof::Profile], origin: &Origin) -> ExportProfilesServiceRequest {
    let mut dictionary = Dictionary::new();
    let profiles: Vec<Profile> = window
        .iter()
        .enumerate()
        .flat_map(|(at, profile)| dictionary.profiles(profile, origin.instance, at as u64))
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: origin
                    .resource
                    .iter()
                    .map(|(key, value)| KeyValue {
                        key: key.clone(),
                        value: Some(string_value(value)),
                        key_strindex: 0,
                    })
                    .collect(),
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "krabka-pprof".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dictionary.finish()),
    }
}

/// An attribute's value: a string, or the list of a profile's comments.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
enum Value {
    #[default]
    Zero,
    Text(String),
    Texts(Vec<String>),
}

/// A location: mapping, address, lines (function, line, column), attributes.
type LocationEntry = (i32, u64, Vec<(i32, i64, i64)>, Vec<i32>);

/// The request's tables, each entry once.
struct Dictionary {
    strings: Strings,
    attributes: Table<(i32, Value)>,
    links: Table<(Vec<u8>, Vec<u8>)>,
    stacks: Table<Vec<i32>>,
    /// name, system name, file name, first line (string indices).
    functions: Table<(i32, i32, i32, i64)>,
    /// start, limit, offset, file name, attributes.
    mappings: Table<(u64, u64, u64, i32, Vec<i32>)>,
    locations: Table<LocationEntry>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut links = Table::new();
        // The zero link is 16 and 8 zero bytes, as the specification prefers.
        links.entries[0] = (vec![0; 16], vec![0; 8]);
        links.index.clear();
        links.index.insert(links.entries[0].clone(), 0);
        Dictionary {
            strings: Strings::new(),
            attributes: Table::new(),
            links,
            stacks: Table::new(),
            functions: Table::new(),
            mappings: Table::new(),
            locations: Table::new(),
        }
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key = self.strings.of(key);
        self.attributes.of((key, value))
    }

    /// `profile`'s Profiles, one per sample type, its entries added to the tables;
    /// `which` tells its ids from the other profiles' of the window.
    fn profiles(&mut self, profile: &pprof::Profile, instance: u64, which: u64) -> Vec<Profile> {
        let text = |index: i64| -> &str {
            usize::try_from(index)
                .ok()
                .and_then(|at| profile.string_table.get(at))
                .map_or("", String::as_str)
        };
        let mut function_at = HashMap::new();
        for function in &profile.function {
            let entry = (
                self.strings.of(text(function.name)),
                self.strings.of(text(function.system_name)),
                self.strings.of(text(function.filename)),
                function.start_line,
            );
            function_at.insert(function.id, self.functions.of(entry));
        }
        let mut mapping_at = HashMap::new();
        for mapping in &profile.mapping {
            let build_id = text(mapping.build_id);
            let indices = if build_id.is_empty() {
                Vec::new()
            } else {
                vec![self.attribute(
                    "process.executable.build_id.gnu",
                    Value::Text(build_id.to_owned()),
                )]
            };
            let entry = (
                mapping.memory_start,
                mapping.memory_limit,
                mapping.file_offset,
                self.strings.of(text(mapping.filename)),
                indices,
            );
            mapping_at.insert(mapping.id, self.mappings.of(entry));
        }
        let frame_type = self.attribute("profile.frame.type", Value::Text("rust".to_owned()));
        let mut location_at = HashMap::new();
        for location in &profile.location {
            let entry = (
                mapping_at.get(&location.mapping_id).copied().unwrap_or(0),
                location.address,
                location
                    .line
                    .iter()
                    .map(|line| {
                        (
                            function_at.get(&line.function_id).copied().unwrap_or(0),
                            line.line,
                            line.column,
                        )
                    })
                    .collect(),
                vec![frame_type],
            );
            location_at.insert(location.id, self.locations.of(entry));
        }

        // Samples by identity (stack, attribute set, link), merged.
        let mut samples: Vec<(i32, Vec<i32>, i32, Vec<i64>)> = Vec::new();
        let mut sample_at: HashMap<(i32, Vec<i32>, i32), usize> = HashMap::new();
        for sample in &profile.sample {
            let stack = self.stacks.of(sample
                .location_id
                .iter()
                .map(|id| location_at.get(id).copied().unwrap_or(0))
                .collect());
            let (mut span_id, mut trace_id) = (None, None);
            let mut indices = Vec::new();
            for label in &sample.label {
                let (key, value) = (text(label.key), text(label.str));
                match key {
                    "span_id" => span_id = Some(value),
                    "trace_id" => trace_id = Some(value),
                    "thread" => {
                        indices.push(self.attribute("thread.name", Value::Text(value.to_owned())))
                    }
                    other => indices.push(self.attribute(other, Value::Text(value.to_owned()))),
                }
            }
            let link = match (
                trace_id.and_then(hex_bytes::<16>),
                span_id.and_then(hex_bytes::<8>),
            ) {
                (Some(trace), Some(span)) => self.links.of((trace.to_vec(), span.to_vec())),
                _ => {
                    // Without both there is no link to make: the ids stay sample
                    // attributes, as their labels were.
                    for (key, id) in [("span_id", span_id), ("trace_id", trace_id)] {
                        if let Some(id) = id {
                            indices.push(self.attribute(key, Value::Text(id.to_owned())));
                        }
                    }
                    0
                }
            };
            // A key once in a list (a user label named `thread.name` beside the
            // thread's): the first given stays.
            let mut keys = Vec::with_capacity(indices.len());
            indices.retain(|&at| {
                let key = self.attributes.entries[at as usize].0;
                let new = !keys.contains(&key);
                keys.push(key);
                new
            });
            indices.sort_unstable();
            let identity = (stack, indices, link);
            match sample_at.get(&identity) {
                Some(&at) => {
                    for (sum, value) in samples[at].3.iter_mut().zip(&sample.value) {
                        *sum += value;
                    }
                }
                None => {
                    sample_at.insert(identity.clone(), samples.len());
                    samples.push((identity.0, identity.1, identity.2, sample.value.clone()));
                }
            }
        }

        let comments: Vec<String> = profile
            .comment
            .iter()
            .map(|&at| text(at).to_owned())
            .collect();
        // One attribute with every comment: a key may appear once in a list.
        let profile_attributes = if comments.is_empty() {
            Vec::new()
        } else {
            vec![self.attribute("pprof.profile.comment", Value::Texts(comments))]
        };
        let period_type = profile.period_type.map(|ty| ValueType {
            type_strindex: self.strings.of(text(ty.ty)),
            unit_strindex: self.strings.of(text(ty.unit)),
        });
        let time_unix_nano = u64::try_from(profile.time_nanos).unwrap_or(0);
        let mut profiles = Vec::new();
        for (at, ty) in profile.sample_type.iter().enumerate() {
            let sample_type = ValueType {
                type_strindex: self.strings.of(text(ty.ty)),
                unit_strindex: self.strings.of(text(ty.unit)),
            };
            profiles.push(Profile {
                sample_type: Some(sample_type),
                samples: samples
                    .iter()
                    .filter(|sample| sample.3.get(at).is_some_and(|&value| value != 0))
                    .map(|(stack, indices, link, values)| Sample {
                        stack_index: *stack,
                        attribute_indices: indices.clone(),
                        link_index: *link,
                        values: vec![values[at]],
                        timestamps_unix_nano: Vec::new(),
                    })
                    .collect(),
                time_unix_nano,
                duration_nano: u64::try_from(profile.duration_nanos).unwrap_or(0),
                period_type,
                period: profile.period,
                profile_id: profile_id(instance, time_unix_nano, (which << 8) | at as u64),
                attribute_indices: profile_attributes.clone(),
                ..Profile::default()
            });
        }
        profiles
    }

    fn finish(self) -> ProfilesDictionary {
        let strings = self.strings;
        ProfilesDictionary {
            mapping_table: self
                .mappings
                .entries
                .into_iter()
                .map(
                    |(
                        memory_start,
                        memory_limit,
                        file_offset,
                        filename_strindex,
                        attribute_indices,
                    )| {
                        Mapping {
                            memory_start,
                            memory_limit,
                            file_offset,
                            filename_strindex,
                            attribute_indices,
                        }
                    },
                )
                .collect(),
            location_table: self
                .locations
                .entries
                .into_iter()
                .map(
                    |(mapping_index, address, lines, attribute_indices)| Location {
                        mapping_index,
                        address,
                        lines: lines
                            .into_iter()
                            .map(|(function_index, line, column)| Line {
                                function_index,
                                line,
                                column,
                            })
                            .collect(),
                        attribute_indices,
                    },
                )
                .collect(),
            function_table: self
                .functions
                .entries
                .into_iter()
                .map(
                    |(name_strindex, system_name_strindex, filename_strindex, start_line)| {
                        Function {
                            name_strindex,
                            system_name_strindex,
                            filename_strindex,
                            start_line,
                        }
                    },
                )
                .collect(),
            link_table: self
                .links
                .entries
                .into_iter()
                .map(|(trace_id, span_id)| Link { trace_id, span_id })
                .collect(),
            attribute_table: self
                .attributes
                .entries
                .into_iter()
                .map(|(key_strindex, value)| KeyValueAndUnit {
                    key_strindex,
                    value: match value {
                        Value::Zero => None,
                        Value::Text(text) => Some(string_value(&text)),
                        Value::Texts(texts) => Some(AnyValue {
                            value: Some(any_value::Value::ArrayValue(ArrayValue {
                                values: texts.iter().map(|text| string_value(text)).collect(),
                            })),
                        }),
                    },
                    unit_strindex: 0,
                })
                .collect(),
            string_table: strings.table,
            stack_table: self
                .stacks
                .entries
                .into_iter()
                .map(|location_indices| Stack { location_indices })
                .collect(),
        }
    }
}

fn string_value(text: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(text.to_owned())),
    }
}

/// `N` bytes from `2 N` hex digits, if that is what `text` is and they are not all zero.
fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut bytes = [0; N];
    for (at, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * at..2 * at + 2)?, 16).ok()?;
    }
    (bytes != [0; N]).then_some(bytes)
}

/// A profile's id: 16 bytes from the instance, the window's start and the sample type, so
/// that a window sent again carries the id it had (a receiver that removes duplicates
/// can), and two instances' never meet.
pub(crate) fn profile_id(instance: u64, time_unix_nano: u64, which: u64) -> Vec<u8> {
    let mut id = Vec::with_capacity(16);
    id.extend_from_slice(&instance.to_be_bytes());
    id.extend_from_slice(&(time_unix_nano ^ which.rotate_right(8)).to_be_bytes());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small CPU profile as the recorder's report builds them: two sample types, a
    /// stack of two frames, labels with a span and a trace, comments.
    fn cpu_profile() -> pprof::Profile {
        let strings = [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "main",
            "work",
            "src/main.rs",
            "/bin/app",
            "abcdef",
            "thread",
            "worker-1",
            "span_id",
            "00000000000000ff",
            "trace_id",
            "0000000000000000000000000000abcd",
            "tenant",
            "acme",
            "sampled at 99 Hz",
        ];
        let label = |key: i64, str: i64| pprof::Label {
            key,
            str,
            ..pprof::Label::default()
        };
        let location = |id: u64, function_id: u64| pprof::Location {
            id,
            mapping_id: 1,
            address: 0x1000 + id,
            line: vec![pprof::Line {
                function_id,
                line: 10 * id as i64,
                column: 0,
            }],
            ..pprof::Location::default()
        };
        pprof::Profile {
            sample_type: vec![
                pprof::ValueType { ty: 1, unit: 2 },
                pprof::ValueType { ty: 3, unit: 4 },
            ],
            sample: vec![
                pprof::Sample {
                    location_id: vec![2, 1],
                    value: vec![3, 30_000_000],
                    label: vec![label(10, 11), label(12, 13), label(14, 15), label(16, 17)],
                },
                // The same identity again: merged.
                pprof::Sample {
                    location_id: vec![2, 1],
                    value: vec![1, 10_000_000],
                    label: vec![label(16, 17), label(14, 15), label(12, 13), label(10, 11)],
                },
                // A span id with no trace: an attribute, no link.
                pprof::Sample {
                    location_id: vec![1],
                    value: vec![2, 20_000_000],
                    label: vec![label(10, 11), label(12, 13)],
                },
            ],
            mapping: vec![pprof::Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x9000,
                filename: 8,
                build_id: 9,
                ..pprof::Mapping::default()
            }],
            location: vec![location(1, 1), location(2, 2)],
            function: vec![
                pprof::Function {
                    id: 1,
                    name: 5,
                    system_name: 5,
                    filename: 7,
                    start_line: 1,
                },
                pprof::Function {
                    id: 2,
                    name: 6,
                    system_name: 6,
                    filename: 7,
                    start_line: 5,
                },
            ],
            string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
            time_nanos: 1_800_000_000_000_000_000,
            duration_nanos: 15_000_000_000,
            period_type: Some(pprof::ValueType { ty: 3, unit: 4 }),
            period: 10_101_010,
            comment: vec![18],
            ..pprof::Profile::default()
        }
    }

    fn origin() -> Origin {
        Origin {
            resource: vec![("service.name".into(), "checkout".into())],
            instance: 7,
        }
    }

    /// One Profile per sample type, both on the shared dictionary, with the window's
    /// time, the pprof period, and merged samples carrying their values.
    #[test]
    fn a_cpu_profile_is_two_profiles_over_one_dictionary() {
        let request = export(&[&cpu_profile()], &origin());
        let dictionary = request.dictionary.as_ref().unwrap();
        let strings = &dictionary.string_table;
        let name = |at: i32| strings[at as usize].as_str();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        let types: Vec<(&str, &str)> = profiles
            .iter()
            .map(|p| {
                let ty = p.sample_type.unwrap();
                (name(ty.type_strindex), name(ty.unit_strindex))
            })
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        for profile in profiles {
            let period = profile.period_type.unwrap();
            assert_eq!(
                (name(period.type_strindex), name(period.unit_strindex)),
                ("cpu", "nanoseconds")
            );
            assert_eq!(profile.period, 10_101_010);
            assert_eq!(profile.time_unix_nano, 1_800_000_000_000_000_000);
            assert_eq!(profile.duration_nano, 15_000_000_000);
            assert_eq!(profile.samples.len(), 2, "the two equal samples merged");
        }
        let counts: Vec<i64> = profiles[0].samples.iter().map(|s| s.values[0]).collect();
        assert_eq!(counts, [4, 2]);
        let nanos: Vec<i64> = profiles[1].samples.iter().map(|s| s.values[0]).collect();
        assert_eq!(nanos, [40_000_000, 20_000_000]);
        assert_ne!(profiles[0].profile_id, profiles[1].profile_id);
        assert_eq!(profiles[0].profile_id.len(), 16);
        let resource = request.resource_profiles[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name", "inline key");
    }

    /// Stacks, locations, lines, functions and mappings keep pprof's frames in order,
    /// leaf first, with the build id as the semantic conventions name it.
    #[test]
    fn stacks_keep_their_frames_leaf_first() {
        let request = export(&[&cpu_profile()], &origin());
        let d = request.dictionary.as_ref().unwrap();
        let name = |at: i32| d.string_table[at as usize].as_str();
        let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
        let stack = &d.stack_table[profile.samples[0].stack_index as usize];
        let frames: Vec<(&str, i64, u64)> = stack
            .location_indices
            .iter()
            .map(|&at| {
                let location = &d.location_table[at as usize];
                let line = location.lines[0];
                let function = d.function_table[line.function_index as usize];
                (name(function.name_strindex), line.line, location.address)
            })
            .collect();
        assert_eq!(frames, [("work", 20, 0x1002), ("main", 10, 0x1001)]);
        let mapping = &d.mapping_table[1];
        assert_eq!(name(mapping.filename_strindex), "/bin/app");
        let build_id = &d.attribute_table[mapping.attribute_indices[0] as usize];
        assert_eq!(
            name(build_id.key_strindex),
            "process.executable.build_id.gnu"
        );
        assert_eq!(build_id.value, Some(string_value("abcdef")));
    }

    /// `thread` is `thread.name`; a span with its trace is the sample's link (16 and 8
    /// bytes), a span id without one stays an attribute; user labels are attributes.
    #[test]
    fn labels_are_attributes_and_spans_with_traces_links() {
        let request = export(&[&cpu_profile()], &origin());
        let d = request.dictionary.as_ref().unwrap();
        let name = |at: i32| d.string_table[at as usize].as_str();
        let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
        let attributes = |sample: &Sample| -> Vec<(String, String)> {
            let mut pairs: Vec<(String, String)> = sample
                .attribute_indices
                .iter()
                .map(|&at| {
                    let attribute = &d.attribute_table[at as usize];
                    let Some(any_value::Value::StringValue(value)) =
                        attribute.value.as_ref().and_then(|v| v.value.clone())
                    else {
                        panic!("a string value");
                    };
                    (name(attribute.key_strindex).to_owned(), value)
                })
                .collect();
            pairs.sort();
            pairs
        };
        let linked = &profile.samples[0];
        assert_eq!(
            attributes(linked),
            [
                ("tenant".to_owned(), "acme".to_owned()),
                ("thread.name".to_owned(), "worker-1".to_owned())
            ]
        );
        let link = &d.link_table[linked.link_index as usize];
        assert_eq!(link.span_id, [0, 0, 0, 0, 0, 0, 0, 0xff]);
        assert_eq!(link.trace_id[14..], [0xab, 0xcd]);
        let unlinked = &profile.samples[1];
        assert_eq!(unlinked.link_index, 0);
        assert_eq!(
            attributes(unlinked),
            [
                ("span_id".to_owned(), "00000000000000ff".to_owned()),
                ("thread.name".to_owned(), "worker-1".to_owned())
            ]
        );
    }

    /// Every table starts with its zero value and holds no duplicate (profcheck's
    /// `-check-dupes`), and every entry but the zeroes is pointed at (`-check-orphans`).
    #[test]
    fn tables_start_with_zero_values_and_hold_no_duplicates_or_orphans() {
        let request = export(&[&cpu_profile()], &origin());
        let d = request.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.mapping_table[0], Mapping::default());
        assert_eq!(d.location_table[0], Location::default());
        assert_eq!(d.function_table[0], Function::default());
        assert_eq!(d.stack_table[0], Stack::default());
        assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
        assert_eq!(d.link_table[0].trace_id, [0; 16]);
        fn unique<T: PartialEq + std::fmt::Debug>(table: &[T]) {
            for (at, entry) in table.iter().enumerate() {
                assert!(!table[..at].contains(entry), "{entry:?} twice");
            }
        }
        unique(&d.string_table);
        unique(&d.mapping_table);
        unique(&d.location_table);
        unique(&d.function_table);
        unique(&d.stack_table);
        unique(&d.attribute_table);
        unique(&d.link_table);
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        let mut attributes_used: Vec<i32> = profiles
            .iter()
            .flat_map(|p| p.samples.iter().flat_map(|s| s.attribute_indices.clone()))
            .chain(profiles.iter().flat_map(|p| p.attribute_indices.clone()))
            .chain(
                d.mapping_table
                    .iter()
                    .flat_map(|m| m.attribute_indices.clone()),
            )
            .chain(
                d.location_table
                    .iter()
                    .flat_map(|l| l.attribute_indices.clone()),
            )
            .collect();
        attributes_used.sort_unstable();
        attributes_used.dedup();
        assert_eq!(
            attributes_used,
            (1..d.attribute_table.len() as i32).collect::<Vec<_>>()
        );
        let mut stacks_used: Vec<i32> = profiles
            .iter()
            .flat_map(|p| p.samples.iter().map(|s| s.stack_index))
            .collect();
        stacks_used.sort_unstable();
        stacks_used.dedup();
        assert_eq!(
            stacks_used,
            (1..d.stack_table.len() as i32).collect::<Vec<_>>()
        );
    }

    /// The comments travel as one profile attribute holding them all.
    #[test]
    fn comments_are_one_attribute_with_every_comment() {
        let request = export(&[&cpu_profile()], &origin());
        let d = request.dictionary.as_ref().unwrap();
        let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
        assert_eq!(profile.attribute_indices.len(), 1);
        let comment = &d.attribute_table[profile.attribute_indices[0] as usize];
        assert_eq!(
            d.string_table[comment.key_strindex as usize],
            "pprof.profile.comment"
        );
        assert_eq!(
            comment.value,
            Some(AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue {
                    values: vec![string_value("sampled at 99 Hz")]
                }))
            })
        );
    }

    /// A window's CPU and heap profiles share one dictionary: the frames they have in
    /// common are there once, and each profile keeps its own sample types and ids.
    #[test]
    fn profiles_of_one_window_share_the_dictionary_without_duplicates() {
        let cpu = cpu_profile();
        let mut heap = cpu_profile();
        heap.sample_type.truncate(1);
        heap.comment.clear();
        let request = export(&[&cpu, &heap], &origin());
        let d = request.dictionary.as_ref().unwrap();
        let alone = export(&[&cpu], &origin());
        let d_alone = alone.dictionary.as_ref().unwrap();
        assert_eq!(d.location_table, d_alone.location_table);
        assert_eq!(d.function_table, d_alone.function_table);
        assert_eq!(d.mapping_table, d_alone.mapping_table);
        assert_eq!(d.stack_table, d_alone.stack_table);
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 3);
        let ids: std::collections::HashSet<&Vec<u8>> =
            profiles.iter().map(|p| &p.profile_id).collect();
        assert_eq!(ids.len(), 3, "every profile its own id");
        assert!(
            profiles[2].attribute_indices.is_empty(),
            "the heap has no comments"
        );
    }

    #[test]
    fn hex_ids_are_read_only_when_whole_and_not_zero() {
        assert_eq!(hex_bytes::<2>("0aff"), Some([0x0a, 0xff]));
        assert_eq!(hex_bytes::<2>("0af"), None);
        assert_eq!(hex_bytes::<2>("0afz"), None);
        assert_eq!(hex_bytes::<2>("0000"), None);
    }
}
