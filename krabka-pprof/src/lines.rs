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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read as _;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gimli::{AttributeValue, DebugInfoOffset, EndianSlice, LittleEndian, UnitOffset, UnitRef};
use object::{CompressionFormat, Object as _, ObjectSection as _};

use crate::objects::LoadedObject;
use crate::profile::{Level, hex};

type Reader<'a> = EndianSlice<'a, LittleEndian>;
type Dwarf<'a> = gimli::Dwarf<Reader<'a>>;
type Unit<'a> = gimli::Unit<Reader<'a>>;

/// Where distributions install separate debug files (by build ID under `.build-id/`, or
/// by the binary's own path).
pub(crate) const DEBUG_ROOT: &str = "/usr/lib/debug";

/// The most the compressed debug sections of one object may inflate to, together, for one
/// request. Distributions ship their debug files zlib-compressed, and inflating takes time
/// and memory in proportion: glibc's (libc6-dbg) would inflate to some 12 MB in about
/// 100 ms, on every request. Above this, the object keeps its symbol-table names; its
/// debug file can be decompressed once with `objcopy --decompress-debug-sections`, and is
/// then mapped like any other.
const MAX_INFLATED: u64 = 4 << 20;

/// The functions at each of `addresses` (as stated in the object's file: minus its load
/// bias; sorted, unique), innermost first. Empty where the object (and any separate debug
/// file of it) has no DWARF for the address.
pub(crate) fn resolve(object: &LoadedObject, addresses: &[u64]) -> Vec<Vec<Level>> {
    resolve_with_roots(object, addresses, &[Path::new(DEBUG_ROOT)])
}

/// [`resolve`], looking for separate debug files under `roots` (`/usr/lib/debug` in
/// production; a test's own directory in tests).
pub(crate) fn resolve_with_roots(
    object: &LoadedObject,
    addresses: &[u64],
    roots: &[&Path],
) -> Vec<Vec<Level>> {
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
    let _ = mapped.resolve(addresses, &mut found);
    found
}

/// A mapped ELF file with DWARF in it.
struct DebugFile {
    map: memmap2::Mmap,
    /// The same file, for positioned reads of small scattered pieces (see [`Scattered`]).
    file: File,
}

impl DebugFile {
    /// Maps `path` read-only.
    fn map(path: &Path) -> Option<DebugFile> {
        let file = File::open(path).ok()?;
        // SAFETY: the map is private and read-only, and lives only for one request. A file
        // truncated meanwhile would fault on access (SIGBUS), as for every reader of mapped
        // binaries (the dynamic loader maps them the same way): package managers and deploy
        // tools replace files by rename, which leaves this map on the old file; the README
        // says not to rewrite debug files in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        // Only parts are read: no readahead beyond them when the file is not cached.
        let _ = map.advise(memmap2::Advice::Random);
        Some(DebugFile { map, file })
    }

