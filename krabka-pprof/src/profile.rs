//! Builds a pprof `Profile` (the prost message in `profile/proto.rs`) from stacks of code
//! addresses: has every address symbolized once (`crate::symbolize`), and emits mappings
//! (with build IDs, so Parca and `go tool pprof` can match binaries), locations,
//! functions and samples the way Go's runtime does. Shared by the CPU and heap profiles
//! and the thread dump.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) mod proto;

pub(crate) use proto::Profile;
use proto::{Function, Label, Line, Location, Mapping, Sample, ValueType};

use crate::objects::{Objects, hex};
use crate::symbolize::{FunctionLine, Resolved, Symbolize};

/// One frame of a stack, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Frame {
    /// An address to symbolize: the interrupted PC, or a return address minus one (so it
    /// falls inside the call instruction's function, which matters for tail calls).
    Code(u64),
    /// A frame the profiler adds to say something about the stack, such as
    /// `[lost samples]`; it has no address.
    Marker(String),
    /// A frame another sampler (the `pprof` crate's) already symbolized: its functions,
    /// innermost inlined first, as pprof orders a location's lines. That sampler keeps no
    /// code address (only symbols' link-time addresses), so such a frame has neither an
    /// address nor a mapping.
    #[cfg_attr(
        not(unix),
        expect(dead_code, reason = "the pprof crate's sampler is Unix-only")
    )]
    #[cfg_attr(
        unix,
        allow(
            dead_code,
            reason = "built where cpu/pprof_rs.rs is, not on every Linux build"
        )
    )]
    Symbolized(Vec<FunctionLine>),
}

/// A label value.
pub(crate) enum LabelValue {
    Str(String),
    Num(i64),
}

/// A sample's labels: `thread` (the thread's name), `thread_id` if given (a string:
/// `-tagfocus` matches string labels only), then `pairs` (the labels active on it).
pub(crate) fn thread_labels<'a>(
    name: &str,
    tid: Option<u32>,
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<(Cow<'static, str>, LabelValue)> {
    let mut out = vec![("thread".into(), LabelValue::Str(name.to_owned()))];
    if let Some(tid) = tid {
        out.push(("thread_id".into(), LabelValue::Str(tid.to_string())));
    }
    out.extend(
        pairs.map(|(key, value)| (key.to_owned().into(), LabelValue::Str(value.to_owned()))),
    );
    out
}

struct PendingSample {
    frames: Vec<Frame>,
    values: Vec<i64>,
    labels: Vec<(Cow<'static, str>, LabelValue)>,
}

/// What kind of profile, and when it was taken.
pub(crate) struct Meta {
    pub(crate) sample_types: &'static [(&'static str, &'static str)],
    pub(crate) period_type: (&'static str, &'static str),
    pub(crate) period: i64,
    /// When the profile's window began (`time_nanos`).
    pub(crate) time: SystemTime,
    /// How long it lasted (`duration_nanos`); zero for an instant, such as a heap dump.
    pub(crate) duration: Duration,
    pub(crate) default_sample_type: Option<&'static str>,
    /// Free-form notes `go tool pprof -comments` shows.
    pub(crate) comments: Vec<String>,
}

/// The hasher of the builder's per-frame maps: FxHash's rotate-multiply, several times
/// faster than std's SipHash on the `u64` addresses a profile is made of (tens of
/// thousands of lookups for a heap profile of a thousand stacks). Its keys come from this
/// process's own stacks, which no client chooses, so SipHash's resistance to chosen keys
/// buys nothing here.
#[derive(Clone, Copy, Default)]
pub(crate) struct FrameHasher(u64);

impl FrameHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FrameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    fn write_usize(&mut self, word: usize) {
        self.add(word as u64);
    }

    fn finish(&self) -> u64 {
        // The multiply leaves the low bits a function of the word's low bits alone, and
        // hashbrown picks a bucket by the low bits: code addresses 16 bytes apart would
        // share a sixteenth of the buckets. The high bits are well mixed; rustc-hash 2
        // rotates them down the same way.
        self.0.rotate_left(26)
    }
}

/// A map keyed by frames or addresses, with [`FrameHasher`].
pub(crate) type FrameMap<K, V> = HashMap<K, V, BuildHasherDefault<FrameHasher>>;

/// Interns strings; index 0 is the empty string, as pprof requires.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut strings = Strings::default();
        strings.get("");
        strings
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Collects samples, then symbolizes and encodes them in [`finish`](Self::finish).
pub(crate) struct ProfileBuilder<'o> {
    objects: &'o Objects,
    samples: Vec<PendingSample>,
    symbolize: Symbolize,
    /// What was symbolized before the profile was built (see [`Resolved::of`]).
    before: Resolved,
}

