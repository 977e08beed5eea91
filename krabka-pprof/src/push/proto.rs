//! The messages pushed to a profile backend, as hand-written prost types (no `build.rs`, no
//! `protoc`), the way `profile::proto` vendors pprof's `Profile`.
//!
//! - OpenTelemetry OTLP profiles, from `open-telemetry/opentelemetry-proto` at tag
//!   **v1.10.0** (commit `ca839c51f706f5d53bfb46f06c3e90c3af3a52c6`; v1.11.0 changes only
//!   comments in these files, so the wire format is the same):
//!   `opentelemetry/proto/profiles/v1development/profiles.proto`
//!   (package `opentelemetry.proto.profiles.v1development`),
//!   `opentelemetry/proto/collector/profiles/v1development/profiles_service.proto`
//!   (`opentelemetry.proto.collector.profiles.v1development`),
//!   `opentelemetry/proto/common/v1/common.proto` (`opentelemetry.proto.common.v1`) and
//!   `opentelemetry/proto/resource/v1/resource.proto` (`opentelemetry.proto.resource.v1`).
//!   The profiles signal is still "development": its messages change between releases, so
//!   keep these in step with the release the receiving collector speaks.
//! - Grafana Pyroscope's push API, from `grafana/pyroscope` at tag v2.2.1 (commit
//!   `df3c0391b7dfc9c9577a55be4ebfcf2f0ac65d71`): `api/push/v1/push.proto` (package
//!   `push.v1`) and `LabelPair` from `api/types/v1/types.proto` (`types.v1`).
//!
//! Field names and numbers follow the `.proto` files (Pyroscope's `ID` is `id`, as
//! prost-build would name it). Fields left out are listed where they would be; prost skips
//! unknown fields when decoding, so leaving them out never breaks a decode. The tests pin
//! the wire format with bytes worked out by hand from the protobuf encoding rules.

pub(crate) use prost::Message;

// ---------------------------------------------------------------------------------------
// opentelemetry.proto.collector.profiles.v1development (profiles_service.proto)
// ---------------------------------------------------------------------------------------

/// The body of an OTLP profiles export (`ProfilesService/Export`, or `POST /v1development/profiles`).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_profiles: Vec<ResourceProfiles>,
    /// The tables every profile of the request indexes into.
    #[prost(message, optional, tag = "2")]
    pub(crate) dictionary: Option<ProfilesDictionary>,
}

/// The collector's answer to an export; `partial_success` is set when some of it was rejected.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct ExportProfilesServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) partial_success: Option<ExportProfilesPartialSuccess>,
}

/// How many profiles the collector rejected, and why (or a warning, with zero rejected).
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct ExportProfilesPartialSuccess {
    #[prost(int64, tag = "1")]
    pub(crate) rejected_profiles: i64,
    #[prost(string, tag = "2")]
    pub(crate) error_message: String,
}

// ---------------------------------------------------------------------------------------
// opentelemetry.proto.profiles.v1development (profiles.proto)
// ---------------------------------------------------------------------------------------

/// The tables shared by every profile of a request; entry 0 of each is its zero value.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProfilesDictionary {
    #[prost(message, repeated, tag = "1")]
    pub(crate) mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) function_table: Vec<Function>,
    #[prost(message, repeated, tag = "4")]
    pub(crate) link_table: Vec<Link>,
    /// Every string the request uses; index 0 is the empty string.
    #[prost(string, repeated, tag = "5")]
    pub(crate) string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub(crate) attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub(crate) stack_table: Vec<Stack>,
}

/// The profiles of one resource (a process, a container), grouped by scope.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ResourceProfiles {
    // `reserved 1000;`
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_profiles: Vec<ScopeProfiles>,
    #[prost(string, tag = "3")]
    pub(crate) schema_url: String,
}

/// The profiles produced by one instrumentation scope (the profiler).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) profiles: Vec<Profile>,
    #[prost(string, tag = "3")]
    pub(crate) schema_url: String,
}