    /// The file that holds `file`'s DWARF: itself if it has line tables, else its separate
    /// debug file, if one is installed where debuggers look (by build ID, then by
    /// `.gnu_debuglink` next to the binary, in its `.debug/`, or under a root by the
    /// binary's own path). `named` is the binary's path as the process names it: the
    /// debug link is relative to it (`file` may be `/proc/self/exe`).
    ///
    /// `loaded` is the build ID of the code in memory: a library replaced on disk since it
    /// was loaded (a package upgrade) is another build, whose lines would be wrong, so
    /// then only a debug file of the loaded build is looked for.
    fn find(
        file: &Path,
        named: &Path,
        loaded: Option<&[u8]>,
        roots: &[&Path],
    ) -> Option<DebugFile> {
        let own = DebugFile::map(file)?;
        let elf = object::File::parse(&*own.map).ok()?;
        let on_disk = elf.build_id().ok().flatten().map(<[u8]>::to_vec);
        let replaced = matches!((loaded, &on_disk), (Some(loaded), Some(on_disk)) if loaded != on_disk.as_slice());
        if !replaced && has_dwarf(&elf) {
            drop(elf);
            return Some(own);
        }
        let build_id = loaded.map(<[u8]>::to_vec).or(on_disk);
        let link = elf
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(name, _crc)| String::from_utf8_lossy(name).into_owned())
            // A link is a file name, never a path elsewhere; a replaced file's link names
            // the new build's debug file.
            .filter(|name| !replaced && !name.is_empty() && !name.contains('/'));
        drop(elf);
        drop(own);
        let by_build_id = build_id
            .iter()
            .filter(|id| id.len() >= 2)
            .flat_map(|id| {
                let hex = hex(id);
                roots.iter().map(move |root| {
                    root.join(".build-id")
                        .join(&hex[..2])
                        .join(format!("{}.debug", &hex[2..]))
                })
            })
            .collect::<Vec<_>>();
        let real = std::fs::canonicalize(named).unwrap_or_else(|_| named.to_owned());
        let dir = real.parent().unwrap_or(Path::new("/")).to_owned();
        let by_link = link
            .iter()
            .flat_map(|name| {
                let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
                candidates.extend(
                    roots
                        .iter()
                        .map(|root| root.join(dir.strip_prefix("/").unwrap_or(&dir)).join(name)),
                );
                candidates
            })
            .collect::<Vec<_>>();
        by_build_id
            .into_iter()
            .chain(by_link)
            // The link may name the binary itself: never read it twice.
            .filter(|candidate| candidate != &real)
            .find_map(|candidate| {
                let debug = DebugFile::map(&candidate)?;
                let elf = object::File::parse(&*debug.map).ok()?;
                // A debug file of another build gives wrong lines: worse than none.
                let same_build = match (&build_id, elf.build_id().ok().flatten()) {
                    (Some(wanted), Some(theirs)) => wanted.as_slice() == theirs,
                    _ => true,
                };
                let usable = same_build && has_dwarf(&elf);
                drop(elf);
                usable.then_some(debug)
            })
    }

    fn resolve(&self, addresses: &[u64], found: &mut [Vec<Level>]) -> Option<()> {
        let elf = object::File::parse(&*self.map).ok()?;
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
            file: &self.file,
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
                found[i] = levels(chain, row);
            }
        }
        Some(())
    }
}

/// Where an uncompressed section lies in the file: its offset and size.
fn plain_range(elf: &object::File<'_>, name: &str) -> Option<(u64, u64)> {
    let section = elf.section_by_name(name)?;
    let range = section.compressed_file_range().ok()?;
    (range.format == CompressionFormat::None).then_some((range.offset, range.uncompressed_size))
}

/// Small pieces read at scattered places, by positioned reads rather than through the
/// map: the kernel maps 64 KiB of a cached file around every page a mapping touches
/// (fault-around, which `MADV_RANDOM` does not turn off), so a name looked up here and
/// there would make most of `.debug_str` resident, and walking every unit's header most
/// of `.debug_info`.
struct Scattered<'f> {
    file: &'f File,
    debug_info: Option<(u64, u64)>,
    debug_str: Option<(u64, u64)>,
}

