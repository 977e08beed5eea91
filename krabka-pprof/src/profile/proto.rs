//! The pprof `Profile` message (`perftools.profiles`, google/pprof's `profile.proto`), as
//! prost types: the one definition every profile of this crate is built with, on every
//! target. Field names and numbers follow the `.proto` (`type` is `ty`, as in the `pprof`
//! crate's generated code, so the two read alike); the tests decode what this encodes
//! with the `pprof` crate's own types, which keeps the two in agreement.

pub(crate) use prost::Message;

/// A profile: samples, and the tables they index into.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Profile {
    /// What each of a sample's values measures.
    #[prost(message, repeated, tag = "1")]
    pub(crate) sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub(crate) location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub(crate) function: Vec<Function>,
    /// Every string the profile uses; index 0 is the empty string.
    #[prost(string, repeated, tag = "6")]
    pub(crate) string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub(crate) drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub(crate) keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub(crate) time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub(crate) duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub(crate) period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub(crate) period: i64,
    /// Free-form notes, as string indices (`go tool pprof -comments`).
    #[prost(int64, repeated, tag = "13")]
    pub(crate) comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub(crate) default_sample_type: i64,
}

/// A measurement's kind and unit, as string indices.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct ValueType {
    #[prost(int64, tag = "1")]
    pub(crate) ty: i64,
    #[prost(int64, tag = "2")]
    pub(crate) unit: i64,
}

/// A stack (leaf first) with its values and labels.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub(crate) value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) label: Vec<Label>,
}

/// A sample label: a string (`str`) or a number (`num`, in `num_unit`).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct Label {
    #[prost(int64, tag = "1")]
    pub(crate) key: i64,
    #[prost(int64, tag = "2")]
    pub(crate) str: i64,
    #[prost(int64, tag = "3")]
    pub(crate) num: i64,
    #[prost(int64, tag = "4")]
    pub(crate) num_unit: i64,
}

/// A mapped object: where it is, and how to find its file (name, build ID).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct Mapping {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub(crate) file_offset: u64,
    #[prost(int64, tag = "5")]
    pub(crate) filename: i64,
    #[prost(int64, tag = "6")]
    pub(crate) build_id: i64,
    #[prost(bool, tag = "7")]
    pub(crate) has_functions: bool,
    #[prost(bool, tag = "8")]
    pub(crate) has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub(crate) has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub(crate) has_inline_frames: bool,
}

/// A code address and the function (or inlined functions, innermost first) at it.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Location {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) address: u64,
    #[prost(message, repeated, tag = "4")]
    pub(crate) line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub(crate) is_folded: bool,
}

/// One function at a location, with its source line if known.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct Line {
    #[prost(uint64, tag = "1")]
    pub(crate) function_id: u64,
    #[prost(int64, tag = "2")]
    pub(crate) line: i64,
    #[prost(int64, tag = "3")]
    pub(crate) column: i64,
}

/// A function: its names and source file, as string indices.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub(crate) struct Function {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(int64, tag = "2")]
    pub(crate) name: i64,
    #[prost(int64, tag = "3")]
    pub(crate) system_name: i64,
    #[prost(int64, tag = "4")]
    pub(crate) filename: i64,
    #[prost(int64, tag = "5")]
    pub(crate) start_line: i64,
}

impl Profile {
    /// The string at `index` of the string table; empty when out of range, as pprof
    /// tools read a bad index.
    pub(crate) fn string(&self, index: i64) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.string_table.get(i))
            .map_or("", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field, with a value that is not its default, survives encoding and decoding
    /// at the numbers `profile.proto` gives it (checked by hand-encoded bytes for a few).
    #[test]
    fn fields_have_profile_protos_numbers() {
        let value_type = ValueType { ty: 1, unit: 2 };
        assert_eq!(value_type.encode_to_vec(), [0x08, 1, 0x10, 2]);
        let line = Line {
            function_id: 3,
            line: 4,
            column: 5,
        };
        assert_eq!(line.encode_to_vec(), [0x08, 3, 0x10, 4, 0x18, 5]);
        let profile = Profile {
            sample_type: vec![value_type],
            sample: vec![Sample {
                location_id: vec![1],
                value: vec![7, 8],
                label: vec![Label {
                    key: 1,
                    str: 2,
                    num: 3,
                    num_unit: 4,
                }],
            }],
            mapping: vec![Mapping {
                id: 1,
                memory_start: 2,
                memory_limit: 3,
                file_offset: 4,
                filename: 5,
                build_id: 6,
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            }],
            location: vec![Location {
                id: 1,
                mapping_id: 1,
                address: 9,
                line: vec![line],
                is_folded: true,
            }],
            function: vec![Function {
                id: 3,
                name: 1,
                system_name: 2,
                filename: 3,
                start_line: 4,
            }],
            string_table: vec![String::new(), "cpu".into()],
            drop_frames: 1,
            keep_frames: 2,
            time_nanos: 3,
            duration_nanos: 4,
            period_type: Some(value_type),
            period: 5,
            comment: vec![1],
            default_sample_type: 1,
        };
        let bytes = profile.encode_to_vec();
        assert_eq!(Profile::decode(bytes.as_slice()).unwrap(), profile);
        // Field 14, default_sample_type, is the last thing written: tag (14 << 3) | 0.
        assert_eq!(bytes[bytes.len() - 2..], [14 << 3, 1]);
    }
}
