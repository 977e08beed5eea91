//! How a code address becomes a name: the symbol tables name the function it is in
//! (`symbolize/symtab.rs`, ELF `.symtab`/`.dynsym`); where the object has DWARF, its line
//! tables and inline trees (`symbolize/dwarf.rs`) add the file and line, and the
//! functions inlined at the address, innermost first. [`Resolved`] holds what one
//! profile's addresses resolved to; it is made per request and dropped with it, so no
//! symbol or line table stays resident. `profile.rs` builds the locations from it.

use std::collections::{BTreeMap, HashMap, HashSet};

#[cfg(elf)]
pub(crate) mod dwarf;
mod names;
mod opening;
mod symtab;

pub(crate) use names::FunctionLine;
#[cfg(test)]
pub(crate) use symtab::resolve as symbol_of;

use crate::objects::Objects;
use symtab::Symbol;

/// How much of each code address a profile names (`?symbolize=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Symbolize {
    /// Function names, and files, lines and inlined calls where DWARF has them.
    #[default]
    Full,
    /// Addresses and mappings only, for tools that symbolize centrally (Parca, or
    /// `go tool pprof` with the binary at hand).
    None,
}

impl Symbolize {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Symbolize::Full => "full",
            Symbolize::None => "none",
        }
    }
}

/// What symbolization found, for the addresses it was asked about.
#[derive(Default)]
pub(crate) struct Resolved {
    /// Each code address's functions, innermost first.
    frames: HashMap<u64, Vec<FunctionLine>>,
    /// The objects DWARF gave lines for, by where they are loaded.
    with_lines: HashSet<u64>,
    /// Every address looked up, named or not.
    tried: HashSet<u64>,
}

impl Resolved {
    /// Symbolizes `addresses` now: a CPU profile's window does this with the addresses it
    /// has gathered shortly before it ends, so that what is left after the window is
    /// only what was first sampled since.
    #[cfg_attr(not(sampler), allow(dead_code))]
    pub(crate) fn of(objects: &Objects, addresses: Vec<u64>) -> Resolved {
        let mut resolved = Resolved::default();
        resolved.add(objects, addresses);
        resolved
    }

    /// What `address` resolved to, innermost function first, if it was named.
    pub(crate) fn functions(&self, address: u64) -> Option<&[FunctionLine]> {
        self.frames.get(&address).map(Vec::as_slice)
    }

    /// Whether `address` was looked up already, named or not.
    pub(crate) fn has_tried(&self, address: u64) -> bool {
        self.tried.contains(&address)
    }

    /// Whether DWARF gave lines for `object`.
    pub(crate) fn has_lines(&self, object: &crate::objects::LoadedObject) -> bool {
        self.with_lines.contains(&object.range.start)
    }

    /// Looks `addresses` up, reading each object's tables once.
    pub(crate) fn add(&mut self, objects: &Objects, addresses: Vec<u64>) {
        let mut by_object: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for address in addresses {
            if !self.tried.insert(address) {
                continue;
            }
            if let Some((index, object)) = objects.find(address) {
                by_object
                    .entry(index)
                    .or_default()
                    .push(address - object.bias);
            }
        }
        for (index, mut addresses) in by_object {
            addresses.sort_unstable();
            addresses.dedup();
            let object = objects.get(index).expect("a known object");
            let symbols = symtab::resolve(object, &addresses);
            #[cfg(elf)]
            let lines = dwarf::resolve(object, &addresses);
            #[cfg(not(elf))]
            let lines = vec![Vec::new(); addresses.len()];
            if lines.iter().any(|levels| !levels.is_empty()) {
                self.with_lines.insert(object.range.start);
            }
            for ((address, symbol), levels) in addresses.iter().zip(symbols).zip(lines) {
                if let Some(named) = functions_at(symbol, levels) {
                    self.frames.insert(address + object.bias, named);
                }
            }
        }
    }
}

/// An address's functions, innermost first: DWARF's inline chain with files and lines
/// where the object has it, the outermost named as the symbol table names it (the names
/// profiles of binaries without DWARF have); else the symbol alone.
fn functions_at(symbol: Option<Symbol>, dwarf: Vec<FunctionLine>) -> Option<Vec<FunctionLine>> {
    let symbol_alone = |symbol: Symbol| vec![FunctionLine::named(symbol.name, symbol.raw)];
    let Some(outermost) = dwarf.len().checked_sub(1) else {
        return symbol.map(symbol_alone);
    };
    let mut functions = dwarf;
    if let Some(symbol) = &symbol {
        functions[outermost].name.clone_from(&symbol.name);
        functions[outermost].system_name.clone_from(&symbol.raw);
    }
    // A frame is worth DWARF's lines only if it names its function.
    if functions[outermost].name.is_empty() {
        return symbol.map(symbol_alone);
    }
    Some(functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolize_names_itself_as_the_query_spells_it() {
        assert_eq!(Symbolize::Full.name(), "full");
        assert_eq!(Symbolize::None.name(), "none");
    }

    /// Addresses looked up early are named, and remembered as tried whether named or
    /// not, so that the profile built later looks none of them up again.
    #[test]
    fn addresses_resolved_early_are_named_and_remembered_as_tried() {
        #[inline(never)]
        fn named_here() -> u64 {
            std::hint::black_box(7)
        }
        let objects = Objects::current();
        let here = named_here as *const () as u64;
        let resolved = Resolved::of(&objects, vec![here, 8]);
        let functions = resolved.functions(here).expect("this test's function");
        assert!(
            functions.last().unwrap().name.ends_with("named_here"),
            "{functions:?}"
        );
        assert!(resolved.has_tried(here));
        assert!(resolved.has_tried(8), "tried, though nothing is there");
        assert_eq!(resolved.functions(8), None);
        assert!(!resolved.has_tried(here + 1));
    }
}