impl Scattered<'_> {
    /// The string at `offset` in `.debug_str`, if the section is stored plain.
    fn string(&self, offset: usize) -> Option<String> {
        let (start, size) = self.debug_str?;
        let offset = offset as u64;
        if offset >= size {
            return None;
        }
        let mut found = Vec::new();
        let mut chunk = [0u8; 256];
        while offset + (found.len() as u64) < size && found.len() < 1 << 16 {
            let at = start + offset + found.len() as u64;
            let n = read_at(self.file, &mut chunk, at)?;
            if n == 0 {
                return None;
            }
            let n = n.min((size - offset - found.len() as u64) as usize);
            if let Some(nul) = chunk[..n].iter().position(|b| *b == 0) {
                found.extend_from_slice(&chunk[..nul]);
                return Some(String::from_utf8_lossy(&found).into_owned());
            }
            found.extend_from_slice(&chunk[..n]);
        }
        None
    }

    /// The start of every unit in `.debug_info`, from their lengths alone.
    fn unit_starts(&self) -> Option<Vec<DebugInfoOffset>> {
        let (start, size) = self.debug_info?;
        let mut starts = Vec::new();
        let mut offset = 0u64;
        let mut length = [0u8; 12];
        // Every unit is at least its 4-byte length long, so a malformed length can only
        // end the walk, never make it loop.
        while offset.checked_add(4)? <= size {
            if read_at(self.file, &mut length, start.checked_add(offset)?)? < 12 {
                return None;
            }
            let short = u32::from_le_bytes(length[..4].try_into().expect("4 bytes"));
            let (header, length) = match short {
                0xffff_ffff => (
                    12,
                    u64::from_le_bytes(length[4..].try_into().expect("8 bytes")),
                ),
                0xffff_fff0.. => return None,
                length => (4, u64::from(length)),
            };
            starts.push(DebugInfoOffset(usize::try_from(offset).ok()?));
            offset = offset.checked_add(header)?.checked_add(length)?;
        }
        Some(starts)
    }
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Option<usize> {
    use std::os::unix::fs::FileExt as _;
    file.read_at(buf, offset).ok()
}

/// Whether an ELF file has the DWARF this module reads.
fn has_dwarf(elf: &object::File<'_>) -> bool {
    [".debug_info", ".debug_line"].iter().all(|name| {
        elf.section_by_name(name)
            .is_some_and(|section| section.size() > 0)
    })
}

/// The DWARF sections this module reads; the others (locations, macros, types, name
/// indexes) are never loaded.
const USED: [gimli::SectionId; 10] = [
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugAranges,
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
];

