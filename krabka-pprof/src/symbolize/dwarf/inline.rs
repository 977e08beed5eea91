//! Inline trees: for each wanted address, the function DIEs that contain it (the
//! subprogram, then each call inlined into it), their names followed through
//! `DW_AT_abstract_origin` and `DW_AT_specification` (across units too, as LTO writes
//! them), and the chain turned into an address's functions, innermost first.
//!
//! A crafted file costs bounded memory here: a DIE's range list, however long, is kept
//! as at most as many spans as there are addresses; a chain is at most [`MAX_LEVELS`]
//! deep, a sibling replacing its sibling; and one unit's walk places at most
//! [`MAX_LEVELS`] functions per address before it stops.

use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

use gimli::{AttributeValue, DebugInfoOffset, Reader as _, Section as _, UnitOffset, UnitRef};

use super::rows::{Row, program_file};
use super::sections::{Dwarf, Reader, Unit};
use super::units::span;
use crate::symbolize::names::{FunctionLine, demangle};

/// The most functions at one address: the deepest inline chains of Rust release builds
/// are a few dozen (the benchmark's service: 16).
pub(crate) const MAX_LEVELS: usize = 128;

/// The most other units [`Origins`] keeps parsed at once.
const MAX_UNITS_KEPT: usize = 64;

/// A function's name and where it is declared, as its DIE (or the DIEs it refers to,
/// through `DW_AT_abstract_origin` and `DW_AT_specification`) states it.
#[derive(Clone, Debug, Default)]
struct Origin {
    raw: String,
    decl: Option<(String, i64)>,
}

/// A function DIE whose code holds one of the wanted addresses: a subprogram, or a call
/// inlined into one.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    /// The DIE's depth in its unit's tree.
    depth: isize,
    origin: Rc<Origin>,
    /// Where the inlined call is, in the function it was inlined into.
    call: Option<Row>,
}

/// Names already looked up in this request, by the DIE's offset in `.debug_info`:
/// inlined calls of one function share its abstract DIE.
pub(crate) struct Origins<'d> {
    known: HashMap<DebugInfoOffset, Origin>,
    /// Start offsets of every unit, read once if a DIE refers to another unit.
    unit_starts: Option<Vec<DebugInfoOffset>>,
    /// Units other units' DIEs referred to, parsed once: in a release build most inlined
    /// functions are declared in another unit of their crate.
    units: HashMap<DebugInfoOffset, Rc<Unit<'d>>>,
}

/// For each of `at` (sorted), the function DIEs containing it, outermost first: the
/// subprogram, then each inlined call in it, nesting inwards. Subtrees whose ranges hold
/// none of `at` are skipped without reading their attributes' values, and the walk ends
/// once the `expected` addresses (those the line program covers) each have their
/// subprogram, read to its end.
pub(crate) fn inline_chains<'d>(
    unit: UnitRef<'_, Reader<'d>>,
    at: &[u64],
    expected: &[bool],
    origins: &mut Origins<'d>,
) -> Option<Vec<Vec<Scope>>> {
    let mut chains: Vec<Vec<Scope>> = vec![Vec::new(); at.len()];
    let mut unplaced = expected.iter().filter(|e| **e).count();
    // Honest DWARF places each address in one function per level of its chain.
    let mut placements_left = at.len().saturating_mul(MAX_LEVELS);
    let mut entries = unit.entries_raw(None).ok()?;
    // While set, DIEs deeper than this are inside a function that holds none of `at`.
    let mut skip_deeper_than: Option<isize> = None;
    // The depth of the last subprogram that held some of `at`.
    let mut last_hit: Option<isize> = None;
    while !entries.is_empty() {
        let depth = entries.next_depth();
        if unplaced == 0 && last_hit.is_none_or(|hit| depth <= hit) {
            break;
        }
        let abbrev = entries.read_abbreviation().ok()?;
        let Some(abbrev) = abbrev else {
            continue;
        };
        if let Some(limit) = skip_deeper_than {
            if depth > limit {
                entries.skip_attributes(abbrev.attributes()).ok()?;
                continue;
            }
            skip_deeper_than = None;
        }
        let tag = abbrev.tag();
        if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
            entries.skip_attributes(abbrev.attributes()).ok()?;
            continue;
        }
        let mut die = Die::default();
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec).ok()?;
            die.read(unit, attr);
        }
        let hits = die.hits(unit, at);
        if hits.is_empty() {
            skip_deeper_than = Some(depth);
            continue;
        }
        placements_left = placements_left.checked_sub(hits.len())?;
        let origin = Rc::new(die.origin(unit, origins));
        let call = (tag == gimli::DW_TAG_inlined_subroutine).then(|| {
            let file = die
                .call_file
                .and_then(|file| program_file(unit, file))
                .unwrap_or_default();
            (file, die.call_line)
        });
        if tag == gimli::DW_TAG_subprogram {
            last_hit = Some(depth);
            unplaced -= hits
                .iter()
                .filter(|&&i| expected.get(i).copied().unwrap_or(false) && chains[i].is_empty())
                .count()
                .min(unplaced);
        }
        // Depth-first order: a DIE comes before those nested in it, so each chain grows
        // outwards in; a DIE no deeper than the chain's last ends that one's part.
        for i in hits {
            let chain = &mut chains[i];
            while chain.last().is_some_and(|scope| scope.depth >= depth) {
                chain.pop();
            }
            if chain.len() < MAX_LEVELS {
                chain.push(Scope {
                    depth,
                    origin: origin.clone(),
                    call: call.clone(),
                });
            }
        }
    }
    Some(chains)
}

