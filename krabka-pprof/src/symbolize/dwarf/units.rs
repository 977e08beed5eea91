//! Which compilation unit holds each wanted address: `.debug_aranges` where the file
//! has it, else each unit's own ranges read from its root DIE alone; and [`Unplaced`],
//! the addresses still without one, which every range placed skips in near-constant
//! time, however many ranges a file claims.

use std::collections::BTreeMap;
use std::ops::Range;

use gimli::{AttributeValue, DebugInfoOffset};

use super::sections::{Dwarf, Reader};

/// The compilation unit holding each address, with the indexes of its addresses: from
/// `.debug_aranges` where the file has it (rustc and gcc write it), else from each unit's
/// own ranges (clang writes none by default).
///
/// Where the file has `.debug_aranges`, the units it leaves out are not looked at: in a
/// Rust binary they are the thousands of units that hold only generic code inlined
/// elsewhere (1,275 of 1,655 in the benchmark's service, one of which has code: a C file
/// of compiler-builtins built by clang). Reading each one's first DIE to find that out
/// took 15 ms and made some 10 MB of the file resident, for every profile that holds an
/// address no unit covers (`_start`, a PLT stub); such code keeps its symbol-table name.
///
/// `between` runs after each set of `.debug_aranges` and each unit looked at, when no
/// reader is reading: `dwarf.rs` gives back there what has been read.
pub(crate) fn units_of(
    dwarf: &Dwarf<'_>,
    addresses: &[u64],
    between: &mut dyn FnMut(),
) -> BTreeMap<DebugInfoOffset, Vec<usize>> {
    let mut unit_of: Vec<Option<DebugInfoOffset>> = vec![None; addresses.len()];
    let mut unplaced = Unplaced::new(addresses.len());
    let mut any_listed = false;
    let mut headers = dwarf.debug_aranges.headers();
    while let Ok(Some(header)) = headers.next() {
        let offset = header.debug_info_offset();
        any_listed = true;
        let mut entries = header.entries();
        while let Ok(Some(entry)) = entries.next() {
            let range = entry.range();
            unplaced.place_in(span(addresses, range.begin, range.end), |i| {
                unit_of[i] = Some(offset);
            });
        }
        between();
    }
    if !any_listed {
        let mut headers = dwarf.units();
        while let Ok(Some(header)) = headers.next() {
            let Some(offset) = header.debug_info_offset() else {
                continue;
            };
            let mut place = |begin: u64, end: u64| {
                unplaced.place_in(span(addresses, begin, end), |i| {
                    unit_of[i] = Some(offset);
                });
            };
            match root_ranges(dwarf, &header, &mut place) {
                Some(()) => {}
                // Ranges this reading cannot place (DWARF 5's indexed forms): the unit's
                // own, read in full.
                None => {
                    let Ok(unit) = dwarf.unit(header) else {
                        continue;
                    };
                    let Ok(mut ranges) = dwarf.unit_ranges(&unit) else {
                        continue;
                    };
                    while let Ok(Some(range)) = ranges.next() {
                        place(range.begin, range.end);
                    }
                }
            }
            between();
            if unplaced.none_left() {
                break;
            }
        }
    }
    let mut units: BTreeMap<DebugInfoOffset, Vec<usize>> = BTreeMap::new();
    for (i, unit) in unit_of.into_iter().enumerate() {
        if let Some(unit) = unit {
            units.entry(unit).or_default().push(i);
        }
    }
    units
}

/// The code ranges of a unit, from its root DIE alone: most units `.debug_aranges` does not
/// list hold no code at all (generic code only ever inlined elsewhere), and reading just
/// their first DIE is far cheaper than [`gimli::Dwarf::unit`], which also parses the
/// unit's line program header. `None` where the ranges need the unit's bases (DWARF 5's
/// `DW_FORM_addrx`, `DW_FORM_rnglistx`).
pub(super) fn root_ranges(
    dwarf: &Dwarf<'_>,
    header: &gimli::UnitHeader<Reader<'_>>,
    place: &mut impl FnMut(u64, u64),
) -> Option<()> {
    let abbreviations = header.abbreviations(&dwarf.debug_abbrev).ok()?;
    let mut entries = header.entries_raw(&abbreviations, None).ok()?;
    let abbrev = entries.read_abbreviation().ok()??;
    let (mut low, mut high, mut size, mut ranges) = (None, None, None, None);
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec).ok()?;
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, AttributeValue::Addr(at)) => low = Some(at),
            (gimli::DW_AT_high_pc, AttributeValue::Addr(at)) => high = Some(at),
            (gimli::DW_AT_high_pc, AttributeValue::Udata(n)) => size = Some(n),
            // gimli gives a unit's `DW_AT_ranges` as a raw offset, never `SecOffset`:
            // before DWARF 5 it is the offset into `.debug_ranges` itself.
            (gimli::DW_AT_ranges, AttributeValue::RangeListsRef(at)) => {
                ranges = Some(gimli::RangeListsOffset(at.0));
            }
            (gimli::DW_AT_low_pc | gimli::DW_AT_high_pc | gimli::DW_AT_ranges, _)
            | (gimli::DW_AT_addr_base | gimli::DW_AT_rnglists_base, _) => return None,
            _ => {}
        }
    }
    if let Some(offset) = ranges {
        if header.version() >= 5 {
            return None;
        }
        let mut list = dwarf
            .ranges
            .ranges(
                offset,
                header.encoding(),
                low.unwrap_or(0),
                &dwarf.debug_addr,
                gimli::DebugAddrBase(0),
            )
            .ok()?;
        while let Ok(Some(range)) = list.next() {
            place(range.begin, range.end);
        }
    } else if let Some(low) = low
        && let Some(high) = high.or_else(|| size.map(|n| low.saturating_add(n)))
    {
        place(low, high);
    }
    Some(())
}