/// A section's bytes: borrowed from the map, or inflated when the section is compressed
/// (`SHF_COMPRESSED` with zlib, as `objcopy --compress-debug-sections` and distributions
/// write them). Empty when the object has no such section; `None` when it cannot be read
/// or inflated.
fn section<'m>(elf: &object::File<'m>, name: &str) -> Option<Cow<'m, [u8]>> {
    let Some(section) = elf.section_by_name(name) else {
        return Some(Cow::Borrowed(&[]));
    };
    let compressed = section.compressed_data().ok()?;
    match compressed.format {
        CompressionFormat::None => Some(Cow::Borrowed(compressed.data)),
        CompressionFormat::Zlib if compressed.uncompressed_size <= MAX_INFLATED => {
            let mut inflated = Vec::with_capacity(compressed.uncompressed_size as usize);
            flate2::read::ZlibDecoder::new(compressed.data)
                .take(compressed.uncompressed_size)
                .read_to_end(&mut inflated)
                .ok()?;
            Some(Cow::Owned(inflated))
        }
        // zstd-compressed sections (`--compress-debug-sections=zstd`), or too big.
        _ => None,
    }
}

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
fn units_of(dwarf: &Dwarf<'_>, addresses: &[u64]) -> BTreeMap<DebugInfoOffset, Vec<usize>> {
    let mut unit_of: Vec<Option<DebugInfoOffset>> = vec![None; addresses.len()];
    let mut any_listed = false;
    let mut headers = dwarf.debug_aranges.headers();
    while let Ok(Some(header)) = headers.next() {
        let offset = header.debug_info_offset();
        any_listed = true;
        let mut entries = header.entries();
        while let Ok(Some(entry)) = entries.next() {
            let range = entry.range();
            for slot in &mut unit_of[span(addresses, range.begin, range.end)] {
                slot.get_or_insert(offset);
            }
        }
    }
    if !any_listed {
        let mut headers = dwarf.units();
        while let Ok(Some(header)) = headers.next() {
            let Some(offset) = header.debug_info_offset() else {
                continue;
            };
            let mut place = |begin: u64, end: u64| {
                for slot in &mut unit_of[span(addresses, begin, end)] {
                    slot.get_or_insert(offset);
                }
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
            if unit_of.iter().all(Option::is_some) {
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
fn root_ranges(
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
            (gimli::DW_AT_ranges, AttributeValue::SecOffset(at)) => {
                ranges = Some(gimli::RangeListsOffset(at));
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
fn span(addresses: &[u64], begin: u64, end: u64) -> std::ops::Range<usize> {
    let from = addresses.partition_point(|a| *a < begin);
    let to = addresses.partition_point(|a| *a < end).max(from);
    from..to
}

/// A file and line from the line program.
type Row = (String, i64);

/// The line-table row covering each of `at` (sorted), with its file's path.
fn line_rows(unit: UnitRef<'_, Reader<'_>>, at: &[u64]) -> Option<Vec<Option<Row>>> {
    let program = unit.line_program.clone()?;
    let mut rows = program.rows();
    let mut covering: Vec<Option<(u64, i64)>> = vec![None; at.len()];
    let mut uncovered = at.len();
    // The previous row of the current sequence: its address, file and line.
    let mut previous: Option<(u64, u64, i64)> = None;
    // The first of `at` not below the previous row: rows of a sequence only go up, so
    // this moves forward one step at a time instead of being searched for at every row.
    let mut next = 0;
    let mut discarded = false;
    // The program is read only until every address has its row: on average half of it.
    while uncovered > 0
        && let Some((_, row)) = rows.next_row().ok()?
    {
        let address = row.address();
        match previous {
            None => {
                // A sequence starts. Sequences of code the linker discarded are left at
                // address 0.
                discarded = address == 0;
                next = at.partition_point(|a| *a < address);
            }
            Some((_, file, line)) if !discarded => {
                while next < at.len() && at[next] < address {
                    if covering[next].is_none() {
                        covering[next] = Some((file, line));
                        uncovered -= 1;
                    }
                    next += 1;
                }
            }
            Some(_) => {}
        }
        previous = if row.end_sequence() {
            None
        } else {
            let line = row.line().map_or(0, NonZeroU64::get);
            Some((address, row.file_index(), line as i64))
        };
    }
    let header = rows.header();
    let mut paths: HashMap<u64, String> = HashMap::new();
    Some(
        covering
            .into_iter()
            .map(|found| {
                let (file, line) = found?;
                let path = paths
                    .entry(file)
                    .or_insert_with(|| file_path(unit, header, file).unwrap_or_default());
                Some((path.clone(), line))
            })
            .collect(),
    )
}

/// A line program's file `index` as a path: joined to its directory, and to the unit's
/// compilation directory when still relative, as compilers record them.
fn file_path<'a>(
    unit: UnitRef<'_, Reader<'a>>,
    header: &gimli::LineProgramHeader<Reader<'a>>,
    index: u64,
) -> Option<String> {
    let file = header.file(index)?;
    let mut path = PathBuf::new();
    if let Some(dir) = unit.comp_dir {
        path.push(&*dir.to_string_lossy());
    }
    if let Some(dir) = file.directory(header) {
        path.push(&*unit.attr_string(dir).ok()?.to_string_lossy());
    }
    path.push(&*unit.attr_string(file.path_name()).ok()?.to_string_lossy());
    Some(path.to_string_lossy().into_owned())
}

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
struct Scope {
    origin: Rc<Origin>,
    /// Where the inlined call is, in the function it was inlined into.
    call: Option<Row>,
}

/// Names already looked up in this request, by the DIE's offset in `.debug_info`:
/// inlined calls of one function share its abstract DIE.
struct Origins<'s, 'd> {
    known: HashMap<DebugInfoOffset, Origin>,
    /// Start offsets of every unit, read once if a DIE refers to another unit.
    unit_starts: Option<Vec<DebugInfoOffset>>,
    /// Units other units' DIEs referred to, parsed once: in a release build most inlined
    /// functions are declared in another unit of their crate.
    units: HashMap<DebugInfoOffset, Rc<Unit<'d>>>,
    scattered: &'s Scattered<'s>,
}

/// For each of `at` (sorted), the function DIEs containing it, outermost first: the
/// subprogram, then each inlined call in it, nesting inwards. Subtrees whose ranges hold
/// none of `at` are skipped without reading their attributes' values, and the walk ends
/// once the `expected` addresses (those the line program covers) each have their
/// subprogram, read to its end.
fn inline_chains<'d>(
    unit: UnitRef<'_, Reader<'d>>,
    at: &[u64],
    expected: &[bool],
    origins: &mut Origins<'_, 'd>,
) -> Option<Vec<Vec<Scope>>> {
    let mut chains: Vec<Vec<Scope>> = vec![Vec::new(); at.len()];
    let mut unplaced = expected.iter().filter(|e| **e).count();
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
        // outwards in.
        for i in hits {
            chains[i].push(Scope {
                origin: origin.clone(),
                call: call.clone(),
            });
        }
    }
    Some(chains)
}

/// A path from the unit's line program's file table.
fn program_file(unit: UnitRef<'_, Reader<'_>>, index: u64) -> Option<String> {
    let program = unit.line_program.as_ref()?;
    file_path(unit, program.header(), index)
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
            gimli::DW_AT_decl_file => self.decl_file = file_index(unit, value),
            gimli::DW_AT_decl_line => self.decl_line = line_number(&attr),
            gimli::DW_AT_call_file => self.call_file = file_index(unit, value),
            gimli::DW_AT_call_line => self.call_line = line_number(&attr),
            _ => {}
        }
    }

    /// The indexes of `at` inside this DIE's code.
    fn hits(&self, unit: UnitRef<'_, Reader<'a>>, at: &[u64]) -> Vec<usize> {
        let mut hits = Vec::new();
        if let Some(offset) = self.ranges {
            if let Ok(mut ranges) = unit.ranges(offset) {
                while let Ok(Some(range)) = ranges.next() {
                    hits.extend(span(at, range.begin, range.end));
                }
            }
            hits.sort_unstable();
            hits.dedup();
        } else if let Some(low) = self.low_pc {
            let high = self
                .high_pc
                .or_else(|| self.size.map(|size| low.saturating_add(size)));
            if let Some(high) = high {
                hits.extend(span(at, low, high));
            }
        }
        hits
    }

    /// The DIE's own name: its linkage name, else its plain name; and whether it was the
    /// linkage name.
    fn own_name(&self, unit: UnitRef<'_, Reader<'a>>, scattered: &Scattered<'_>) -> (String, bool) {
        let string = |value: AttributeValue<Reader<'a>>| match value {
            AttributeValue::DebugStrRef(offset) if scattered.debug_str.is_some() => {
                scattered.string(offset.0)
            }
            value => unit
                .attr_string(value)
                .ok()
                .map(|name| name.to_string_lossy().into_owned()),
        };
        if let Some(name) = self.linkage_name.and_then(string) {
            return (name, true);
        }
        (self.name.and_then(string).unwrap_or_default(), false)
    }

    /// The function's name and declaration, following the DIEs it refers to.
    fn origin(&self, unit: UnitRef<'_, Reader<'a>>, origins: &mut Origins<'_, 'a>) -> Origin {
        let (raw, has_linkage_name) = self.own_name(unit, origins.scattered);
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

impl<'s, 'd> Origins<'s, 'd> {
    fn new(scattered: &'s Scattered<'s>) -> Origins<'s, 'd> {
        Origins {
            known: HashMap::new(),
            unit_starts: None,
            units: HashMap::new(),
            scattered,
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
        let scattered = self.scattered;
        let starts = self.unit_starts.get_or_insert_with(|| {
            scattered.unit_starts().unwrap_or_else(|| {
                // A compressed section is in memory already: walk it.
                let mut starts = Vec::new();
                let mut headers = dwarf.units();
                while let Ok(Some(header)) = headers.next() {
                    if let Some(offset) = header.debug_info_offset() {
                        starts.push(offset);
                    }
                }
                starts
            })
        });
        let start = *starts.get(starts.partition_point(|s| *s <= at).checked_sub(1)?)?;
        let unit = match self.units.get(&start) {
            Some(unit) => unit.clone(),
            None => {
                let header = dwarf.debug_info.header_from_offset(start).ok()?;
                let unit = Rc::new(dwarf.unit(header).ok()?);
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
        let (raw, has_linkage_name) = die.own_name(unit, self.scattered);
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

/// A file index attribute, where DWARF 4's index 0 means "no file" and DWARF 5's does not.
fn file_index(unit: UnitRef<'_, Reader<'_>>, value: AttributeValue<Reader<'_>>) -> Option<u64> {
    match value {
        AttributeValue::FileIndex(index) if index > 0 || unit.header.version() >= 5 => Some(index),
        _ => None,
    }
}

fn line_number(attr: &gimli::Attribute<Reader<'_>>) -> i64 {
    attr.udata_value()
        .and_then(|line| i64::try_from(line).ok())
        .unwrap_or(0)
}

/// An address's levels, innermost first: the innermost function at the line-table row,
/// and each function it was inlined into at the call's line.
fn levels(chain: &[Scope], row: Option<Row>) -> Vec<Level> {
    if chain.is_empty() {
        // Lines without a function DIE (assembly, line-tables-only C): the line alone,
        // for the function the symbol table names.
        return row
            .map(|(filename, line)| {
                vec![Level {
                    raw: String::new(),
                    filename,
                    line,
                    start_line: 0,
                }]
            })
            .unwrap_or_default();
    }
    let mut levels = Vec::with_capacity(chain.len());
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
        levels.push(Level {
            raw: scope.origin.raw.clone(),
            filename,
            line,
            start_line,
        });
        at = scope.call.clone().unwrap_or_default();
    }
    levels
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::{resolve, resolve_with_roots};
    use crate::objects::{LoadedObject, Objects};
    use crate::profile::Level;
    use crate::symbols::demangle;

    /// The line just above [`a_function_with_lines`].
    const FUNCTION_LINE: i64 = line!() as i64;
    #[inline(never)]
    fn a_function_with_lines(rounds: u64) -> u64 {
        let mut x = std::hint::black_box(14u64);
        for _ in 0..rounds {
            x = an_inlined_step(x);
        }
        x
    }
    /// The line of the call above, and the line the function below starts on.
    const CALL_LINE: i64 = FUNCTION_LINE + 5;
    const STEP_LINE: i64 = CALL_LINE + 9;

    #[inline(always)]
    fn an_inlined_step(x: u64) -> u64 {
        let y = std::hint::black_box(x).wrapping_mul(3);
        y.rotate_left(7) ^ std::hint::black_box(0x5bd1_e995)
    }

    /// This test binary's object, and the file addresses of the first bytes of
    /// [`a_function_with_lines`] (its code is shorter than that; what lies past it
    /// belongs to other functions).
    fn probe() -> (Objects, usize, Vec<u64>) {
        std::hint::black_box(a_function_with_lines(std::hint::black_box(3)));
        let objects = Objects::current();
        let start = a_function_with_lines as *const () as u64;
        let (index, object) = objects.find(start).unwrap();
        let addresses = (0..160).map(|i| start - object.bias + i).collect();
        (objects.clone(), index, addresses)
    }

    fn named(level: &Level) -> String {
        demangle(&level.raw)
    }

    /// The levels found inside [`a_function_with_lines`], outermost being it.
    fn inside(found: &[Vec<Level>]) -> Vec<&Vec<Level>> {
        found
            .iter()
            .filter(|levels| {
                levels
                    .last()
                    .is_some_and(|l| named(l).ends_with("lines::tests::a_function_with_lines"))
            })
            .collect()
    }

    #[test]
    fn a_function_of_this_test_binary_has_its_file_and_lines_inside_it() {
        let (objects, index, addresses) = probe();
        let found = resolve(objects.get(index).unwrap(), &addresses);
        let inside = inside(&found);
        assert!(!inside.is_empty(), "{:?}", &found[..4]);
        let lines = FUNCTION_LINE + 2..=FUNCTION_LINE + 8;
        for levels in &inside {
            let outermost = levels.last().unwrap();
            assert!(
                outermost.filename.ends_with("krabka-pprof/src/lines.rs"),
                "{outermost:?}"
            );
            assert!(
                Path::new(&outermost.filename).is_absolute(),
                "{outermost:?}"
            );
            // Line 0 is code the compiler made up (DWARF's "no line").
            assert!(
                outermost.line == 0 || lines.contains(&outermost.line),
                "line {} of lines.rs; the function spans {lines:?}",
                outermost.line,
            );
            assert_eq!(outermost.start_line, FUNCTION_LINE + 2, "{outermost:?}");
        }
        assert!(
            inside.iter().any(|levels| levels.last().unwrap().line > 0),
            "{inside:?}"
        );
    }

    #[test]
    fn an_inline_always_function_is_a_level_of_its_own_at_the_call() {
        let (objects, index, addresses) = probe();
        let found = resolve(objects.get(index).unwrap(), &addresses);
        let inlined: Vec<&Vec<Level>> = inside(&found)
            .into_iter()
            .filter(|levels| levels.iter().any(|l| named(l).ends_with("an_inlined_step")))
            .collect();
        assert!(!inlined.is_empty(), "{:?}", inside(&found));
        for levels in inlined {
            // What it inlined in turn (`black_box`) comes first, innermost first.
            let at = levels
                .iter()
                .position(|l| named(l).ends_with("lines::tests::an_inlined_step"))
                .unwrap();
            let step = &levels[at];
            assert!(
                step.filename.ends_with("krabka-pprof/src/lines.rs"),
                "{levels:?}"
            );
            assert_eq!(step.start_line, STEP_LINE, "{levels:?}");
            if at == 0 && step.line != 0 {
                assert!(
                    (STEP_LINE + 1..=STEP_LINE + 2).contains(&step.line),
                    "{levels:?}"
                );
            }
            // The function it was inlined into, at the line of the call.
            assert_eq!(levels.len(), at + 2, "{levels:?}");
            let caller = &levels[at + 1];
            assert!(
                named(caller).ends_with("a_function_with_lines"),
                "{levels:?}"
            );
            assert_eq!(caller.line, CALL_LINE, "{levels:?}");
            assert!(caller.filename.ends_with("src/lines.rs"), "{levels:?}");
        }
    }

    #[test]
    fn the_vdso_has_no_dwarf_and_gives_nothing() {
        let objects = Objects::current();
        let vdso = objects.iter().find(|o| o.is_vdso).expect("a vDSO");
        let text = vdso.text().unwrap();
        let probe: Vec<u64> = (text.avma.start..text.avma.end)
            .step_by(64)
            .map(|a| a - vdso.bias)
            .collect();
        assert!(resolve(vdso, &probe).iter().all(Vec::is_empty));
    }

    /// A scratch directory for one test, removed at the end.
    pub(crate) struct Scratch(pub(crate) PathBuf);

    impl Scratch {
        pub(crate) fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir()
                .join(format!("krabka-pprof-lines-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn objcopy(args: &[&std::ffi::OsStr]) {
        let status = Command::new("objcopy")
            .args(args)
            .status()
            .expect("objcopy (binutils) runs: the tests strip a copy of themselves with it");
        assert!(status.success(), "objcopy {args:?}");
    }

    /// A copy of this test binary without its DWARF (`strip --strip-debug`, as packagers
    /// strip binaries), and its DWARF alone (`objcopy --only-keep-debug`), in `dir`.
    pub(crate) fn split(dir: &Path) -> (PathBuf, PathBuf) {
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let stripped = dir.join("stripped");
        let debug = dir.join("stripped.debug");
        objcopy(&[
            "--only-keep-debug".as_ref(),
            exe.as_os_str(),
            debug.as_os_str(),
        ]);
        objcopy(&[
            "--strip-debug".as_ref(),
            exe.as_os_str(),
            stripped.as_os_str(),
        ]);
        (stripped, debug)
    }

    pub(crate) fn as_if_loaded_from(object: &LoadedObject, file: &Path) -> LoadedObject {
        LoadedObject {
            file: Some(file.to_owned()),
            name: file.to_string_lossy().into_owned(),
            ..object.clone()
        }
    }

    #[test]
    fn a_file_replaced_on_disk_by_another_build_gives_no_lines() {
        let (objects, index, addresses) = probe();
        let object = objects.get(index).unwrap();
        assert!(!inside(&resolve(object, &addresses)).is_empty());
        // As if the code in memory were another build than the file now on disk (a
        // package upgraded under a running process).
        let mut loaded = object.clone();
        let mut id = loaded
            .build_id
            .clone()
            .expect("rustc links with a build ID");
        id[0] ^= 0xff;
        loaded.build_id = Some(id);
        let scratch = Scratch::new("replaced");
        assert!(
            resolve_with_roots(&loaded, &addresses, &[&scratch.0])
                .iter()
                .all(Vec::is_empty),
            "lines of another build were used"
        );
    }

    #[test]
    fn a_stripped_binarys_debug_file_is_found_by_build_id_or_debug_link() {
        let (objects, index, addresses) = probe();
        let object = objects.get(index).unwrap();
        let build_id = object
            .build_id
            .clone()
            .expect("rustc links with a build ID");
        let want = resolve(object, &addresses);
        assert!(!inside(&want).is_empty());

        let scratch = Scratch::new("split");
        let (stripped, debug) = split(&scratch.0);
        let loaded = as_if_loaded_from(object, &stripped);
        let root = scratch.0.join("debug-root");
        assert!(
            resolve_with_roots(&loaded, &addresses, &[&root])
                .iter()
                .all(Vec::is_empty),
            "stripped, and no debug file installed: no lines"
        );

        // Where distributions install it: <root>/.build-id/xx/yyyy.debug.
        let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        let by_id = root.join(".build-id").join(&hex[..2]);
        std::fs::create_dir_all(&by_id).unwrap();
        let installed = by_id.join(format!("{}.debug", &hex[2..]));
        std::fs::copy(&debug, &installed).unwrap();
        assert_eq!(resolve_with_roots(&loaded, &addresses, &[&root]), want);

        // A debug file of another build (same name, another build ID) is never used:
        // its lines would be wrong.
        let mut note = std::fs::read(&installed).unwrap();
        let id_at = note
            .windows(build_id.len())
            .position(|w| w == build_id.as_slice())
            .expect("the build ID is in the debug file");
        note[id_at] ^= 0xff;
        std::fs::write(&installed, &note).unwrap();
        assert!(
            resolve_with_roots(&loaded, &addresses, &[&root])
                .iter()
                .all(Vec::is_empty),
            "a debug file with another build ID was used"
        );
        std::fs::remove_file(&installed).unwrap();

        // By `.gnu_debuglink`, in `.debug/` next to the binary (as `objcopy
        // --add-gnu-debuglink` and Debian's `dh_strip` leave them).
        let bin = scratch.0.join("bin");
        std::fs::create_dir_all(bin.join(".debug")).unwrap();
        let linked = bin.join("service");
        objcopy(&[
            format!("--add-gnu-debuglink={}", debug.display()).as_ref(),
            stripped.as_os_str(),
            linked.as_os_str(),
        ]);
        std::fs::rename(&debug, bin.join(".debug").join("stripped.debug")).unwrap();
        let loaded = as_if_loaded_from(object, &linked);
        assert_eq!(resolve_with_roots(&loaded, &addresses, &[&root]), want);
    }
}