/// The attributes of a function DIE this module reads.
#[derive(Default)]
struct Die<'a> {
    low_pc: Option<u64>,
    high_pc: Option<u64>,
    size: Option<u64>,
    ranges: Option<gimli::RangeListsOffset<usize>>,
    linkage_name: Option<AttributeValue<Reader<'a>>>,
    name: Option<AttributeValue<Reader<'a>>>,
    refers_to: Option<AttributeValue<Reader<'a>>>,
    decl_file: Option<u64>,
    decl_line: i64,
    call_file: Option<u64>,
    call_line: i64,
}

impl<'a> Die<'a> {
    fn read(&mut self, unit: UnitRef<'_, Reader<'a>>, attr: gimli::Attribute<Reader<'a>>) {
        let value = attr.value();
        match attr.name() {
            gimli::DW_AT_low_pc => self.low_pc = unit.attr_address(value).ok().flatten(),
            gimli::DW_AT_high_pc => match value {
                AttributeValue::Udata(size) => self.size = Some(size),
                value => self.high_pc = unit.attr_address(value).ok().flatten(),
            },
            gimli::DW_AT_ranges => self.ranges = unit.attr_ranges_offset(value).ok().flatten(),
            // Names are read only for the functions that hold a wanted address.
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                self.linkage_name = Some(value);
            }
            gimli::DW_AT_name => self.name = Some(value),
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                self.refers_to = Some(value);
            }
            gimli::DW_AT_decl_file => self.decl_file = file_index(unit.header.version(), value),
            gimli::DW_AT_decl_line => self.decl_line = line_number(&attr),
            gimli::DW_AT_call_file => self.call_file = file_index(unit.header.version(), value),
            gimli::DW_AT_call_line => self.call_line = line_number(&attr),
            _ => {}
        }
    }

    /// The indexes of `at` inside this DIE's code, sorted.
    fn hits(&self, unit: UnitRef<'_, Reader<'a>>, at: &[u64]) -> Vec<usize> {
        let mut spans: Vec<Range<usize>> = Vec::new();
        if let Some(offset) = self.ranges {
            let mut list = SpanList::new(at.len());
            if let Ok(mut ranges) = unit.ranges(offset) {
                while let Ok(Some(range)) = ranges.next() {
                    list.push(span(at, range.begin, range.end));
                }
            }
            spans = list.merged();
        } else if let Some(low) = self.low_pc {
            let high = self
                .high_pc
                .or_else(|| self.size.map(|size| low.saturating_add(size)));
            if let Some(high) = high {
                spans.push(span(at, low, high));
            }
        }
        spans.into_iter().flatten().collect()
    }

    /// The DIE's own name: its linkage name, else its plain name; and whether it was the
    /// linkage name. Names in the string sections are read without keeping their blocks
    /// (`Paged::string_at`).
    fn own_name(&self, unit: UnitRef<'_, Reader<'a>>) -> (String, bool) {
        let string = |value: AttributeValue<Reader<'a>>| match value {
            AttributeValue::DebugStrRef(offset) => {
                unit.dwarf.debug_str.reader().string_at(offset.0)
            }
            AttributeValue::DebugStrOffsetsIndex(index) => {
                let offset = unit.string_offset(index).ok()?;
                unit.dwarf.debug_str.reader().string_at(offset.0)
            }
            AttributeValue::DebugLineStrRef(offset) => {
                unit.dwarf.debug_line_str.reader().string_at(offset.0)
            }
            value => {
                let name = unit.attr_string(value).ok()?;
                Some(name.to_string_lossy().ok()?.into_owned())
            }
        };
        if let Some(name) = self.linkage_name.and_then(string) {
            return (name, true);
        }
        (self.name.and_then(string).unwrap_or_default(), false)
    }

    /// The function's name and declaration, following the DIEs it refers to.
    fn origin(&self, unit: UnitRef<'_, Reader<'a>>, origins: &mut Origins<'a>) -> Origin {
        let (raw, has_linkage_name) = self.own_name(unit);
        let mut origin = Origin {
            raw,
            decl: self.decl(unit),
        };
        if !has_linkage_name && let Some(refers_to) = self.refers_to {
            let referred = origins.follow(unit, refers_to, 16);
            if !referred.raw.is_empty() {
                origin.raw = referred.raw;
            }
            origin.decl = origin.decl.or(referred.decl);
        }
        origin
    }

    fn decl(&self, unit: UnitRef<'_, Reader<'a>>) -> Option<(String, i64)> {
        let file = program_file(unit, self.decl_file?)?;
        Some((file, self.decl_line))
    }
}

