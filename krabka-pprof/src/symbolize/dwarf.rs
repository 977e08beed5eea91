//! Source lines and inlined calls from DWARF, for the addresses one profile holds.
//!
//! For each address: the functions at it, innermost first (what was inlined, then what it
//! was inlined into, ending with the function the code belongs to), each with the file
//! and line the address stands for in it, as pprof's `Location.line` lists them.
//!
//! The object's file (or its separate debug file, found where distributions and
//! `objcopy --only-keep-debug` put one) is never mapped: its sections are read with
//! `pread`, block by block, only where the lookup reads them. `.debug_aranges` says which
//! compilation units hold the wanted addresses, and only those units' line programs and
//! function trees are walked, so what is resident while a lookup runs is what those
//! addresses need, and what was read is given back between units once it passes 1 MiB.
//! A file truncated or rewritten meanwhile, a FIFO where a debug file should be, or a
//! crafted file ends the lookup with what it found: nothing faults, blocks, or grows
//! without bound. Nothing is kept: every block, parsed unit and table is dropped before
//! [`resolve`] returns, so no symbol state outlives a request (the `pprof` crate's
//! symbolizer, through `backtrace`, keeps its parsed DWARF for the life of the process).
//! An object without DWARF gives nothing here, and its frames keep their symbol-table
//! names.
//!
//! `dwarf/file.rs` finds the file and where its sections are, `dwarf/sections.rs` reads
//! them (gimli's reader), `dwarf/units.rs` chooses the units, `dwarf/rows.rs` reads their
//! line programs, `dwarf/inline.rs` their inline trees.

mod file;
mod inline;
mod rows;
mod sections;
#[cfg(test)]
pub(crate) mod tests;
mod units;

use std::path::Path;

use gimli::UnitRef;

use self::file::{DEBUG_ROOT, DebugFile};
use self::inline::{Origins, functions, inline_chains};
use self::rows::line_rows;
use self::sections::Sections;
use self::units::units_of;
use super::names::FunctionLine;
use crate::objects::LoadedObject;

/// What a lookup holds of the file's blocks between two units, at most; past it, all of
/// them are given back (and read again if needed).
const HOLD: usize = 1 << 20;

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
    resolve_observed(object, addresses, roots, &mut |_| {})
}

/// The moments of a lookup [`resolve_observed`] reports, for the tests to act or measure
/// at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The file that holds the DWARF is chosen and open; none of its sections is read.
    Opened,
    /// A unit is read, before what was read of it may be given back.
    UnitRead,
    /// After a unit, once what was read may have been given back: the bytes of the
    /// file still held.
    Kept(usize),
}

/// [`resolve_with_roots`], calling `observe` at each [`Stage`].
pub(crate) fn resolve_observed(
    object: &LoadedObject,
    addresses: &[u64],
    roots: &[&Path],
    observe: &mut dyn FnMut(Stage),
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
    let Some(debug) = DebugFile::find(file, Path::new(&object.name), loaded, roots) else {
        return found;
    };
    observe(Stage::Opened);
    // A malformed unit ends the work where it is: what was found stays.
    let _ = look_up(&debug, addresses, &mut found, observe);
    found
}

/// Looks `addresses` up in `debug`'s DWARF, filling `found`; stops at the first thing
/// it cannot read, keeping what it found.
fn look_up(
    debug: &DebugFile,
    addresses: &[u64],
    found: &mut [Vec<FunctionLine>],
    observe: &mut dyn FnMut(Stage),
) -> Option<()> {
    let sections = Sections::load(debug)?;
    let dwarf = sections.dwarf();
    let mut trim = || {
        if sections.resident() > HOLD {
            sections.release_all();
        }
    };
    let units = units_of(&dwarf, addresses, &mut trim);
    // Read once, whole: of no more use.
    sections.release(gimli::SectionId::DebugAranges);
    let mut origins = Origins::new();
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
        observe(Stage::UnitRead);
        trim();
        observe(Stage::Kept(sections.resident()));
    }
    Some(())
}