impl<'o> ProfileBuilder<'o> {
    pub(crate) fn new(objects: &'o Objects) -> ProfileBuilder<'o> {
        ProfileBuilder {
            objects,
            samples: Vec::new(),
            symbolize: Symbolize::Full,
            before: Resolved::default(),
        }
    }

    /// Addresses already symbolized (while a CPU profile's window was still open): only
    /// the others are looked up when the profile is built.
    pub(crate) fn resolved_before(mut self, before: Resolved) -> ProfileBuilder<'o> {
        self.before = before;
        self
    }

    /// How much to name: [`Symbolize::None`] leaves code addresses unnamed, and their
    /// mappings say so (`has_functions` false), so pprof tools symbolize them themselves.
    pub(crate) fn symbolize(mut self, symbolize: Symbolize) -> ProfileBuilder<'o> {
        self.symbolize = symbolize;
        self
    }

    pub(crate) fn add(
        &mut self,
        frames: Vec<Frame>,
        values: Vec<i64>,
        labels: Vec<(Cow<'static, str>, LabelValue)>,
    ) {
        self.samples.push(PendingSample {
            frames,
            values,
            labels,
        });
    }

    /// Symbolizes every address and builds the profile. Leading functions (leaf side) for
    /// which `hide_leaf` returns true are trimmed, as [`finish_trimmed`](Self::finish_trimmed)
    /// trims them.
    pub(crate) fn finish(self, meta: &Meta, hide_leaf: &dyn Fn(&str) -> bool) -> Profile {
        self.finish_trimmed(meta, &|lines: &[FunctionLine]| {
            lines
                .iter()
                .take_while(|line| hide_leaf(&line.name))
                .count()
        })
    }

    /// Symbolizes every address and builds the profile, each stack trimmed at its leaf:
    /// `trim` says how many of a location's lines (innermost first) to drop from the leaf
    /// end. Leading locations trimmed whole are dropped; the first location that is not
    /// loses its first lines (a location of its own, at the same address, so that other
    /// stacks through it keep all its lines); nothing further out is trimmed. If every
    /// location would go, the last stays whole. The heap profile uses this to start every
    /// stack at the allocation site, not in the allocator, whether the allocator's
    /// functions are frames of their own or inlined into the program's.
    pub(crate) fn finish_trimmed(
        mut self,
        meta: &Meta,
        trim: &dyn Fn(&[FunctionLine]) -> usize,
    ) -> Profile {
        let resolved = match self.symbolize {
            Symbolize::Full => {
                let mut resolved = std::mem::take(&mut self.before);
                let addresses: Vec<u64> = self
                    .samples
                    .iter()
                    .flat_map(|sample| &sample.frames)
                    .filter_map(|frame| match frame {
                        Frame::Code(address) if !resolved.has_tried(*address) => Some(*address),
                        _ => None,
                    })
                    .collect();
                resolved.add(self.objects, addresses);
                resolved
            }
            Symbolize::None => Resolved::default(),
        };
        let mut strings = Strings::new();
        let mut profile = Profile {
            sample_type: meta
                .sample_types
                .iter()
                .map(|(ty, unit)| ValueType {
                    ty: strings.get(ty),
                    unit: strings.get(unit),
                })
                .collect(),
            period_type: Some(ValueType {
                ty: strings.get(meta.period_type.0),
                unit: strings.get(meta.period_type.1),
            }),
            period: meta.period,
            time_nanos: nanos(meta.time.duration_since(UNIX_EPOCH).unwrap_or_default()),
            duration_nanos: nanos(meta.duration),
            default_sample_type: meta.default_sample_type.map_or(0, |t| strings.get(t)),
            comment: meta.comments.iter().map(|c| strings.get(c)).collect(),
            ..Profile::default()
        };

        let mut mapping_ids: HashMap<usize, u64> = HashMap::new();
        // A function is its name in one file: code generated from a macro elsewhere, or
        // an inlined copy whose lines DWARF puts in another file, is a function of its own
        // there, as `go tool pprof -list` shows it.
        let mut function_ids: HashMap<(String, String, String, i64), u64> = HashMap::new();
        let mut function_id =
            |profile: &mut Profile, strings: &mut Strings, named: FunctionLine| {
                *function_ids
                    .entry((
                        named.name,
                        named.system_name,
                        named.filename,
                        named.start_line,
                    ))
                    .or_insert_with_key(|(name, raw, filename, start_line)| {
                        let id = profile.function.len() as u64 + 1;
                        profile.function.push(Function {
                            id,
                            name: strings.get(name),
                            system_name: strings.get(raw),
                            filename: strings.get(filename),
                            start_line: *start_line,
                        });
                        id
                    })
            };
        // Per distinct frame, once: its location, and how many of its lines are trimmed at
        // the leaf (all of them: the location is dropped there).
        let mut known: FrameMap<Frame, (u64, Trim)> = FrameMap::default();
        // Locations with their leading lines trimmed, by the location they come from.
        let mut trimmed: FrameMap<u64, u64> = FrameMap::default();

        let ProfileBuilder {
            objects,
            samples,
            symbolize,
            ..
        } = self;
        for sample in samples {
            let mut location_id = Vec::with_capacity(sample.frames.len());
            let mut leaf_side = true;
            for (i, frame) in sample.frames.iter().enumerate() {
                let (id, trim_at_leaf) = *known.entry(frame.clone()).or_insert_with(|| {
                    let (functions, object) = describe(objects, frame, &resolved, symbolize);
                    let mapping_id = object.map_or(0, |index| {
                        *mapping_ids.entry(index).or_insert_with(|| {
                            let object = objects.get(index).expect("a known object");
                            let (memory, file_offset) = object.mapping();
                            let id = profile.mapping.len() as u64 + 1;
                            profile.mapping.push(Mapping {
                                id,
                                memory_start: memory.start,
                                memory_limit: memory.end,
                                file_offset,
                                filename: strings.get(&object.name),
                                build_id: object
                                    .build_id
                                    .as_ref()
                                    .map_or(0, |id| strings.get(&hex(id))),
                                has_functions: symbolize == Symbolize::Full,
                                // What DWARF gave, so pprof tools know they need not look
                                // for it themselves.
                                has_filenames: resolved.has_lines(object),
                                has_line_numbers: resolved.has_lines(object),
                                has_inline_frames: resolved.has_lines(object),
                            });
                            id
                        })
                    });
                    let trim_at_leaf = match trim(&functions).min(functions.len()) {
                        0 => Trim::None,
                        n if n == functions.len() => Trim::All,
                        n => Trim::Lines(n),
                    };
                    let line = functions
                        .into_iter()
                        .map(|named| Line {
                            line: named.line,
                            function_id: function_id(&mut profile, &mut strings, named),
                            column: 0,
                        })
                        .collect();
                    let id = profile.location.len() as u64 + 1;
                    profile.location.push(Location {
                        id,
                        mapping_id,
                        address: match frame {
                            Frame::Code(address) => *address,
                            Frame::Marker(_) | Frame::Symbolized(_) => 0,
                        },
                        line,
                        is_folded: false,
                    });
                    (id, trim_at_leaf)
                });
                // Trimmed frames are dropped from the leaf end, keeping at least one.
                let last = i + 1 == sample.frames.len();
                let id = match (leaf_side, trim_at_leaf) {
                    (true, Trim::All) if !last => continue,
                    (true, Trim::Lines(n)) => *trimmed.entry(id).or_insert_with(|| {
                        let from = &profile.location[id as usize - 1];
                        let location = Location {
                            id: profile.location.len() as u64 + 1,
                            line: from.line[n..].to_vec(),
                            ..from.clone()
                        };
                        profile.location.push(location);
                        profile.location.len() as u64
                    }),
                    _ => id,
                };
                leaf_side = false;
                location_id.push(id);
            }
            let label = sample
                .labels
                .into_iter()
                .map(|(key, value)| match value {
                    LabelValue::Str(s) => Label {
                        key: strings.get(&key),
                        str: strings.get(&s),
                        ..Label::default()
                    },
                    LabelValue::Num(n) => Label {
                        key: strings.get(&key),
                        num: n,
                        ..Label::default()
                    },
                })
                .collect();
            profile.sample.push(Sample {
                location_id,
                value: sample.values,
                label,
            });
        }
        profile.string_table = strings.table;
        profile
    }
}

