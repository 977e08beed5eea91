//! Builds a pprof `Profile` (the prost message in `profile/proto.rs`) from stacks of code
//! addresses: has every address symbolized once (`crate::symbolize`), and emits mappings
//! (with build IDs, so Parca and `go tool pprof` can match binaries), locations,
//! functions and samples the way Go's runtime does. Shared by the CPU and heap profiles
//! and the thread dump.

use std::borrow::Cow;
use std::collections::HashMap;
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

    /// Symbolizes every address and builds the profile. Leading frames (leaf side) for
    /// which `hide_leaf` returns true are dropped, as long as one frame remains: the heap
    /// profile uses this to start every stack at the allocation site, not in the allocator.
    pub(crate) fn finish(mut self, meta: &Meta, hide_leaf: &dyn Fn(&str) -> bool) -> Profile {
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
        // Per distinct frame, once: its location, and whether it is hidden at the leaf.
        let mut known: HashMap<Frame, (u64, bool)> = HashMap::new();

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
                let (id, hidden) = *known.entry(frame.clone()).or_insert_with(|| {
                    let (functions, object) = describe(objects, frame, &resolved, symbolize);
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
mod tests {
    use super::{Frame, LabelValue, Meta, ProfileBuilder};
    use crate::objects::Objects;
    use crate::symbolize::FunctionLine;

    fn named(name: &str, filename: &str, line: i64) -> FunctionLine {
        FunctionLine {
            name: name.to_owned(),
            system_name: format!("_ZN{name}E"),
            filename: filename.to_owned(),
            line,
            start_line: 0,
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
                vec![("thread".into(), LabelValue::Str("worker".into()))],
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

    /// A profile of one stack: this function's code, as `objects` names it.
    #[cfg(elf)]
    fn profile_here(objects: &Objects, symbolize: crate::symbolize::Symbolize) -> super::Profile {
        let here = a_function_named_by_its_symbol as *const () as u64;
        let mut builder = ProfileBuilder::new(objects).symbolize(symbolize);
        builder.add(vec![Frame::Code(here + 4)], vec![1], Vec::new());
        builder.finish(&meta(), &|_| false)
    }

    #[inline(never)]
    fn a_function_named_by_its_symbol() -> u64 {
        std::hint::black_box(7u64).wrapping_mul(std::hint::black_box(6))
    }

    /// Each line of each location: function name, file, line.
    fn lines_of(profile: &super::Profile) -> Vec<Vec<(String, String, i64)>> {
        let string = |i: i64| profile.string_table[i as usize].clone();
        profile
            .location
            .iter()
            .map(|location| {
                location
                    .line
                    .iter()
                    .map(|line| {
                        let function = &profile.function[line.function_id as usize - 1];
                        (string(function.name), string(function.filename), line.line)
                    })
                    .collect()
            })
            .collect()
    }

    #[cfg(elf)]
    #[test]
    fn without_dwarf_a_frame_has_the_symbol_tables_name_and_with_it_the_same_name_and_a_line() {
        use crate::symbolize::dwarf::tests::{Scratch, as_if_loaded_from, split};

        let objects = Objects::current();
        let here = a_function_named_by_its_symbol as *const () as u64;
        let (index, object) = objects.find(here).unwrap();
        let symbol = crate::symbolize::symbol_of(object, &[here + 4 - object.bias])[0]
            .clone()
            .expect("the symbol table names it");

        let scratch = Scratch::new("profile");
        let (stripped, _debug) = split(&scratch.0);
        let without = objects.with(index, as_if_loaded_from(object, &stripped));
        let profile = profile_here(&without, crate::symbolize::Symbolize::Full);
        assert_eq!(
            lines_of(&profile),
            [[(symbol.name.clone(), String::new(), 0)]],
            "no DWARF: the symbol table's name, as before lines existed"
        );
        let mapping = &profile.mapping[0];
        assert!(mapping.has_functions);
        assert!(!mapping.has_line_numbers && !mapping.has_filenames && !mapping.has_inline_frames);

        let profile = profile_here(&objects, crate::symbolize::Symbolize::Full);
        let lines = lines_of(&profile);
        let (name, file, line) = lines[0].last().unwrap().clone();
        assert_eq!(name, symbol.name, "DWARF changes no name");
        assert!(file.ends_with("krabka-pprof/src/profile.rs"), "{file}");
        assert!(line > 0, "{lines:?}");
        let function = profile.function.last().unwrap();
        assert!(function.start_line > 0, "{function:?}");
        assert_eq!(
            profile.string_table[function.system_name as usize], symbol.raw,
            "the system name stays the symbol's"
        );
        let mapping = &profile.mapping[0];
        assert!(mapping.has_line_numbers && mapping.has_filenames && mapping.has_inline_frames);
    }

    #[cfg(elf)]
    #[test]
    fn symbolize_none_keeps_addresses_and_mappings_and_names_nothing() {
        let objects = Objects::current();
        let here = a_function_named_by_its_symbol as *const () as u64;
        let (_, object) = objects.find(here).unwrap();
        let mut builder =
            ProfileBuilder::new(&objects).symbolize(crate::symbolize::Symbolize::None);
        builder.add(
            vec![Frame::Code(here + 4), Frame::Marker("[truncated]".into())],
            vec![1],
            Vec::new(),
        );
        let profile = builder.finish(&meta(), &|_| false);
        let code = &profile.location[0];
        assert_eq!(code.address, here + 4);
        assert!(code.line.is_empty(), "{code:?}");
        let mapping = &profile.mapping[code.mapping_id as usize - 1];
        assert!(!mapping.has_functions);
        assert!(!mapping.has_line_numbers);
        assert_eq!(profile.string_table[mapping.filename as usize], object.name);
        assert!(object.build_id.is_some() && mapping.build_id != 0);
        // The profiler's own markers are not code: they keep their text.
        assert_eq!(
            lines_of(&profile)[1],
            [("[truncated]".to_owned(), String::new(), 0)]
        );
        assert_eq!(profile.function.len(), 1, "only the marker is a function");
    }

    #[cfg(elf)]
    #[test]
    fn addresses_symbolized_early_give_the_profile_they_would_have_given_late() {
        let objects = Objects::current();
        let here = a_function_named_by_its_symbol as *const () as u64;
        let getpid = libc::getpid as *const () as u64;
        let stacks = [
            vec![Frame::Code(here + 4), Frame::Code(getpid)],
            vec![Frame::Code(here + 8), Frame::Marker("[truncated]".into())],
        ];
        let build = |before: Option<crate::symbolize::Resolved>| {
            let mut builder = ProfileBuilder::new(&objects);
            if let Some(before) = before {
                builder = builder.resolved_before(before);
            }
            for stack in &stacks {
                builder.add(stack.clone(), vec![1], Vec::new());
            }
            builder.finish(&meta(), &|_| false)
        };
        let late = build(None);
        // Some addresses looked up before the profile is built (as a window does a fifth
        // of the way before its end), the others when it is.
        let early = build(Some(crate::symbolize::Resolved::of(
            &objects,
            vec![here + 4, getpid],
        )));
        assert_eq!(lines_of(&early), lines_of(&late));
        let own = lines_of(&late)[0].last().cloned().unwrap();
        assert!(own.1.ends_with("krabka-pprof/src/profile.rs"), "{own:?}");
        let flags = |profile: &super::Profile| -> Vec<(u64, bool, bool, bool)> {
            profile
                .mapping
                .iter()
                .map(|m| {
                    (
                        m.memory_start,
                        m.has_functions,
                        m.has_line_numbers,
                        m.has_inline_frames,
                    )
                })
                .collect()
        };
        assert_eq!(flags(&early), flags(&late));
        assert_eq!(late.location.len(), early.location.len());
    }
}