/// The indexes of the sorted `addresses` in `begin..end`.
pub(crate) fn span(addresses: &[u64], begin: u64, end: u64) -> Range<usize> {
    let from = addresses.partition_point(|a| *a < begin);
    let to = addresses.partition_point(|a| *a < end).max(from);
    from..to
}

/// The indexes of sorted addresses not yet placed (in a unit, in a line-table row): a
/// disjoint-set forest in which each placed index points past itself, so that finding
/// the next unplaced one skips every placed one at once. Placing the addresses of one
/// range costs what it places plus a near-constant step, so a million overlapping ranges
/// cost a million steps, not a million times the addresses.
pub(crate) struct Unplaced {
    /// `next[i]` leads to the first unplaced index at or after `i`; `next[n] == n`.
    next: Vec<usize>,
}

impl Unplaced {
    pub(crate) fn new(n: usize) -> Unplaced {
        Unplaced {
            next: (0..=n).collect(),
        }
    }

    /// The first unplaced index at or after `i` (`i <= n`); `n` when none is left.
    pub(crate) fn first_from(&mut self, mut i: usize) -> usize {
        while self.next[i] != i {
            // Path halving: each step also shortens the way for the next search.
            self.next[i] = self.next[self.next[i]];
            i = self.next[i];
        }
        i
    }

    /// Marks `i` placed.
    pub(crate) fn place(&mut self, i: usize) {
        self.next[i] = i + 1;
    }

    /// Calls `each` with every unplaced index of `range`, and places it.
    pub(crate) fn place_in(&mut self, range: Range<usize>, mut each: impl FnMut(usize)) {
        let mut i = self.first_from(range.start);
        while i < range.end {
            each(i);
            self.place(i);
            i = self.first_from(i + 1);
        }
    }

    /// Whether every index is placed.
    pub(crate) fn none_left(&mut self) -> bool {
        self.first_from(0) == self.next.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges that overlap place each index once, in order; an index placed alone (as a
    /// line-table row does) is skipped like the rest; `none_left` only once all are.
    #[test]
    fn each_index_is_placed_once_however_the_ranges_overlap() {
        let mut unplaced = Unplaced::new(10);
        let placed = |unplaced: &mut Unplaced, range: Range<usize>| {
            let mut seen = Vec::new();
            unplaced.place_in(range, |i| seen.push(i));
            seen
        };
        assert!(!unplaced.none_left());
        assert_eq!(placed(&mut unplaced, 2..5), [2, 3, 4]);
        assert_eq!(placed(&mut unplaced, 0..7), [0, 1, 5, 6]);
        assert_eq!(placed(&mut unplaced, 3..4), [] as [usize; 0]);
        assert_eq!(unplaced.first_from(0), 7);
        unplaced.place(8);
        assert_eq!((unplaced.first_from(7), unplaced.first_from(8)), (7, 9));
        assert!(!unplaced.none_left());
        assert_eq!(placed(&mut unplaced, 7..10), [7, 9]);
        assert!(unplaced.none_left());
        assert_eq!((unplaced.first_from(0), unplaced.first_from(10)), (10, 10));
    }

    /// The indexes of sorted addresses inside `begin..end`: the end left out, and an empty
    /// span where the range holds none.
    #[test]
    fn a_span_is_the_addresses_inside_the_range() {
        let addresses = [0x10, 0x20, 0x30, 0x40];
        assert_eq!(span(&addresses, 0x20, 0x40), 1..3);
        assert_eq!(span(&addresses, 0x11, 0x20), 1..1);
        assert_eq!(span(&addresses, 0x00, 0x100), 0..4);
        assert_eq!(
            span(&addresses, 0x40, 0x30),
            3..3,
            "an inverted range holds none"
        );
    }
}