impl<'d> Origins<'d> {
    pub(crate) fn new() -> Origins<'d> {
        Origins {
            known: HashMap::new(),
            unit_starts: None,
            units: HashMap::new(),
        }
    }

    /// The name and declaration of the DIE `value` refers to, looked up once per request.
    fn follow(
        &mut self,
        unit: UnitRef<'_, Reader<'d>>,
        value: AttributeValue<Reader<'d>>,
        limit: u32,
    ) -> Origin {
        if limit == 0 {
            return Origin::default();
        }
        match value {
            AttributeValue::UnitRef(offset) => {
                let Some(at) = offset.to_debug_info_offset(&unit.header) else {
                    return Origin::default();
                };
                if let Some(known) = self.known.get(&at) {
                    return known.clone();
                }
                let origin = self.read(unit, offset, limit);
                self.known.insert(at, origin.clone());
                origin
            }
            AttributeValue::DebugInfoRef(at) => {
                if let Some(known) = self.known.get(&at) {
                    return known.clone();
                }
                let origin = self
                    .read_elsewhere(unit.dwarf, at, limit)
                    .unwrap_or_default();
                self.known.insert(at, origin.clone());
                origin
            }
            _ => Origin::default(),
        }
    }

    /// A DIE in another unit: LTO's merged modules refer across units.
    fn read_elsewhere(
        &mut self,
        dwarf: &Dwarf<'d>,
        at: DebugInfoOffset,
        limit: u32,
    ) -> Option<Origin> {
        let starts = self
            .unit_starts
            .get_or_insert_with(|| dwarf.debug_info.reader().unit_starts().unwrap_or_default());
        let start = *starts.get(starts.partition_point(|s| *s <= at).checked_sub(1)?)?;
        let unit = match self.units.get(&start) {
            Some(unit) => unit.clone(),
            None => {
                let header = dwarf.debug_info.header_from_offset(start).ok()?;
                let unit = Rc::new(dwarf.unit(header).ok()?);
                if self.units.len() >= MAX_UNITS_KEPT {
                    self.units.clear();
                }
                self.units.insert(start, unit.clone());
                unit
            }
        };
        let offset = UnitOffset(at.0.checked_sub(start.0)?);
        Some(self.read(UnitRef::new(dwarf, &unit), offset, limit))
    }

    fn read(&mut self, unit: UnitRef<'_, Reader<'d>>, offset: UnitOffset, limit: u32) -> Origin {
        let Ok(mut entries) = unit.entries_raw(Some(offset)) else {
            return Origin::default();
        };
        let Ok(Some(abbrev)) = entries.read_abbreviation() else {
            return Origin::default();
        };
        let mut die = Die::default();
        for spec in abbrev.attributes() {
            let Ok(attr) = entries.read_attribute(*spec) else {
                return Origin::default();
            };
            die.read(unit, attr);
        }
        let (raw, has_linkage_name) = die.own_name(unit);
        let mut origin = Origin {
            raw,
            decl: die.decl(unit),
        };
        if !has_linkage_name && let Some(refers_to) = die.refers_to {
            let referred = self.follow(unit, refers_to, limit - 1);
            if !referred.raw.is_empty() {
                origin.raw = referred.raw;
            }
            origin.decl = origin.decl.or(referred.decl);
        }
        origin
    }
}

