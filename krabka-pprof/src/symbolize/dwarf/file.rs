//! Finding the file that holds an object's DWARF: the object's own file, or its separate
//! debug file where distributions and `objcopy --only-keep-debug` put one (by build ID, by
//! `.gnu_debuglink`), never one of another build; and where in it each DWARF section
//! lies, read from its ELF headers alone.
//!
//! Nothing here maps the file: a file truncated and rewritten in place while it is read
//! (`cp` over it) would turn a mapped read into `SIGBUS`. Files are opened as
//! `symbolize/opening.rs` opens them (regular files only, never waiting on a FIFO), the
//! headers read with positioned reads, and the sections' bytes later as
//! `dwarf/sections.rs` reads them.

use std::fs::File;
use std::path::Path;

use object::elf::{ELF_NOTE_GNU, ELFCOMPRESS_ZLIB, FileHeader64, NT_GNU_BUILD_ID, SHT_NOBITS};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _};
use object::{LittleEndian, ReadCache, ReadRef as _};

use crate::objects::hex;
use crate::symbolize::opening::open_regular;

/// Where distributions install separate debug files (by build ID under `.build-id/`, or
/// by the binary's own path).
pub(crate) const DEBUG_ROOT: &str = "/usr/lib/debug";

/// The most the compressed debug sections of one object may inflate to, together, for one
/// request. Distributions ship their debug files zlib-compressed, and inflating takes time
/// and memory in proportion: glibc's (libc6-dbg) would inflate to some 12 MB in about
/// 100 ms, on every request. Above this, the object keeps its symbol-table names; its
/// debug file can be decompressed once with `objcopy --decompress-debug-sections`, and is
/// then read like any other.
pub(crate) const MAX_INFLATED: u64 = 4 << 20;

/// The DWARF sections this module reads; the others (locations, macros, types, name
/// indexes) are never read.
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

/// An opened ELF file, and where its DWARF lies in it.
pub(crate) struct DebugFile {
    pub(crate) file: File,
    pub(crate) layout: Layout,
}

/// What the ELF headers of a file say: its build ID, its debug link, and where each of
/// the [`USED`] sections is.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    pub(crate) build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`'s file name.
    pub(crate) link: Option<Vec<u8>>,
    /// By the index of the section in [`USED`]; `None` where the file has no such section.
    pub(crate) sections: [Option<Placement>; USED.len()],
}

/// Where one DWARF section's bytes are in the file, and how they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Where the section starts in the file.
    pub(crate) offset: u64,
    /// Its size in memory: the inflated size of a compressed section.
    pub(crate) size: u64,
    pub(crate) stored: Stored,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The bytes as they are, at [`Placement::offset`].
    Plain,
    /// A zlib stream of `len` bytes at `at` (`SHF_COMPRESSED`, as `objcopy
    /// --compress-debug-sections` and distributions write them, or GNU's older
    /// `.zdebug_*` sections).
    Zlib { at: u64, len: u64 },
    /// Compressed otherwise (zstd), or placed outside the file: no lines from this file.
    Unusable,
}

impl DebugFile {
    /// Opens `path` and reads where its sections are.
    fn open(path: &Path) -> Option<DebugFile> {
        let file = open_regular(path)?;
        let layout = Layout::read(&file)?;
        Some(DebugFile { file, layout })
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
        let own = DebugFile::open(file)?;
        let on_disk = own.layout.build_id.clone();
        let replaced = matches!((loaded, &on_disk), (Some(loaded), Some(on_disk)) if loaded != on_disk.as_slice());
        if !replaced && own.layout.has_dwarf() {
            return Some(own);
        }
        let build_id = loaded.map(<[u8]>::to_vec).or(on_disk);
        let link = own
            .layout
            .link
            .as_deref()
            .map(|name| String::from_utf8_lossy(name).into_owned())
            // A link is a file name, never a path elsewhere; a replaced file's link names
            // the new build's debug file.
            .filter(|name| !replaced && !name.is_empty() && !name.contains('/'));
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
                let debug = DebugFile::open(&candidate)?;
                // A debug file of another build gives wrong lines: worse than none.
                let same_build = match (&build_id, &debug.layout.build_id) {
                    (Some(wanted), Some(theirs)) => wanted == theirs,
                    _ => true,
                };
                (same_build && debug.layout.has_dwarf()).then_some(debug)
            })
    }
}