/// One profile: a single sample type, its samples, and when and how it was taken.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Profile {
    /// What every sample's values measure.
    #[prost(message, optional, tag = "1")]
    pub(crate) sample_type: Option<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) samples: Vec<Sample>,
    /// Collection time, nanoseconds since the UNIX epoch (`fixed64`).
    #[prost(fixed64, tag = "3")]
    pub(crate) time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    pub(crate) duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub(crate) period_type: Option<ValueType>,
    #[prost(int64, tag = "6")]
    pub(crate) period: i64,
    /// 16 bytes, or empty; all zeroes is invalid.
    #[prost(bytes = "vec", tag = "7")]
    pub(crate) profile_id: Vec<u8>,
    #[prost(uint32, tag = "8")]
    pub(crate) dropped_attributes_count: u32,
    /// E.g. `"pprof"`; set together with `original_payload`, or neither.
    #[prost(string, tag = "9")]
    pub(crate) original_payload_format: String,
    #[prost(bytes = "vec", tag = "10")]
    pub(crate) original_payload: Vec<u8>,
    /// Indices into `ProfilesDictionary::attribute_table`.
    #[prost(int32, repeated, tag = "11")]
    pub(crate) attribute_indices: Vec<i32>,
}

/// A pointer from a sample to the trace span it was taken in.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct Link {
    /// 16 bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    /// 8 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
}

/// A measurement's kind and unit, as string-table indices.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct ValueType {
    #[prost(int32, tag = "1")]
    pub(crate) type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub(crate) unit_strindex: i32,
}

/// A stack (by index) with its attributes, link, and values and/or timestamps.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct Sample {
    /// Index into `ProfilesDictionary::stack_table`.
    #[prost(int32, tag = "1")]
    pub(crate) stack_index: i32,
    /// Indices into `ProfilesDictionary::attribute_table`.
    #[prost(int32, repeated, tag = "2")]
    pub(crate) attribute_indices: Vec<i32>,
    /// Index into `ProfilesDictionary::link_table`; 0 is no link.
    #[prost(int32, tag = "3")]
    pub(crate) link_index: i32,
    /// One value per event, of `Profile::sample_type`.
    #[prost(int64, repeated, tag = "4")]
    pub(crate) values: Vec<i64>,
    /// One time per event, nanoseconds since the UNIX epoch (`repeated fixed64`).
    #[prost(fixed64, repeated, tag = "5")]
    pub(crate) timestamps_unix_nano: Vec<u64>,
}

/// A mapped object: its address range, file offset and file name.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct Mapping {
    #[prost(uint64, tag = "1")]
    pub(crate) memory_start: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) memory_limit: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) file_offset: u64,
    #[prost(int32, tag = "4")]
    pub(crate) filename_strindex: i32,
    /// Indices into `ProfilesDictionary::attribute_table` (e.g. the build ID).
    #[prost(int32, repeated, tag = "5")]
    pub(crate) attribute_indices: Vec<i32>,
}

/// A stack trace, leaf first, as indices into `ProfilesDictionary::location_table`.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct Stack {
    #[prost(int32, repeated, tag = "1")]
    pub(crate) location_indices: Vec<i32>,
}

/// A code address and the function (or inlined functions, innermost first) at it.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct Location {
    /// Index into `ProfilesDictionary::mapping_table`; 0 is unknown.
    #[prost(int32, tag = "1")]
    pub(crate) mapping_index: i32,
    #[prost(uint64, tag = "2")]
    pub(crate) address: u64,
    #[prost(message, repeated, tag = "3")]
    pub(crate) lines: Vec<Line>,
    #[prost(int32, repeated, tag = "4")]
    pub(crate) attribute_indices: Vec<i32>,
}

/// One function at a location, with its source line and column if known (0 if not).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct Line {
    /// Index into `ProfilesDictionary::function_table`.
    #[prost(int32, tag = "1")]
    pub(crate) function_index: i32,
    #[prost(int64, tag = "2")]
    pub(crate) line: i64,
    #[prost(int64, tag = "3")]
    pub(crate) column: i64,
}