/// The spans of a DIE's range list that hold wanted addresses, gathered as the list is
/// read: merged whenever they pass `2 * addresses + 8`, so that a list however long keeps
/// no more than that between two spans (merged, the spans are disjoint and each holds an
/// address: never more than there are addresses), and is sorted no more often than once
/// per `addresses + 9` spans.
struct SpanList {
    spans: Vec<Range<usize>>,
    addresses: usize,
}

impl SpanList {
    fn new(addresses: usize) -> SpanList {
        SpanList {
            spans: Vec::new(),
            addresses,
        }
    }

    /// Adds `span` (indexes of addresses), unless it holds none.
    fn push(&mut self, span: Range<usize>) {
        if span.is_empty() {
            return;
        }
        self.spans.push(span);
        if self.spans.len() > 2 * self.addresses + 8 {
            merge(&mut self.spans);
        }
    }

    /// The spans, sorted, those that overlap or touch joined.
    fn merged(mut self) -> Vec<Range<usize>> {
        merge(&mut self.spans);
        self.spans
    }
}

/// Sorts `spans` and joins those that overlap or touch.
fn merge(spans: &mut Vec<Range<usize>>) {
    spans.sort_unstable_by_key(|span| span.start);
    let mut joined: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans.drain(..) {
        match joined.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => joined.push(span),
        }
    }
    *spans = joined;
}

/// A file index attribute of a unit of DWARF `version`, where DWARF 4's index 0 means "no
/// file" and DWARF 5's does not.
fn file_index<R: gimli::Reader>(version: u16, value: AttributeValue<R>) -> Option<u64> {
    match value {
        AttributeValue::FileIndex(index) if index > 0 || version >= 5 => Some(index),
        _ => None,
    }
}

fn line_number(attr: &gimli::Attribute<Reader<'_>>) -> i64 {
    attr.udata_value()
        .and_then(|line| i64::try_from(line).ok())
        .unwrap_or(0)
}