impl Layout {
    /// Reads the ELF file header, the section headers and their names, the build ID note
    /// and the debug link, each with a read of its own size (through `object`'s
    /// `ReadCache`, dropped on return): a few kilobytes however large the sections. `None`
    /// if it is not a 64-bit little-endian ELF file (the only kind this crate symbolizes)
    /// or its headers cannot be read.
    fn read(file: &File) -> Option<Layout> {
        let size = file.metadata().ok()?.len();
        let cache = ReadCache::new(file);
        let data = &cache;
        let header = FileHeader64::<LittleEndian>::parse(data).ok()?;
        let endian = header.endian().ok()?;
        let sections = header.sections(endian, data).ok()?;
        let mut layout = Layout::default();
        for section in sections.iter() {
            if layout.build_id.is_none()
                && let Ok(Some(mut notes)) = section.notes(endian, data)
            {
                layout.build_id = build_id(&mut notes);
            }
            let Ok(name) = sections.section_name(endian, section) else {
                continue;
            };
            if name == b".gnu_debuglink" {
                layout.link = section
                    .data(endian, data)
                    .ok()
                    .and_then(|bytes| bytes.split(|b| *b == 0).next())
                    .map(<[u8]>::to_vec);
                continue;
            }
            let Some((index, gnu_compressed)) = used(name) else {
                continue;
            };
            // A plain section wins over GNU's compressed copy of it.
            if gnu_compressed && layout.sections[index].is_some() {
                continue;
            }
            let Some((offset, stored_size)) = section
                .file_range(endian)
                .filter(|_| section.sh_type(endian) != SHT_NOBITS)
            else {
                continue;
            };
            let inside = offset
                .checked_add(stored_size)
                .is_some_and(|end| end <= size);
            let placement = if !inside {
                Placement {
                    offset,
                    size: stored_size,
                    stored: Stored::Unusable,
                }
            } else if let Ok(Some((compression, at, len))) = section.compression(endian, data) {
                use object::read::elf::CompressionHeader as _;
                Placement {
                    offset,
                    size: compression.ch_size(endian),
                    stored: if compression.ch_type(endian) == ELFCOMPRESS_ZLIB {
                        Stored::Zlib { at, len }
                    } else {
                        Stored::Unusable
                    },
                }
            } else if gnu_compressed {
                // "ZLIB", then the inflated size, big-endian.
                let head = data
                    .read_bytes_at(offset, 12)
                    .ok()
                    .filter(|_| stored_size >= 12);
                match head {
                    Some(head) if &head[..4] == b"ZLIB" => Placement {
                        offset,
                        size: u64::from_be_bytes(head[4..].try_into().expect("8 bytes")),
                        stored: Stored::Zlib {
                            at: offset + 12,
                            len: stored_size - 12,
                        },
                    },
                    _ => Placement {
                        offset,
                        size: stored_size,
                        stored: Stored::Unusable,
                    },
                }
            } else {
                Placement {
                    offset,
                    size: stored_size,
                    stored: Stored::Plain,
                }
            };
            layout.sections[index] = Some(placement);
        }
        if sections.is_empty()
            && let Ok(segments) = header.program_headers(endian, data)
        {
            for segment in segments {
                if let Ok(Some(mut notes)) = segment.notes(endian, data) {
                    layout.build_id = build_id(&mut notes);
                    if layout.build_id.is_some() {
                        break;
                    }
                }
            }
        }
        Some(layout)
    }

    /// Whether the file has the DWARF this module reads.
    pub(crate) fn has_dwarf(&self) -> bool {
        [gimli::SectionId::DebugInfo, gimli::SectionId::DebugLine]
            .iter()
            .all(|id| self.placement(*id).is_some_and(|p| p.size > 0))
    }

    /// Where section `id` is, if the file has it.
    pub(crate) fn placement(&self, id: gimli::SectionId) -> Option<Placement> {
        let index = USED.iter().position(|used| *used == id)?;
        self.sections[index]
    }
}

/// The GNU build ID among `notes`.
fn build_id(
    notes: &mut object::read::elf::NoteIterator<'_, FileHeader64<LittleEndian>>,
) -> Option<Vec<u8>> {
    while let Ok(Some(note)) = notes.next() {
        if note.name() == ELF_NOTE_GNU && note.n_type(LittleEndian) == NT_GNU_BUILD_ID {
            return Some(note.desc().to_vec());
        }
    }
    None
}

/// The index in [`USED`] of the section named `name` (`.debug_*`), and whether it is
/// GNU's compressed copy of one (`.zdebug_*`).
fn used(name: &[u8]) -> Option<(usize, bool)> {
    let (plain, gnu_compressed) = match name.strip_prefix(b".zdebug_") {
        Some(rest) => (rest, true),
        None => (name.strip_prefix(b".debug_")?, false),
    };
    let index = USED
        .iter()
        .position(|id| id.name().as_bytes().strip_prefix(b".debug_") == Some(plain))?;
    Some((index, gnu_compressed))
}