/// How a location is trimmed where it is a stack's leaf.
#[derive(Clone, Copy)]
enum Trim {
    None,
    /// Its first lines (inlined into the rest).
    Lines(usize),
    /// The whole location.
    All,
}

/// Returns the C allocator's freed memory to the system. Symbolizing and rendering a
/// profile allocate a few megabytes for a moment, on a blocking-pool thread whose glibc
/// arena would otherwise keep them resident for the life of the process. With another
/// global allocator (jemalloc) this trims only what the C code of the process freed.
pub(crate) fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A frame's functions (innermost first) and the index of the object it lies in.
fn describe(
    objects: &Objects,
    frame: &Frame,
    resolved: &Resolved,
    symbolize: Symbolize,
) -> (Vec<FunctionLine>, Option<usize>) {
    let named = |name: &str| FunctionLine::named(name.to_owned(), name.to_owned());
    match frame {
        Frame::Marker(text) => (vec![named(text)], None),
        Frame::Symbolized(functions) => (functions.clone(), None),
        Frame::Code(address) => {
            let object = objects.find(*address);
            if symbolize == Symbolize::None {
                return (Vec::new(), object.map(|(i, _)| i));
            }
            match (resolved.functions(*address), object) {
                (Some(functions), object) => (functions.to_vec(), object.map(|(i, _)| i)),
                (None, Some((index, object))) => (
                    vec![named(&format!("[{}]", object.short_name()))],
                    Some(index),
                ),
                (None, None) => (vec![named("[unknown]")], None),
            }
        }
    }
}

/// Nanoseconds as pprof's `int64` fields hold them (saturating, some 292 years on).
fn nanos(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
