//! Finding and reading the file that holds an object's DWARF: the object's own file, or
//! its separate debug file where distributions and `objcopy --only-keep-debug` put one
//! (by build ID, by `.gnu_debuglink`), never one of another build; its sections, borrowed
//! from a read-only map or inflated within a bound; and small scattered reads done with
//! `pread`, so that looking up a few names does not make the file resident.

use std::borrow::Cow;
use std::fs::File;
use std::io::Read as _;
use std::path::Path;

use gimli::{DebugInfoOffset, EndianSlice, LittleEndian};
use object::{CompressionFormat, Object as _, ObjectSection as _};

use crate::objects::hex;

pub(crate) type Reader<'a> = EndianSlice<'a, LittleEndian>;
pub(crate) type Dwarf<'a> = gimli::Dwarf<Reader<'a>>;
pub(crate) type Unit<'a> = gimli::Unit<Reader<'a>>;

/// Where distributions install separate debug files (by build ID under `.build-id/`, or
/// by the binary's own path).
pub(crate) const DEBUG_ROOT: &str = "/usr/lib/debug";

/// The most the compressed debug sections of one object may inflate to, together, for one
/// request. Distributions ship their debug files zlib-compressed, and inflating takes time
/// and memory in proportion: glibc's (libc6-dbg) would inflate to some 12 MB in about
/// 100 ms, on every request. Above this, the object keeps its symbol-table names; its
/// debug file can be decompressed once with `objcopy --decompress-debug-sections`, and is
/// then mapped like any other.
pub(crate) const MAX_INFLATED: u64 = 4 << 20;

/// A mapped ELF file with DWARF in it.
pub(crate) struct DebugFile {
    pub(crate) map: memmap2::Mmap,
    /// The same file, for positioned reads of small scattered pieces (see [`Scattered`]).
    pub(crate) file: File,
}

impl DebugFile {
    /// Maps `path` read-only.
    fn map(path: &Path) -> Option<DebugFile> {
        let file = File::open(path).ok()?;
        // SAFETY: the map is private and read-only, and lives only for one request. A file
        // truncated meanwhile would fault on access (SIGBUS), as for every reader of mapped
        // binaries (the dynamic loader maps them the same way): package managers and deploy
        // tools replace files by rename, which leaves this map on the old file; docs/limits.md
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
    pub(crate) fn find(
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
}

/// Where an uncompressed section lies in the file: its offset and size.
pub(crate) fn plain_range(elf: &object::File<'_>, name: &str) -> Option<(u64, u64)> {
    let section = elf.section_by_name(name)?;
    let range = section.compressed_file_range().ok()?;
    (range.format == CompressionFormat::None).then_some((range.offset, range.uncompressed_size))
}

/// Small pieces read at scattered places, by positioned reads rather than through the
/// map: the kernel maps 64 KiB of a cached file around every page a mapping touches
/// (fault-around, which `MADV_RANDOM` does not turn off), so a name looked up here and
/// there would make most of `.debug_str` resident, and walking every unit's header most
/// of `.debug_info`.
pub(crate) struct Scattered<'f> {
    pub(crate) file: &'f File,
    pub(crate) debug_info: Option<(u64, u64)>,
    pub(crate) debug_str: Option<(u64, u64)>,
}

impl Scattered<'_> {
    /// The string at `offset` in `.debug_str`, if the section is stored plain.
    pub(crate) fn string(&self, offset: usize) -> Option<String> {
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
    pub(crate) fn unit_starts(&self) -> Option<Vec<DebugInfoOffset>> {
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
pub(crate) const USED: [gimli::SectionId; 10] = [
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
pub(crate) fn section<'m>(elf: &object::File<'m>, name: &str) -> Option<Cow<'m, [u8]>> {
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
