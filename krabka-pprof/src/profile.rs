//! Builds a pprof `Profile` from stacks of code addresses: symbolizes every address once
//! per object, and emits mappings (with build IDs, so Parca and `go tool pprof` can match
//! binaries), locations, functions and samples the way Go's runtime does. Shared by the
//! CPU and heap profiles.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

use crate::objects::Objects;
use crate::symbols::{self, Symbol};

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
    Symbolized(Vec<Named>),
}

/// One function of a frame: one line of its location.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Named {
    /// Demangled, as people read it.
    pub(crate) name: String,
    /// As in the symbol table.
    pub(crate) system_name: String,
    /// Empty when unknown.
    pub(crate) filename: String,
    /// 0 when unknown.
    pub(crate) line: i64,
}

/// A label value.
pub(crate) enum LabelValue {
    Str(String),
    Num(i64),
}

struct PendingSample {
    frames: Vec<Frame>,
    values: Vec<i64>,
    labels: Vec<(&'static str, LabelValue)>,
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
}

impl<'o> ProfileBuilder<'o> {
    pub(crate) fn new(objects: &'o Objects) -> ProfileBuilder<'o> {
        ProfileBuilder {
            objects,
            samples: Vec::new(),
        }
    }

    pub(crate) fn add(
        &mut self,
        frames: Vec<Frame>,
        values: Vec<i64>,
        labels: Vec<(&'static str, LabelValue)>,
    ) {
        self.samples.push(PendingSample {
            frames,
            values,
            labels,
        });
    }

    /// Symbolizes every address and builds the profile. Leading frames (leaf side) for
    /// which `hide_leaf` returns true are dropped, as long as one frame remains: the heap
    /// profile uses this to start every stack at the allocation site, not in the allocator.
    pub(crate) fn finish(self, meta: &Meta, hide_leaf: &dyn Fn(&str) -> bool) -> Profile {
        let resolved = self.symbolize();
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
        let mut function_ids: HashMap<(String, String), u64> = HashMap::new();
        let mut function_id = |profile: &mut Profile, strings: &mut Strings, named: Named| {
            *function_ids
                .entry((named.name, named.system_name))
                .or_insert_with_key(|(name, raw)| {
                    let id = profile.function.len() as u64 + 1;
                    profile.function.push(Function {
                        id,
                        name: strings.get(name),
                        system_name: strings.get(raw),
                        filename: strings.get(&named.filename),
                        ..Function::default()
                    });
                    id
                })
        };
        // Per distinct frame, once: its location, and whether it is hidden at the leaf.
        let mut known: HashMap<Frame, (u64, bool)> = HashMap::new();

        let ProfileBuilder { objects, samples } = self;
        for sample in samples {
            let mut location_id = Vec::with_capacity(sample.frames.len());
            let mut leaf_side = true;
            for (i, frame) in sample.frames.iter().enumerate() {
                let (id, hidden) = *known.entry(frame.clone()).or_insert_with(|| {
                    let (functions, object) = describe(objects, frame, &resolved);
                    let mapping_id = object.map_or(0, |index| {
                        *mapping_ids.entry(index).or_insert_with(|| {
                            let object = objects.get(index).expect("a known object");
                            let text = object.text();
                            let id = profile.mapping.len() as u64 + 1;
                            profile.mapping.push(Mapping {
                                id,
                                memory_start: text.map_or(object.range.start, |t| t.avma.start),
                                memory_limit: text.map_or(object.range.end, |t| t.avma.end),
                                file_offset: text.map_or(0, |t| t.file_offset),
                                filename: strings.get(&object.name),
                                build_id: object
                                    .build_id
                                    .as_ref()
                                    .map_or(0, |id| strings.get(&hex(id))),
                                has_functions: true,
                                ..Mapping::default()
                            });
                            id
                        })
                    });
                    // The outermost function is the frame's own; the others were inlined
                    // into it.
                    let hidden = functions.last().is_some_and(|f| hide_leaf(&f.name));
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
                    (id, hidden)
                });
                // Hidden frames are dropped from the leaf end, keeping at least one.
                let last = i + 1 == sample.frames.len();
                if leaf_side && hidden && !last {
                    continue;
                }
                leaf_side = false;
                location_id.push(id);
            }
            let label = sample
                .labels
                .into_iter()
                .map(|(key, value)| match value {
                    LabelValue::Str(s) => Label {
                        key: strings.get(key),
                        str: strings.get(&s),
                        ..Label::default()
                    },
                    LabelValue::Num(n) => Label {
                        key: strings.get(key),
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

    /// Every code address's symbol, reading each object's tables once.
    fn symbolize(&self) -> HashMap<u64, Symbol> {
        let mut by_object: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for sample in &self.samples {
            for frame in &sample.frames {
                if let Frame::Code(address) = frame
                    && let Some((index, object)) = self.objects.find(*address)
                {
                    by_object
                        .entry(index)
                        .or_default()
                        .push(address - object.bias);
                }
            }
        }
        let mut resolved = HashMap::new();
        for (index, mut addresses) in by_object {
            addresses.sort_unstable();
            addresses.dedup();
            let object = self.objects.get(index).expect("a known object");
            for (address, symbol) in addresses.iter().zip(symbols::resolve(object, &addresses)) {
                if let Some(symbol) = symbol {
                    resolved.insert(address + object.bias, symbol);
                }
            }
        }
        resolved
    }
}

/// A frame's functions (innermost first) and the index of the object it lies in.
fn describe(
    objects: &Objects,
    frame: &Frame,
    resolved: &HashMap<u64, Symbol>,
) -> (Vec<Named>, Option<usize>) {
    let named = |name: &str, system_name: &str| Named {
        name: name.to_owned(),
        system_name: system_name.to_owned(),
        filename: String::new(),
        line: 0,
    };
    match frame {
        Frame::Marker(text) => (vec![named(text, text)], None),
        Frame::Symbolized(functions) => (functions.clone(), None),
        Frame::Code(address) => {
            let object = objects.find(*address);
            match (resolved.get(address), object) {
                (Some(symbol), object) => (
                    vec![named(&symbol.name, &symbol.raw)],
                    object.map(|(i, _)| i),
                ),
                (None, Some((index, object))) => {
                    let name = format!("[{}]", object.short_name());
                    (vec![named(&name, &name)], Some(index))
                }
                (None, None) => (vec![named("[unknown]", "[unknown]")], None),
            }
        }
    }
}

/// Nanoseconds as pprof's `int64` fields hold them (saturating, some 292 years on).
fn nanos(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::{Frame, LabelValue, Meta, Named, ProfileBuilder};
    use crate::objects::Objects;

    fn named(name: &str, filename: &str, line: i64) -> Named {
        Named {
            name: name.to_owned(),
            system_name: format!("_ZN{name}E"),
            filename: filename.to_owned(),
            line,
        }
    }

    fn meta() -> Meta {
        Meta {
            sample_types: &[("samples", "count")],
            period_type: ("cpu", "nanoseconds"),
            period: 1,
            time: std::time::UNIX_EPOCH,
            duration: std::time::Duration::ZERO,
            default_sample_type: None,
            comments: Vec::new(),
        }
    }

    #[test]
    fn a_symbolized_frame_is_one_location_with_a_line_per_inlined_function() {
        let objects = Objects::current();
        let mut builder = ProfileBuilder::new(&objects);
        let leaf = Frame::Symbolized(vec![
            named("inner", "src/a.rs", 7),
            named("outer", "src/b.rs", 42),
        ]);
        let caller = Frame::Symbolized(vec![named("main", "src/main.rs", 3)]);
        for _ in 0..2 {
            builder.add(
                vec![leaf.clone(), caller.clone()],
                vec![5],
                vec![("thread", LabelValue::Str("worker".into()))],
            );
        }
        let profile = builder.finish(&meta(), &|_| false);
        let string = |i: i64| profile.string_table[i as usize].as_str();

        assert_eq!(profile.location.len(), 2, "one location per distinct frame");
        assert_eq!(profile.sample.len(), 2);
        assert_eq!(profile.sample[0].location_id, profile.sample[1].location_id);
        let location = &profile.location[0];
        let lines: Vec<(&str, &str, &str, i64)> = location
            .line
            .iter()
            .map(|line| {
                let function = &profile.function[line.function_id as usize - 1];
                (
                    string(function.name),
                    string(function.system_name),
                    string(function.filename),
                    line.line,
                )
            })
            .collect();
        assert_eq!(
            lines,
            [
                ("inner", "_ZNinnerE", "src/a.rs", 7),
                ("outer", "_ZNouterE", "src/b.rs", 42)
            ],
            "innermost first, the caller it was inlined into last"
        );
        assert_eq!(profile.function.len(), 3);
    }

    #[test]
    fn hiding_a_leaf_looks_at_the_frames_own_function_not_what_was_inlined_into_it() {
        let objects = Objects::current();
        let mut builder = ProfileBuilder::new(&objects);
        let allocator = Frame::Symbolized(vec![named("helper", "", 0), named("malloc", "", 0)]);
        let site = Frame::Symbolized(vec![named("site", "", 0)]);
        builder.add(vec![allocator, site.clone()], vec![1], Vec::new());
        // malloc inlined into the program's own function: that frame is the program's.
        let inlined = Frame::Symbolized(vec![named("malloc", "", 0), named("caller", "", 0)]);
        builder.add(vec![inlined, site], vec![1], Vec::new());
        let profile = builder.finish(&meta(), &|name| name == "malloc");
        assert_eq!(
            profile.sample[0].location_id.len(),
            1,
            "malloc's frame hidden"
        );
        let kept = &profile.location[profile.sample[0].location_id[0] as usize - 1];
        let function = &profile.function[kept.line[0].function_id as usize - 1];
        assert_eq!(profile.string_table[function.name as usize], "site");
        assert_eq!(
            profile.sample[1].location_id.len(),
            2,
            "a frame whose own function is not malloc is kept, whatever was inlined into it"
        );
    }
}