/// An address's functions, innermost first: the innermost function at the line-table row,
/// and each function it was inlined into at the call's line. Names are DWARF's (the
/// linkage name demangled where there is one); the symbol table may rename the outermost
/// (`symbolize.rs`).
pub(crate) fn functions(chain: &[Scope], row: Option<Row>) -> Vec<FunctionLine> {
    if chain.is_empty() {
        // Lines without a function DIE (assembly, line-tables-only C): the line alone,
        // for the function the symbol table names.
        return row
            .map(|(filename, line)| {
                vec![FunctionLine {
                    name: String::new(),
                    system_name: String::new(),
                    filename,
                    line,
                    start_line: 0,
                }]
            })
            .unwrap_or_default();
    }
    let mut functions = Vec::with_capacity(chain.len());
    let mut at = row.unwrap_or_default();
    for scope in chain.iter().rev() {
        let (mut filename, line) = at;
        // Line 0 (code the compiler made up) says nothing of its file: the function's own
        // file is named instead, so the function stays one function of one file.
        if (line == 0 || filename.is_empty())
            && let Some((file, _)) = &scope.origin.decl
        {
            filename.clone_from(file);
        }
        let start_line = match &scope.origin.decl {
            Some((file, line)) if *file == filename => *line,
            _ => 0,
        };
        let raw = &scope.origin.raw;
        functions.push(FunctionLine {
            name: if raw.is_empty() {
                String::new()
            } else {
                demangle(raw)
            },
            system_name: raw.clone(),
            filename,
            line,
            start_line,
        });
        at = scope.call.clone().unwrap_or_default();
    }
    functions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_sorted_and_those_that_overlap_or_touch_are_joined() {
        let mut spans = vec![7..9, 0..2, 2..3, 5..6, 8..12, 20..21];
        merge(&mut spans);
        assert_eq!(spans, [0..3, 5..6, 7..12, 20..21]);
        let mut apart = vec![4..5, 0..1];
        merge(&mut apart);
        assert_eq!(apart, [0..1, 4..5]);
    }

    #[test]
    fn a_long_range_list_keeps_at_most_its_bound_and_is_merged_only_past_it() {
        // Three addresses: a bound of 14 spans. Two spans that cannot be joined, over and
        // over (a crafted list is as long as it likes), and spans that hold no address.
        let mut list = SpanList::new(3);
        let mut longest = 0;
        for i in 0..1000 {
            list.push(if i % 2 == 0 { 0..1 } else { 2..3 });
            list.push(5..5);
            longest = longest.max(list.spans.len());
            assert!(list.spans.len() <= 14, "{} spans kept", list.spans.len());
        }
        assert_eq!(longest, 14, "sorted only once past its bound, not before");
        assert_eq!(
            list.merged(),
            [0..1, 2..3],
            "and none that holds no address"
        );
    }

    #[test]
    fn file_index_0_is_no_file_before_dwarf_5() {
        type Value = AttributeValue<gimli::EndianSlice<'static, gimli::LittleEndian>>;
        for (version, index, file) in [
            (2, 0, None),
            (4, 0, None),
            (4, 1, Some(1)),
            (4, 7, Some(7)),
            (5, 0, Some(0)),
            (5, 3, Some(3)),
        ] {
            assert_eq!(
                file_index(version, Value::FileIndex(index)),
                file,
                "DWARF {version}, index {index}"
            );
        }
        assert_eq!(file_index(5, Value::Udata(1)), None, "not a file index");
    }

    fn scope(
        depth: isize,
        raw: &str,
        decl: Option<(&str, i64)>,
        call: Option<(&str, i64)>,
    ) -> Scope {
        Scope {
            depth,
            origin: Rc::new(Origin {
                raw: raw.to_owned(),
                decl: decl.map(|(file, line)| (file.to_owned(), line)),
            }),
            call: call.map(|(file, line)| (file.to_owned(), line)),
        }
    }

    /// A chain (outermost first) read out innermost first: each function at the line of
    /// the call in it, the innermost at the row's; a function's first line only where its
    /// declaration is in the file the line is in; line 0 or no file named by the
    /// declaration's file.
    #[test]
    fn a_chain_gives_each_function_its_line_and_its_first_line_where_files_agree() {
        let chain = [
            scope(1, "outer", Some(("src/main.rs", 10)), None),
            scope(
                2,
                "middle",
                Some(("src/lib.rs", 40)),
                Some(("src/main.rs", 12)),
            ),
            scope(
                3,
                "_ZN5inner17h0123456789abcdefE",
                Some(("src/inner.rs", 5)),
                Some(("src/other.rs", 44)),
            ),
        ];
        let lines: Vec<(String, String, i64, i64)> =
            functions(&chain, Some(("src/inner.rs".into(), 7)))
                .into_iter()
                .map(|f| (f.name, f.filename, f.line, f.start_line))
                .collect();
        assert_eq!(
            lines,
            [
                ("inner".to_owned(), "src/inner.rs".to_owned(), 7, 5),
                ("middle".to_owned(), "src/other.rs".to_owned(), 44, 0),
                ("outer".to_owned(), "src/main.rs".to_owned(), 12, 10),
            ]
        );
        // Line 0, or a row without a file: the function's own file, its first line.
        for row in [("src/elsewhere.rs".to_owned(), 0), (String::new(), 9)] {
            let made_up = functions(&chain[..1], Some(row.clone()));
            assert_eq!(
                (
                    made_up[0].filename.as_str(),
                    made_up[0].line,
                    made_up[0].start_line
                ),
                ("src/main.rs", row.1, 10),
                "{row:?}"
            );
        }
        // A line in a file of its own keeps it, and no first line of another file.
        let own = functions(&chain[..1], Some(("src/elsewhere.rs".into(), 3)));
        assert_eq!(
            (own[0].filename.as_str(), own[0].start_line),
            ("src/elsewhere.rs", 0)
        );
    }
}