/// A function: its names and source file, as string-table indices.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct Function {
    #[prost(int32, tag = "1")]
    pub(crate) name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub(crate) system_name_strindex: i32,
    #[prost(int32, tag = "3")]
    pub(crate) filename_strindex: i32,
    #[prost(int64, tag = "4")]
    pub(crate) start_line: i64,
}

/// An entry of the attribute table: a key (string index), a value, and a unit (string index).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub(crate) key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
    /// 0 is no (or the conventional) unit.
    #[prost(int32, tag = "3")]
    pub(crate) unit_strindex: i32,
}

// ---------------------------------------------------------------------------------------
// opentelemetry.proto.resource.v1 (resource.proto)
// ---------------------------------------------------------------------------------------

/// The entity the profiles are about (`service.name`, `process.pid`, ...).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub(crate) attributes: Vec<KeyValue>,
    #[prost(uint32, tag = "2")]
    pub(crate) dropped_attributes_count: u32,
    // Left out: `repeated opentelemetry.proto.common.v1.EntityRef entity_refs = 3;`
    // (development status).
}

// ---------------------------------------------------------------------------------------
// opentelemetry.proto.common.v1 (common.proto)
// ---------------------------------------------------------------------------------------

/// An attribute value: one of a string, bool, integer, double, array, map, bytes, or (in
/// profiles only) a string-table index; none set is the empty value.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4, 5, 6, 7, 8")]
    pub(crate) value: Option<any_value::Value>,
}

/// The `oneof value` of [`AnyValue`].
pub(crate) mod any_value {
    /// Which value an [`AnyValue`](super::AnyValue) holds.
    #[derive(Clone, PartialEq, prost::Oneof)]
    #[allow(
        clippy::enum_variant_names,
        reason = "the variants are the .proto's oneof members, named as prost-build names them"
    )]
    pub(crate) enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
        #[prost(message, tag = "5")]
        ArrayValue(super::ArrayValue),
        #[prost(message, tag = "6")]
        KvlistValue(super::KeyValueList),
        #[prost(bytes = "vec", tag = "7")]
        BytesValue(Vec<u8>),
        /// Index into `ProfilesDictionary::string_table` (profiles only).
        #[prost(int32, tag = "8")]
        StringValueStrindex(i32),
    }
}

/// A list of values (the `array_value` of an [`AnyValue`]).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub(crate) values: Vec<AnyValue>,
}

/// A list of key-value pairs (the `kvlist_value` of an [`AnyValue`]).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub(crate) values: Vec<KeyValue>,
}

/// An attribute: a key (as a string, or in profiles as a string-table index) and a value.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct KeyValue {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
    /// Index into `ProfilesDictionary::string_table`; set this or `key`, not both.
    #[prost(int32, tag = "3")]
    pub(crate) key_strindex: i32,
}

/// The instrumentation (here, the profiler) that produced the data: name and version.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
    #[prost(message, repeated, tag = "3")]
    pub(crate) attributes: Vec<KeyValue>,
    #[prost(uint32, tag = "4")]
    pub(crate) dropped_attributes_count: u32,
}

// ---------------------------------------------------------------------------------------
// push.v1 (grafana/pyroscope api/push/v1/push.proto) and types.v1 (api/types/v1/types.proto)
// ---------------------------------------------------------------------------------------

/// The body of a Pyroscope push (`push.v1.PusherService/Push`): labelled pprof profiles.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub(crate) series: Vec<RawProfileSeries>,
}

// Pyroscope's answer to a push, `PushResponse`, has no fields: it is not decoded.

/// One series: its labels (`service_name`, `__name__`, ...) and its pprof profiles.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct RawProfileSeries {
    #[prost(message, repeated, tag = "1")]
    pub(crate) labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) samples: Vec<RawSample>,
    // Left out: `repeated types.v1.ProfileAnnotation annotations = 3;` (Pyroscope drops
    // annotations sent through the push API).
}

/// One profile of a series: gzipped or plain pprof bytes, and an optional UUID.
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct RawSample {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) raw_profile: Vec<u8>,
    /// The `.proto`'s `ID`.
    #[prost(string, tag = "2")]
    pub(crate) id: String,
}

