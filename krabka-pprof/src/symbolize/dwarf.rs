//! Source lines and inlined calls from DWARF, for the addresses one profile holds.
//!
//! For each address: the functions at it, innermost first (what was inlined, then what it
//! was inlined into, ending with the function the code belongs to), each with the file
//! and line the address stands for in it, as pprof's `Location.line` lists them.
//!
//! The object's file (or its separate debug file, found where distributions and
//! `objcopy --only-keep-debug` put one) is mapped, not read, and only what the wanted
//! addresses need is parsed: `.debug_aranges` says which compilation units hold them, and
//! only those units' line programs and function trees are walked. Nothing is kept: the
//! map, the parsed units and every table are dropped before [`resolve`] returns, so no
//! symbol state outlives a request (the `pprof` crate's symbolizer, through `backtrace`,
//! keeps its parsed DWARF for the life of the process). An object without DWARF gives
//! nothing here, and its frames keep their symbol-table names.
//!
//! `dwarf/file.rs` finds and reads the file, `dwarf/units.rs` chooses the units,
//! `dwarf/rows.rs` reads their line programs, `dwarf/inline.rs` their inline trees.

mod file;
mod inline;
mod rows;
#[cfg(test)]
pub(crate) mod tests;
mod units;

use std::borrow::Cow;
use std::path::Path;

use gimli::{EndianSlice, LittleEndian, UnitRef};
use object::{CompressionFormat, Object as _, ObjectSection as _};

use self::file::{
    DEBUG_ROOT, DebugFile, Dwarf, MAX_INFLATED, Scattered, USED, plain_range, section,
};
use self::inline::{Origins, functions, inline_chains};
use self::rows::line_rows;
use self::units::units_of;
use super::names::FunctionLine;
use crate::objects::LoadedObject;

/// The functions at each of `addresses` (as stated in the object's file: minus its load
/// bias; sorted, unique), innermost first. Empty where the object (and any separate debug
/// file of it) has no DWARF for the address.
pub(crate) fn resolve(object: &LoadedObject, addresses: &[u64]) -> Vec<Vec<FunctionLine>> {
    resolve_with_roots(object, addresses, &[Path::new(DEBUG_ROOT)])
}

/// [`resolve`], looking for separate debug files under `roots` (`/usr/lib/debug` in
/// production; a test's own directory in tests).
pub(crate) fn resolve_with_roots(
    object: &LoadedObject,
    addresses: &[u64],
    roots: &[&Path],
) -> Vec<Vec<FunctionLine>> {
    debug_assert!(addresses.windows(2).all(|w| w[0] < w[1]));
    let mut found = vec![Vec::new(); addresses.len()];
    if object.is_vdso || addresses.is_empty() {
        return found;
    }
    let Some(file) = object.file.as_deref() else {
        return found;
    };
    let loaded = object.build_id.as_deref();
    let Some(mapped) = DebugFile::find(file, Path::new(&object.name), loaded, roots) else {
        return found;
    };
    // A malformed unit ends the work where it is: what was found stays.
    let _ = look_up(&mapped, addresses, &mut found);
    found
}

/// Looks `addresses` up in `debug`'s DWARF, filling `found`; stops at the first thing
/// it cannot read, keeping what it found.
fn look_up(debug: &DebugFile, addresses: &[u64], found: &mut [Vec<FunctionLine>]) -> Option<()> {
    let elf = object::File::parse(&*debug.map).ok()?;
    // Compressed sections too big to inflate now leave the object without lines,
    // decided before inflating any.
    let inflated: u64 = USED
        .iter()
        .filter_map(|id| elf.section_by_name(id.name())?.compressed_file_range().ok())
        .filter(|range| range.format != CompressionFormat::None)
        .map(|range| range.uncompressed_size)
        .sum();
    if inflated > MAX_INFLATED {
        return None;
    }
    let sections = gimli::DwarfSections::load(|id| {
        if !USED.contains(&id) {
            return Ok(Cow::Borrowed(&[][..]));
        }
        section(&elf, id.name()).ok_or(())
    })
    .ok()?;
    let dwarf: Dwarf<'_> = sections.borrow(|data| EndianSlice::new(data, LittleEndian));
    let scattered = Scattered {
        file: &debug.file,
        debug_info: plain_range(&elf, ".debug_info"),
        debug_str: plain_range(&elf, ".debug_str"),
    };
    let units = units_of(&dwarf, addresses);
    let mut origins = Origins::new(&scattered);
    for (offset, wanted) in units {
        let Ok(header) = dwarf.debug_info.header_from_offset(offset) else {
            continue;
        };
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let unit = UnitRef::new(&dwarf, &unit);
        let at: Vec<u64> = wanted.iter().map(|&i| addresses[i]).collect();
        let rows = line_rows(unit, &at).unwrap_or_default();
        let expected: Vec<bool> = (0..at.len())
            .map(|k| rows.get(k).is_some_and(Option::is_some))
            .collect();
        let chains = inline_chains(unit, &at, &expected, &mut origins).unwrap_or_default();
        for (k, &i) in wanted.iter().enumerate() {
            let row = rows.get(k).cloned().flatten();
            let chain = chains.get(k).map(Vec::as_slice).unwrap_or_default();
            found[i] = functions(chain, row);
        }
    }
    Some(())
}