/// A series label (`types.v1.LabelPair`).
#[derive(Clone, PartialEq, Eq, Message)]
pub(crate) struct LabelPair {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) value: String,
}

#[cfg(test)]
mod tests {
    use super::any_value::Value;
    use super::*;

    // Every expected byte below is worked out by hand: a field's key is
    // `(field_number << 3) | wire_type`, with wire types 0 varint, 1 64-bit, 2
    // length-delimited; proto3 leaves default scalars out and packs repeated scalars.

    fn string(s: &str) -> Option<AnyValue> {
        Some(AnyValue {
            value: Some(Value::StringValue(s.into())),
        })
    }

    #[test]
    fn key_value_and_any_value_fields() {
        let kv = KeyValue {
            key: "a".into(),
            value: string("b"),
            key_strindex: 0,
        };
        // key = 1 (LEN): 0x0a, 1, 'a'; value = 2 (LEN): 0x12, 3, then the AnyValue:
        // string_value = 1 (LEN): 0x0a, 1, 'b'. key_strindex 0 is left out.
        assert_eq!(
            kv.encode_to_vec(),
            [0x0a, 0x01, b'a', 0x12, 0x03, 0x0a, 0x01, b'b']
        );
        // key_strindex = 3 (varint): 0x18.
        let kv = KeyValue {
            key: String::new(),
            value: None,
            key_strindex: 7,
        };
        assert_eq!(kv.encode_to_vec(), [0x18, 7]);
        // A oneof member is written even at its default: bool_value = 2 (varint): 0x10, 0.
        let any = AnyValue {
            value: Some(Value::BoolValue(false)),
        };
        assert_eq!(any.encode_to_vec(), [0x10, 0x00]);
        // string_value_strindex = 8 (varint): 8 << 3 = 0x40.
        let any = AnyValue {
            value: Some(Value::StringValueStrindex(3)),
        };
        assert_eq!(any.encode_to_vec(), [0x40, 0x03]);
        // double_value = 4 (I64): 0x21, then 1.0 as little-endian IEEE 754.
        let any = AnyValue {
            value: Some(Value::DoubleValue(1.0)),
        };
        assert_eq!(any.encode_to_vec(), [0x21, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]);
        // int_value = 3 (varint): 0x18; bytes_value = 7 (LEN): 0x3a.
        let any = AnyValue {
            value: Some(Value::IntValue(300)),
        };
        assert_eq!(any.encode_to_vec(), [0x18, 0xac, 0x02]);
        let any = AnyValue {
            value: Some(Value::BytesValue(vec![0xff])),
        };
        assert_eq!(any.encode_to_vec(), [0x3a, 0x01, 0xff]);
        // array_value = 5 (LEN): 0x2a; kvlist_value = 6 (LEN): 0x32; the inner lists
        // hold their values at field 1 (LEN): 0x0a.
        let any = AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: vec![string("b").unwrap()],
            })),
        };
        assert_eq!(
            any.encode_to_vec(),
            [0x2a, 0x05, 0x0a, 0x03, 0x0a, 0x01, b'b']
        );
        let any = AnyValue {
            value: Some(Value::KvlistValue(KeyValueList {
                values: vec![KeyValue {
                    key: String::new(),
                    value: None,
                    key_strindex: 1,
                }],
            })),
        };
        assert_eq!(any.encode_to_vec(), [0x32, 0x04, 0x0a, 0x02, 0x18, 0x01]);
    }

    #[test]
    fn profile_time_is_fixed64_field_3() {
        let profile = Profile {
            time_unix_nano: 1,
            ..Profile::default()
        };
        // time_unix_nano = 3 (I64): (3 << 3) | 1 = 0x19, then 8 little-endian bytes.
        assert_eq!(profile.encode_to_vec(), [0x19, 1, 0, 0, 0, 0, 0, 0, 0]);

        let profile = Profile {
            sample_type: Some(ValueType {
                type_strindex: 1,
                unit_strindex: 2,
            }),
            duration_nano: 5,
            period: 6,
            profile_id: vec![0xab],
            dropped_attributes_count: 2,
            original_payload_format: "p".into(),
            original_payload: vec![0xcd],
            attribute_indices: vec![4],
            ..Profile::default()
        };
        assert_eq!(
            profile.encode_to_vec(),
            [
                0x0a, 0x04, 0x08, 0x01, 0x10, 0x02, // sample_type = 1 (LEN): ValueType {1, 2}
                0x20, 0x05, // duration_nano = 4 (varint)
                0x30, 0x06, // period = 6 (varint)
                0x3a, 0x01, 0xab, // profile_id = 7 (LEN)
                0x40, 0x02, // dropped_attributes_count = 8 (varint)
                0x4a, 0x01, b'p', // original_payload_format = 9 (LEN)
                0x52, 0x01, 0xcd, // original_payload = 10 (LEN)
                0x5a, 0x01, 0x04, // attribute_indices = 11, packed (LEN)
            ]
        );
        // period_type = 5 (LEN): 0x2a; an empty message is still written.
        let profile = Profile {
            period_type: Some(ValueType::default()),
            ..Profile::default()
        };
        assert_eq!(profile.encode_to_vec(), [0x2a, 0x00]);
    }

    #[test]
    fn sample_fields_and_packing() {
        let sample = Sample {
            stack_index: 2,
            values: vec![5],
            ..Sample::default()
        };
        // stack_index = 1 (varint): 0x08, 2; values = 4, packed (LEN): 0x22, 1 byte, 5.
        assert_eq!(sample.encode_to_vec(), [0x08, 0x02, 0x22, 0x01, 0x05]);

        let sample = Sample {
            stack_index: 2,
            attribute_indices: vec![1, 3],
            link_index: 4,
            values: vec![5],
            timestamps_unix_nano: vec![7],
        };
        assert_eq!(
            sample.encode_to_vec(),
            [
                0x08, 0x02, // stack_index = 1
                0x12, 0x02, 0x01, 0x03, // attribute_indices = 2, packed
                0x18, 0x04, // link_index = 3
                0x22, 0x01, 0x05, // values = 4, packed
                // timestamps_unix_nano = 5, packed fixed64s:
                0x2a, 0x08, 7, 0, 0, 0, 0, 0, 0, 0,
            ]
        );
        // A negative int32 is sign-extended to a ten-byte varint.
        let sample = Sample {
            stack_index: -1,
            ..Sample::default()
        };
        assert_eq!(
            sample.encode_to_vec(),
            [
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
            ]
        );
    }

    #[test]
    fn dictionary_entries() {
        let location = Location {
            mapping_index: 1,
            address: 2,
            lines: vec![Line {
                function_index: 3,
                line: 4,
                column: 5,
            }],
            attribute_indices: vec![6],
        };
        assert_eq!(
            location.encode_to_vec(),
            [
                0x08, 0x01, // mapping_index = 1
                0x10, 0x02, // address = 2
                0x1a, 0x06, 0x08, 0x03, 0x10, 0x04, 0x18, 0x05, // lines = 3: Line {3, 4, 5}
                0x22, 0x01, 0x06, // attribute_indices = 4, packed
            ]
        );
        let mapping = Mapping {
            memory_start: 1,
            memory_limit: 2,
            file_offset: 3,
            filename_strindex: 4,
            attribute_indices: vec![5],
        };
        assert_eq!(
            mapping.encode_to_vec(),
            [0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4, 0x2a, 0x01, 5]
        );
        let function = Function {
            name_strindex: 1,
            system_name_strindex: 2,
            filename_strindex: 3,
            start_line: 4,
        };
        assert_eq!(
            function.encode_to_vec(),
            [0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4]
        );
        let stack = Stack {
            location_indices: vec![1, 2],
        };
        assert_eq!(stack.encode_to_vec(), [0x0a, 0x02, 1, 2]);
        let link = Link {
            trace_id: vec![0xaa],
            span_id: vec![0xbb],
        };
        assert_eq!(link.encode_to_vec(), [0x0a, 0x01, 0xaa, 0x12, 0x01, 0xbb]);
        let attribute = KeyValueAndUnit {
            key_strindex: 1,
            value: string("b"),
            unit_strindex: 2,
        };
        assert_eq!(
            attribute.encode_to_vec(),
            [0x08, 0x01, 0x12, 0x03, 0x0a, 0x01, b'b', 0x18, 0x02]
        );
        // ProfilesDictionary: string_table = 5 (LEN): 0x2a; stack_table = 7 (LEN): 0x3a;
        // attribute_table = 6 (LEN): 0x32; link_table = 4 (LEN): 0x22; function_table =
        // 3 (LEN): 0x1a; location_table = 2: 0x12; mapping_table = 1: 0x0a. Empty
        // entries (the required zero values) are written as zero-length messages.
        let dictionary = ProfilesDictionary {
            mapping_table: vec![Mapping::default()],
            location_table: vec![Location::default()],
            function_table: vec![Function::default()],
            link_table: vec![Link::default()],
            string_table: vec![String::new()],
            attribute_table: vec![KeyValueAndUnit::default()],
            stack_table: vec![Stack::default()],
        };
        assert_eq!(
            dictionary.encode_to_vec(),
            [
                0x0a, 0, 0x12, 0, 0x1a, 0, 0x22, 0, 0x2a, 0, 0x32, 0, 0x3a, 0
            ]
        );
    }

    #[test]
    fn export_request_layout_and_round_trip() {
        // resource_profiles = 1 (LEN): 0x0a; dictionary = 2 (LEN): 0x12.
        let request = ExportProfilesServiceRequest {
            resource_profiles: vec![ResourceProfiles::default()],
            dictionary: Some(ProfilesDictionary {
                string_table: vec![String::new()],
                ..ProfilesDictionary::default()
            }),
        };
        assert_eq!(
            request.encode_to_vec(),
            [0x0a, 0x00, 0x12, 0x02, 0x2a, 0x00]
        );
        // ResourceProfiles: resource = 1, scope_profiles = 2, schema_url = 3; Resource:
        // attributes = 1, dropped_attributes_count = 2; ScopeProfiles: scope = 1,
        // profiles = 2, schema_url = 3; InstrumentationScope: name = 1, version = 2,
        // attributes = 3, dropped_attributes_count = 4.
        let resource_profiles = ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![],
                dropped_attributes_count: 1,
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "n".into(),
                    version: "v".into(),
                    attributes: vec![],
                    dropped_attributes_count: 2,
                }),
                profiles: vec![],
                schema_url: "s".into(),
            }],
            schema_url: "u".into(),
        };
        assert_eq!(
            resource_profiles.encode_to_vec(),
            [
                0x0a, 0x02, 0x10, 0x01, // resource = 1: Resource { dropped = 2: 1 }
                0x12, 0x0d, // scope_profiles = 2, 13 bytes:
                0x0a, 0x08, // scope = 1, 8 bytes: InstrumentationScope
                0x0a, 0x01, b'n', 0x12, 0x01, b'v', 0x20, 0x02, //
                0x1a, 0x01, b's', // ScopeProfiles.schema_url = 3
                0x1a, 0x01, b'u', // ResourceProfiles.schema_url = 3
            ]
        );

        let request = ExportProfilesServiceRequest {
            resource_profiles: vec![ResourceProfiles {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: string("krabka"),
                        key_strindex: 0,
                    }],
                    dropped_attributes_count: 0,
                }),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "krabka-pprof".into(),
                        version: "0.1.0".into(),
                        attributes: vec![],
                        dropped_attributes_count: 0,
                    }),
                    profiles: vec![Profile {
                        sample_type: Some(ValueType {
                            type_strindex: 1,
                            unit_strindex: 2,
                        }),
                        samples: vec![Sample {
                            stack_index: 1,
                            attribute_indices: vec![1],
                            link_index: 1,
                            values: vec![10, -3],
                            timestamps_unix_nano: vec![u64::MAX, 0],
                        }],
                        time_unix_nano: 1_700_000_000_000_000_000,
                        duration_nano: 10_000_000_000,
                        period_type: Some(ValueType {
                            type_strindex: 1,
                            unit_strindex: 2,
                        }),
                        period: 10_000_000,
                        profile_id: vec![1; 16],
                        dropped_attributes_count: 0,
                        original_payload_format: "pprof".into(),
                        original_payload: vec![0x1f, 0x8b],
                        attribute_indices: vec![1],
                    }],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
            dictionary: Some(ProfilesDictionary {
                mapping_table: vec![
                    Mapping::default(),
                    Mapping {
                        memory_start: 0x1000,
                        memory_limit: 0x2000,
                        file_offset: 0,
                        filename_strindex: 3,
                        attribute_indices: vec![],
                    },
                ],
                location_table: vec![
                    Location::default(),
                    Location {
                        mapping_index: 1,
                        address: 0x1234,
                        lines: vec![Line {
                            function_index: 1,
                            line: 42,
                            column: 0,
                        }],
                        attribute_indices: vec![],
                    },
                ],
                function_table: vec![
                    Function::default(),
                    Function {
                        name_strindex: 4,
                        system_name_strindex: 4,
                        filename_strindex: 3,
                        start_line: 40,
                    },
                ],
                link_table: vec![
                    Link::default(),
                    Link {
                        trace_id: vec![2; 16],
                        span_id: vec![3; 8],
                    },
                ],
                string_table: ["", "cpu", "nanoseconds", "main.rs", "main"]
                    .map(String::from)
                    .to_vec(),
                attribute_table: vec![
                    KeyValueAndUnit::default(),
                    KeyValueAndUnit {
                        key_strindex: 1,
                        value: Some(AnyValue {
                            value: Some(Value::StringValueStrindex(2)),
                        }),
                        unit_strindex: 0,
                    },
                ],
                stack_table: vec![
                    Stack::default(),
                    Stack {
                        location_indices: vec![1],
                    },
                ],
            }),
        };
        let bytes = request.encode_to_vec();
        assert_eq!(
            ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap(),
            request
        );
    }

    #[test]
    fn export_response() {
        // partial_success = 1 (LEN): 0x0a, 5 bytes: rejected_profiles = 1 (varint): 0x08, 2;
        // error_message = 2 (LEN): 0x12, 1, 'e'.
        let bytes = [0x0a, 0x05, 0x08, 0x02, 0x12, 0x01, b'e'];
        let response = ExportProfilesServiceResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            response,
            ExportProfilesServiceResponse {
                partial_success: Some(ExportProfilesPartialSuccess {
                    rejected_profiles: 2,
                    error_message: "e".into(),
                }),
            }
        );
        assert_eq!(response.encode_to_vec(), bytes);
        assert_eq!(
            ExportProfilesServiceResponse::decode(&[][..]).unwrap(),
            ExportProfilesServiceResponse::default()
        );
    }

    #[test]
    fn pyroscope_push() {
        let sample = RawSample {
            raw_profile: vec![0xab],
            id: "x".into(),
        };
        // raw_profile = 1 (LEN): 0x0a, 1, 0xab; ID = 2 (LEN): 0x12, 1, 'x'.
        assert_eq!(sample.encode_to_vec(), [0x0a, 0x01, 0xab, 0x12, 0x01, b'x']);
        let request = PushRequest {
            series: vec![RawProfileSeries {
                labels: vec![LabelPair {
                    name: "n".into(),
                    value: "v".into(),
                }],
                samples: vec![sample],
            }],
        };
        assert_eq!(
            request.encode_to_vec(),
            [
                0x0a, 0x10, // series = 1, 16 bytes: RawProfileSeries
                0x0a, 0x06, // labels = 1, 6 bytes: LabelPair
                0x0a, 0x01, b'n', 0x12, 0x01, b'v', // name = 1, value = 2
                0x12, 0x06, // samples = 2, 6 bytes: RawSample
                0x0a, 0x01, 0xab, 0x12, 0x01, b'x',
            ]
        );
        // A series carrying annotations (field 3, LEN: 0x1a) still decodes; they are
        // skipped.
        let bytes = [0x1a, 0x02, 0x0a, 0x00];
        assert_eq!(
            RawProfileSeries::decode(bytes.as_slice()).unwrap(),
            RawProfileSeries::default()
        );
    }
}
