//! DWARF sections read from the file only where a lookup reads them, and gimli's reader
//! over them ([`Paged`]): resident memory is what the wanted addresses need, no read can
//! fault, and a malformed file costs bounded work.
//!
//! Each plain section gets an anonymous private map of its own size (`MAP_NORESERVE`:
//! address space only; a page costs memory once written). gimli reads a section through
//! [`Paged`], and every read first makes sure its bytes are in: the blocks it touches
//! that are not yet are read from the file with `pread`, 4 KiB at a time, 64 KiB when the
//! reads go forwards (a unit's DIEs, its line program). So what becomes resident is what
//! the lookup parses: the units that hold the wanted addresses, their abbreviations,
//! line programs and range lists, never the whole file, and never the kernel's 64 KiB of
//! fault-around per touched page that a map of the file costs. The file is never
//! mapped: one truncated meanwhile gives a short read, which ends the lookup as a parse
//! error would, where a map would have raised `SIGBUS`. Compressed sections are inflated
//! whole (within `MAX_INFLATED`). Everything is unmapped when the lookup ends, and
//! [`Sections::release`] gives pages back earlier.
//!
//! Each section may hand out at most eight times its size, plus 4 MiB: an honest lookup
//! reads each byte a few times at most, while a crafted file whose range lists, units
//! or line programs point back at the same bytes over and over would otherwise keep the
//! lookup running for as long as it likes. Once spent, every read of the section fails,
//! and the lookup ends with what it found.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::ptr::NonNull;

use gimli::{DebugInfoOffset, LittleEndian, ReaderOffsetId, SectionId};

use super::file::{DebugFile, MAX_INFLATED, Placement, Stored, USED};

pub(crate) type Reader<'a> = Paged<'a>;
pub(crate) type Dwarf<'a> = gimli::Dwarf<Reader<'a>>;
pub(crate) type Unit<'a> = gimli::Unit<Reader<'a>>;

/// What is read from the file at once, and what is known to be in or not.
const BLOCK: usize = 4096;
/// The most blocks read at once, when a read continues from as many blocks before it.
const READ_AHEAD: usize = 16;
/// The most units [`Paged::unit_starts`] lists (the benchmark's service has 1,655).
const MAX_UNITS: usize = 1 << 20;
/// The longest string read from `.debug_str` by [`Paged::string_at`].
const MAX_STRING: usize = 1 << 16;

/// The [`USED`] sections of one debug file, for one lookup.
pub(crate) struct Sections<'f> {
    /// In the order of [`USED`].
    used: Vec<Section<'f>>,
    /// What gimli gets for the sections this module never reads.
    empty: Section<'f>,
}

impl<'f> Sections<'f> {
    /// `debug`'s sections, nothing of them read yet but compressed ones, which are
    /// inflated now; `None` if one cannot be (zstd, more than [`MAX_INFLATED`]
    /// together, decided before inflating any) or placed outside the file.
    pub(crate) fn load(debug: &'f DebugFile) -> Option<Sections<'f>> {
        let placements = USED.map(|id| debug.layout.placement(id));
        let inflated = placements
            .iter()
            .flatten()
            .filter(|p| matches!(p.stored, Stored::Zlib { .. }))
            .fold(0u64, |sum, p| sum.saturating_add(p.size));
        if inflated > MAX_INFLATED {
            return None;
        }
        let used = placements
            .iter()
            .map(|placement| match placement {
                Some(placement) => Section::new(&debug.file, *placement),
                None => Some(Section::empty()),
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Sections {
            used,
            empty: Section::empty(),
        })
    }

    /// gimli's view of the sections.
    pub(crate) fn dwarf(&self) -> Dwarf<'_> {
        let Ok(dwarf) = gimli::Dwarf::load(|id| {
            let section = self.section(id).unwrap_or(&self.empty);
            Ok::<_, std::convert::Infallible>(Paged::whole(section))
        });
        dwarf
    }

    fn section(&self, id: SectionId) -> Option<&Section<'f>> {
        USED.iter()
            .position(|used| *used == id)
            .map(|index| &self.used[index])
    }

    /// The bytes read from the file and held now, in all sections.
    pub(crate) fn resident(&self) -> usize {
        self.used.iter().map(Section::resident).sum()
    }

    /// Gives back the memory of what was read of section `id`; what is read of it later
    /// is read from the file again.
    pub(crate) fn release(&self, id: SectionId) {
        if let Some(section) = self.section(id) {
            section.release();
        }
    }

    /// [`Sections::release`] of every section.
    pub(crate) fn release_all(&self) {
        self.used.iter().for_each(Section::release);
    }
}

/// One section's bytes in memory, as far as they have been read.
pub(crate) struct Section<'f> {
    /// The region's first byte, or the inflated bytes'.
    bytes: NonNull<u8>,
    len: usize,
    /// One bit per [`BLOCK`]: whether it holds the file's bytes (every bit, for bytes
    /// inflated into memory).
    filled: Box<[Cell<u64>]>,
    /// Bytes the section may still hand out.
    budget: Cell<u64>,
    source: Source<'f>,
}

enum Source<'f> {
    /// Read on demand from `file`, where the section starts at `offset`.
    File {
        file: &'f File,
        offset: u64,
        region: Region,
        /// Bytes of the region filled.
        resident: Cell<usize>,
    },
    /// All in memory already: inflated from a compressed section, or empty. Read
    /// through [`Section::bytes`].
    Memory { _owned: Vec<u8> },
}

impl<'f> Section<'f> {
    fn empty() -> Section<'f> {
        Section::in_memory(Vec::new())
    }

    fn in_memory(owned: Vec<u8>) -> Section<'f> {
        let len = owned.len();
        Section {
            // A vector's buffer stays where it is when the vector moves; this one is
            // never changed again.
            bytes: NonNull::new(owned.as_ptr().cast_mut()).expect("a vector's buffer"),
            len,
            filled: (0..words_for(len)).map(|_| Cell::new(u64::MAX)).collect(),
            budget: Cell::new(budget_of(len)),
            source: Source::Memory { _owned: owned },
        }
    }

    fn new(file: &'f File, placement: Placement) -> Option<Section<'f>> {
        let len = usize::try_from(placement.size).ok()?;
        match placement.stored {
            Stored::Unusable => None,
            Stored::Zlib { at, len: stream } => {
                let mut inflated = Vec::with_capacity(len);
                let compressed = Positioned {
                    file,
                    at,
                    left: stream,
                };
                flate2::read::ZlibDecoder::new(compressed)
                    .take(placement.size)
                    .read_to_end(&mut inflated)
                    .ok()?;
                Some(Section::in_memory(inflated))
            }
            Stored::Plain if len == 0 => Some(Section::empty()),
            Stored::Plain => {
                let region = Region::new(len)?;
                Some(Section {
                    bytes: region.at,
                    len,
                    filled: (0..words_for(len)).map(|_| Cell::new(0)).collect(),
                    budget: Cell::new(budget_of(len)),
                    source: Source::File {
                        file,
                        offset: placement.offset,
                        region,
                        resident: Cell::new(0),
                    },
                })
            }
        }
    }

    fn resident(&self) -> usize {
        match &self.source {
            Source::File { resident, .. } => resident.get(),
            Source::Memory { .. } => 0,
        }
    }

    fn release(&self) {
        if let Source::File {
            region, resident, ..
        } = &self.source
        {
            self.filled.iter().for_each(|word| word.set(0));
            resident.set(0);
            region.release();
        }
    }

    /// Charges `n` bytes to the budget, and makes `at..at + n` (inside the section) hold
    /// the file's bytes. `Err` when the budget is spent, or the file no longer holds them
    /// (cut short since it was opened) or cannot be read.
    #[inline(always)]
    fn take(&self, at: usize, n: usize) -> gimli::Result<()> {
        let left = self.budget.get();
        if n as u64 > left {
            return Err(gimli::Error::Io);
        }
        self.budget.set(left - n as u64);
        if n == 0 || covered(&self.filled, at, n) {
            return Ok(());
        }
        self.fill(at, n)
    }

    /// Reads the blocks of `at..at + n` not yet in, and more ahead of them when they
    /// continue a block already in.
    #[cold]
    fn fill(&self, at: usize, n: usize) -> gimli::Result<()> {
        let Source::File {
            file,
            offset,
            resident,
            ..
        } = &self.source
        else {
            return Ok(());
        };
        let filled = &self.filled;
        let blocks = self.len.div_ceil(BLOCK);
        let last = (at + n - 1) / BLOCK;
        let mut block = at / BLOCK;
        while block <= last {
            if is_set(filled, block) {
                block += 1;
                continue;
            }
            // As many blocks as were read just before this one, up to READ_AHEAD: a read
            // that goes on doubles its next read, and one that stops soon wastes little.
            let ahead = (1..=READ_AHEAD)
                .take_while(|back| block >= *back && is_set(filled, block - back))
                .count()
                .max(1);
            let mut end = block + 1;
            while end < blocks && !is_set(filled, end) && (end <= last || end < block + ahead) {
                end += 1;
            }
            let (from, to) = (block * BLOCK, (end * BLOCK).min(self.len));
            // SAFETY: `from..to` lies inside the region (`to <= len`), and none of its
            // blocks is filled. References into the region are made only after `take`
            // (`Paged::bytes`) or to filled blocks (`Section::peek`), each for one copy
            // that ends before the next read, and `Section` is not `Sync`: no reference
            // to these bytes exists while they are written.
            let into =
                unsafe { std::slice::from_raw_parts_mut(self.bytes.as_ptr().add(from), to - from) };
            if end - block > 1 {
                // SAFETY: advice on pages of the region about to be written, which no
                // reference covers (above): it makes them resident in one call rather
                // than one fault each while `pread` writes them, and changes no byte.
                // Kernels before 5.14 do not know it and fault them in as they are
                // written.
                unsafe {
                    libc::madvise(
                        into.as_mut_ptr().cast(),
                        into.len(),
                        libc::MADV_POPULATE_WRITE,
                    )
                };
            }
            let got = read_fully(file, into, offset + from as u64);
            // Only whole blocks count as in (and the section's last, if it ends inside one).
            let complete = if from + got == self.len {
                end
            } else {
                block + got / BLOCK
            };
            for b in block..complete {
                set(filled, b);
            }
            resident.set(resident.get() + (complete - block) * BLOCK);
            // The bytes asked for must all be there (the rest of a block cut short by
            // the end of the file need not: it stays unfilled, and is read again if
            // asked for).
            if from + got < (at + n).min(to) {
                return Err(gimli::Error::Io);
            }
            block = end;
        }
        Ok(())
    }

    /// Copies the bytes at `at` into `into` without keeping them: from memory where they
    /// are in, else by a positioned read of the file. How many there were; `None` past
    /// the section's end or once the budget is spent.
    fn peek(&self, at: usize, into: &mut [u8]) -> Option<usize> {
        let n = into.len().min(self.len.checked_sub(at)?);
        self.budget.set(self.budget.get().checked_sub(n as u64)?);
        let in_memory = n == 0 || covered(&self.filled, at, n);
        match &self.source {
            Source::File { file, offset, .. } if !in_memory => {
                Some(read_fully(file, &mut into[..n], offset + at as u64))
            }
            _ => {
                // SAFETY: `at..at + n` is inside the section and in memory (filled blocks,
                // or inflated bytes); the reference lives for this copy only.
                let bytes = unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().add(at), n) };
                into[..n].copy_from_slice(bytes);
                Some(n)
            }
        }
    }
}

/// What a section of `len` bytes may hand out in one lookup.
fn budget_of(len: usize) -> u64 {
    (len as u64).saturating_mul(8).saturating_add(4 << 20)
}

/// How many words of one bit per block `len` bytes take.
fn words_for(len: usize) -> usize {
    len.div_ceil(BLOCK).div_ceil(64)
}

#[inline(always)]
fn is_set(filled: &[Cell<u64>], block: usize) -> bool {
    filled[block / 64].get() >> (block % 64) & 1 == 1
}

fn set(filled: &[Cell<u64>], block: usize) {
    let word = &filled[block / 64];
    word.set(word.get() | 1 << (block % 64));
}

/// Whether every block of `at..at + n` (`n > 0`) is filled.
#[inline(always)]
fn covered(filled: &[Cell<u64>], at: usize, n: usize) -> bool {
    let (first, last) = (at / BLOCK, (at + n - 1) / BLOCK);
    // Most reads are of a few bytes, inside one block.
    if first == last {
        return is_set(filled, first);
    }
    (first..=last).all(|block| is_set(filled, block))
}

/// Fills `into` from `file` at `at`, as far as the file goes: how many bytes were read
/// (fewer at the end of the file, or where it cannot be read).
fn read_fully(file: &File, into: &mut [u8], at: u64) -> usize {
    let mut done = 0;
    while done < into.len() {
        match file.read_at(&mut into[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    done
}

/// A compressed section's stream, read from the file in pieces as it inflates.
struct Positioned<'f> {
    file: &'f File,
    at: u64,
    left: u64,
}

impl std::io::Read for Positioned<'_> {
    fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
        let n = into
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let got = self.file.read_at(&mut into[..n], self.at)?;
        self.at += got as u64;
        self.left -= got as u64;
        Ok(got)
    }
}

/// An anonymous private map: address space only, until its pages are written.
struct Region {
    at: NonNull<u8>,
    len: usize,
}

impl Region {
    fn new(len: usize) -> Option<Region> {
        // SAFETY: asks for a new mapping at an address the kernel chooses; no memory of
        // this process changes.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: advice on the mapping just made, which nothing else uses. Without it,
        // one 4 KiB block written where transparent huge pages are on could make 2 MiB
        // resident.
        unsafe { libc::madvise(at, len, libc::MADV_NOHUGEPAGE) };
        Some(Region {
            at: NonNull::new(at.cast())?,
            len,
        })
    }

    /// Frees the pages written; the region reads as zeros again.
    fn release(&self) {
        // SAFETY: the region is this map's own; the caller (`Section::release`) has
        // marked every block unfilled first, so nothing reads these bytes until they are
        // read from the file again, and no reference into them is held (see `fill`).
        unsafe { libc::madvise(self.at.as_ptr().cast(), self.len, libc::MADV_DONTNEED) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the map made in `Region::new`, unmapped once: every `Paged` reader
        // borrows the `Section` that owns this region, so none outlives it.
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
    }
}

/// gimli's reader of a [`Section`]: a range of it, whose bytes are read from the file as
/// they are read from here.
#[derive(Clone, Copy)]
pub(crate) struct Paged<'d> {
    section: &'d Section<'d>,
    start: usize,
    len: usize,
}

impl fmt::Debug for Paged<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paged")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl<'d> Paged<'d> {
    fn whole(section: &'d Section<'d>) -> Paged<'d> {
        Paged {
            section,
            start: 0,
            len: section.len,
        }
    }

    fn eof(&self) -> gimli::Error {
        gimli::Error::UnexpectedEof(gimli::Reader::offset_id(self))
    }

    /// The next `n` bytes, in memory: to be copied at once.
    #[inline(always)]
    fn bytes(&self, n: usize) -> gimli::Result<&[u8]> {
        if n > self.len {
            return Err(self.eof());
        }
        self.section.take(self.start, n)?;
        // SAFETY: `start..start + n` is inside the section, and `take` made it hold the
        // file's bytes (read just now, or in filled blocks; or they are inflated bytes).
        // The region is written only by `fill` and `Sections::release`, never while a
        // reader's method runs, and the reference does not outlive the caller's copy.
        Ok(unsafe { std::slice::from_raw_parts(self.section.bytes.as_ptr().add(self.start), n) })
    }

    /// The NUL-terminated string at `offset` in this section (up to 64 KiB), read without
    /// keeping it: names are looked up at scattered places, and each block of
    /// `.debug_str` made resident for a name would hold some 4 KiB for a few dozen bytes.
    pub(crate) fn string_at(&self, offset: usize) -> Option<String> {
        let mut found = Vec::new();
        let mut chunk = [0u8; 256];
        while found.len() < MAX_STRING {
            let n = self
                .section
                .peek(offset.checked_add(found.len())?, &mut chunk)?;
            if n == 0 {
                return None;
            }
            if let Some(nul) = chunk[..n].iter().position(|b| *b == 0) {
                found.extend_from_slice(&chunk[..nul]);
                return Some(String::from_utf8_lossy(&found).into_owned());
            }
            found.extend_from_slice(&chunk[..n]);
        }
        None
    }

    /// The start of every unit in this (`.debug_info`) section, from their lengths alone,
    /// read without keeping them: walking every unit's header through the blocks would
    /// make a block of each resident. At most [`MAX_UNITS`].
    pub(crate) fn unit_starts(&self) -> Option<Vec<DebugInfoOffset>> {
        let mut starts = Vec::new();
        let mut offset = 0usize;
        let mut length = [0u8; 12];
        // Every unit is at least its 4-byte length long, so a malformed length can only
        // end the walk, never make it loop.
        while offset.checked_add(4)? <= self.len && starts.len() < MAX_UNITS {
            if self.section.peek(offset, &mut length)? < 12 {
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
            starts.push(DebugInfoOffset(offset));
            offset = offset
                .checked_add(header)?
                .checked_add(usize::try_from(length).ok()?)?;
        }
        Some(starts)
    }
}

impl<'d> gimli::Reader for Paged<'d> {
    type Endian = LittleEndian;
    type Offset = usize;

    fn endian(&self) -> LittleEndian {
        LittleEndian
    }

    fn len(&self) -> usize {
        self.len
    }

    fn empty(&mut self) {
        self.len = 0;
    }

    fn truncate(&mut self, len: usize) -> gimli::Result<()> {
        if len > self.len {
            return Err(self.eof());
        }
        self.len = len;
        Ok(())
    }

    fn offset_from(&self, base: &Self) -> usize {
        self.start.wrapping_sub(base.start)
    }

    fn offset_id(&self) -> ReaderOffsetId {
        ReaderOffsetId(self.section.bytes.as_ptr() as u64 + self.start as u64)
    }

    fn lookup_offset_id(&self, id: ReaderOffsetId) -> Option<usize> {
        let here = self.section.bytes.as_ptr() as u64 + self.start as u64;
        let at = id.0.checked_sub(here)?;
        (at <= self.len as u64).then_some(at as usize)
    }

    /// Looks through what is in memory, and reads what is not without keeping it: gimli
    /// finds the end of every string it is given this way, most of them names (a unit's,
    /// its directory's) read at scattered places and never used.
    fn find(&self, byte: u8) -> gimli::Result<usize> {
        let mut done = 0;
        let mut chunk = [0u8; 256];
        while done < self.len {
            let at = self.start + done;
            let n = (BLOCK - at % BLOCK).min(self.len - done);
            let found = if covered(&self.section.filled, at, n) {
                let piece = Paged {
                    start: at,
                    len: n,
                    ..*self
                };
                piece.bytes(n)?.iter().position(|b| *b == byte)
            } else {
                let n = n.min(chunk.len());
                let got = self
                    .section
                    .peek(at, &mut chunk[..n])
                    .ok_or(gimli::Error::Io)?;
                if got < n {
                    return Err(gimli::Error::Io);
                }
                let found = chunk[..n].iter().position(|b| *b == byte);
                if found.is_none() {
                    done += n;
                    continue;
                }
                found
            };
            if let Some(i) = found {
                return Ok(done + i);
            }
            done += n;
        }
        Err(self.eof())
    }

    fn skip(&mut self, len: usize) -> gimli::Result<()> {
        if len > self.len {
            return Err(self.eof());
        }
        self.start += len;
        self.len -= len;
        Ok(())
    }

    fn split(&mut self, len: usize) -> gimli::Result<Self> {
        let mut head = *self;
        head.truncate(len)?;
        self.skip(len)?;
        Ok(head)
    }

    fn to_slice(&self) -> gimli::Result<Cow<'_, [u8]>> {
        Ok(Cow::Owned(self.bytes(self.len)?.to_vec()))
    }

    fn to_string(&self) -> gimli::Result<Cow<'_, str>> {
        String::from_utf8(self.bytes(self.len)?.to_vec())
            .map(Cow::Owned)
            .map_err(|_| gimli::Error::BadUtf8)
    }

    fn to_string_lossy(&self) -> gimli::Result<Cow<'_, str>> {
        Ok(Cow::Owned(
            String::from_utf8_lossy(self.bytes(self.len)?).into_owned(),
        ))
    }

    #[inline(always)]
    fn read_slice(&mut self, buf: &mut [u8]) -> gimli::Result<()> {
        buf.copy_from_slice(self.bytes(buf.len())?);
        self.start += buf.len();
        self.len -= buf.len();
        Ok(())
    }

    #[inline(always)]
    fn read_u8(&mut self) -> gimli::Result<u8> {
        let byte = self.bytes(1)?[0];
        self.start += 1;
        self.len -= 1;
        Ok(byte)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::fs::FileExt as _;

    use gimli::{Reader as _, Section as _};

    use super::super::file::{Placement, Stored};
    use super::super::tests::Scratch;
    use super::*;

    /// Bytes no compressor shrinks, the same on every run.
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    /// A file of `bytes` after `at` bytes of 0xAA and before 100 of 0xBB, opened to read,
    /// in `scratch` (each test's has a name no other DWARF test uses: a `Scratch` removes
    /// its directory first).
    fn file_with(scratch: &Scratch, at: usize, bytes: &[u8]) -> File {
        let path = scratch.0.join("file");
        let mut all = vec![0xAA; at];
        all.extend_from_slice(bytes);
        all.extend_from_slice(&[0xBB; 100]);
        std::fs::write(&path, all).unwrap();
        File::open(&path).unwrap()
    }

    fn plain(len: usize) -> Placement {
        Placement {
            offset: 0,
            size: len as u64,
            stored: Stored::Plain,
        }
    }

    /// How many pages of the section's region are in memory, by the kernel's word
    /// (`mincore`).
    fn pages_in(section: &Section<'_>) -> usize {
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let mut in_memory = vec![0u8; section.len.div_ceil(page)];
        // SAFETY: the region is a live map of `len` bytes starting on a page; the vector
        // has a byte for each of its pages.
        let rc = unsafe {
            libc::mincore(
                section.bytes.as_ptr().cast(),
                section.len,
                in_memory.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        in_memory.iter().filter(|b| **b & 1 == 1).count()
    }

    #[test]
    fn what_is_read_is_resident_until_its_section_is_given_back() {
        let scratch = Scratch::new("released");
        let bytes = noise(64 * 1024);
        let file = file_with(&scratch, 0, &bytes);
        let mut used: Vec<Section<'_>> = USED.iter().map(|_| Section::empty()).collect();
        let line = USED
            .iter()
            .position(|id| *id == SectionId::DebugLine)
            .unwrap();
        used[line] = Section::new(&file, plain(bytes.len())).unwrap();
        let sections = Sections {
            used,
            empty: Section::empty(),
        };
        let dwarf = sections.dwarf();
        let mut reader = *dwarf.debug_line.reader();
        assert_eq!(format!("{reader:?}"), "Paged { start: 0, len: 65536 }");
        reader.skip(20_000).unwrap();
        let mut six = [0u8; 6];
        reader.read_slice(&mut six).unwrap();
        assert_eq!(six, bytes[20_000..][..6]);
        // One block read, one page written.
        assert_eq!(sections.resident(), BLOCK);
        assert!(pages_in(&sections.used[line]) >= 1);

        // Another section given back: this one's stays.
        sections.release(SectionId::DebugInfo);
        assert_eq!(sections.resident(), BLOCK);
        sections.release(SectionId::DebugLine);
        assert_eq!(sections.resident(), 0);
        assert_eq!(pages_in(&sections.used[line]), 0, "pages given back");
        // Read again as the file holds it.
        let mut again = *dwarf.debug_line.reader();
        again.skip(20_000).unwrap();
        again.read_slice(&mut six).unwrap();
        assert_eq!(six, bytes[20_000..][..6]);
    }

    #[test]
    fn an_empty_read_reads_nothing_and_the_budget_can_be_spent_to_its_last_byte() {
        let scratch = Scratch::new("budget");
        let bytes = noise(5000);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let mut reader = Paged::whole(&section);
        reader.skip(100).unwrap();
        reader.read_slice(&mut []).unwrap();
        assert_eq!(section.resident(), 0, "an empty read made a block resident");

        let mut block = [0u8; 4096];
        let mut reads = 0u64;
        while reads < 1 << 20 && Paged::whole(&section).read_slice(&mut block).is_ok() {
            reads += 1;
        }
        let budget = budget_of(bytes.len());
        assert_eq!(reads, budget / 4096);
        // What is left of the budget can still be read, and not a byte more.
        let mut rest = vec![0u8; (budget % 4096) as usize];
        Paged::whole(&section).read_slice(&mut rest).unwrap();
        assert!(Paged::whole(&section).read_slice(&mut [0u8]).is_err());
    }

    #[test]
    fn bytes_in_memory_are_read_from_memory_and_the_rest_from_the_file_as_it_is_now() {
        let scratch = Scratch::new("kept");
        let bytes = noise(3 * BLOCK);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let mut first = Paged::whole(&section);
        first.read_slice(&mut [0u8; 6]).unwrap();
        assert_eq!(section.resident(), BLOCK, "the first block only");
        // The last ten bytes of the first block, and one five bytes into the second,
        // rewritten in the file with a byte none of them (nor the 90 before) held.
        let around = &bytes[BLOCK - 100..BLOCK + 6];
        let new = (0..=255u8).find(|b| !around.contains(b)).unwrap();
        let writable = std::fs::OpenOptions::new()
            .write(true)
            .open(scratch.0.join("file"))
            .unwrap();
        writable
            .write_all_at(&[new; 10], (BLOCK - 10) as u64)
            .unwrap();
        writable.write_all_at(&[new], (BLOCK + 5) as u64).unwrap();
        // A reader of the ten finds what was read, in memory; one that goes on finds the
        // new byte where the file holds it now.
        let mut end_of_block = Paged::whole(&section);
        end_of_block.skip(BLOCK - 10).unwrap();
        let mut ten = end_of_block;
        ten.truncate(10).unwrap();
        assert!(ten.find(new).is_err(), "read from the file again");
        assert_eq!(end_of_block.find(new).unwrap(), 15);
    }

    #[test]
    fn a_read_takes_its_own_blocks_and_reads_ahead_as_far_as_the_reads_before_it_went() {
        let scratch = Scratch::new("ahead");
        let bytes = noise(40 * BLOCK);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let read_at = |at: usize, n: usize| {
            let mut reader = Paged::whole(&section);
            reader.skip(at).unwrap();
            let mut into = vec![0u8; n];
            reader.read_slice(&mut into).unwrap();
            assert!(into == bytes[at..at + n], "{n} bytes at {at}");
            section.resident() / BLOCK
        };
        // Bytes that end where their block ends: that block alone.
        assert_eq!(read_at(BLOCK - 6, 6), 1);
        // Reads that go on from the blocks before them read as many again, up to 16.
        let ahead: Vec<usize> = [1, 2, 4, 8, 16, 32]
            .into_iter()
            .map(|block| read_at(block * BLOCK, 1))
            .collect();
        assert_eq!(ahead, [2, 4, 8, 16, 32, 40]);

        // A read over three blocks of a fresh section reads those three.
        let fresh = Section::new(&file, plain(bytes.len())).unwrap();
        let mut reader = Paged::whole(&fresh);
        reader.skip(100).unwrap();
        let mut into = vec![0u8; 2 * BLOCK + 100];
        reader.read_slice(&mut into).unwrap();
        assert!(into == bytes[100..][..into.len()]);
        assert_eq!(fresh.resident(), 3 * BLOCK);
    }

    #[test]
    fn a_string_is_read_up_to_64_kib() {
        let scratch = Scratch::new("strings");
        let mut bytes = vec![b'a'; MAX_STRING + 10];
        bytes.push(0);
        let short = bytes.len();
        bytes.extend_from_slice(&[b'b'; 100]);
        bytes.push(0);
        let longest = bytes.len();
        bytes.extend_from_slice(&vec![b'c'; MAX_STRING - 1]);
        bytes.push(0);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let strings = Paged::whole(&section);
        assert_eq!(strings.string_at(0), None, "longer than 64 KiB");
        assert_eq!(strings.string_at(short), Some("b".repeat(100)));
        assert_eq!(strings.string_at(longest), Some("c".repeat(MAX_STRING - 1)));
        assert_eq!(strings.string_at(bytes.len()), None, "past the end");
    }

    #[test]
    fn the_last_block_of_a_section_counts_whole_once_read() {
        let scratch = Scratch::new("last");
        let bytes = noise(BLOCK + 904);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let mut tail = Paged::whole(&section);
        tail.skip(bytes.len() - 6).unwrap();
        let mut six = [0u8; 6];
        tail.read_slice(&mut six).unwrap();
        assert_eq!(six, bytes[bytes.len() - 6..]);
        assert_eq!(section.resident(), BLOCK);
        assert!(is_set(&section.filled, 1), "the last block is in");
        assert!(!is_set(&section.filled, 0));
    }

    #[test]
    fn units_are_listed_from_their_lengths_and_a_section_cut_inside_a_header_lists_none() {
        let scratch = Scratch::new("units");
        let mut bytes = Vec::new();
        for (length, wide) in [(10u64, false), (20, false), (30, true), (8, false)] {
            if wide {
                bytes.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
                bytes.extend_from_slice(&length.to_le_bytes());
            } else {
                bytes.extend_from_slice(&(length as u32).to_le_bytes());
            }
            bytes.extend(std::iter::repeat_n(0x11, length as usize));
        }
        let whole = bytes.len();
        bytes.extend_from_slice(&[0; 4]);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(whole)).unwrap();
        let starts = |section: &Section<'_>| {
            Paged::whole(section)
                .unit_starts()
                .map(|starts| starts.iter().map(|s| s.0).collect::<Vec<_>>())
        };
        assert_eq!(starts(&section), Some(vec![0, 14, 38, 80]));
        // Four bytes more: the start of a header with no room for one.
        let cut = Section::new(&file, plain(whole + 4)).unwrap();
        assert_eq!(starts(&cut), None);
        // A length the format reserves.
        let mut reserved = 0xffff_fff0u32.to_le_bytes().to_vec();
        reserved.extend_from_slice(&[0; 12]);
        let file = file_with(&scratch, 0, &reserved);
        let section = Section::new(&file, plain(reserved.len())).unwrap();
        assert_eq!(starts(&section), None);

        // No more than MAX_UNITS, however many there are.
        let units: Vec<u8> =
            std::iter::repeat_n([8u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], MAX_UNITS + 2)
                .flatten()
                .collect();
        let file = file_with(&scratch, 0, &units);
        let section = Section::new(&file, plain(units.len())).unwrap();
        let listed = starts(&section).unwrap();
        assert_eq!(listed.len(), MAX_UNITS);
        assert_eq!(listed[MAX_UNITS - 1], 12 * (MAX_UNITS - 1));
    }

    #[test]
    fn a_readers_offsets_are_its_distance_from_the_sections_start() {
        let scratch = Scratch::new("offsets");
        let bytes = noise(100);
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let whole = Paged::whole(&section);
        let mut ten = whole;
        ten.skip(10).unwrap();
        assert_eq!(whole.endian(), LittleEndian);
        assert_eq!(ten.offset_from(&whole), 10);
        assert_eq!(ten.offset_id().0 - whole.offset_id().0, 10);
        assert_eq!(whole.lookup_offset_id(ten.offset_id()), Some(10));
        assert_eq!(ten.lookup_offset_id(whole.offset_id()), None);
        let end = ReaderOffsetId(whole.offset_id().0 + 100);
        assert_eq!(whole.lookup_offset_id(end), Some(100));
        assert_eq!(ten.lookup_offset_id(end), Some(90));
        let past = ReaderOffsetId(end.0 + 1);
        assert_eq!(whole.lookup_offset_id(past), None);
        let mut emptied = ten;
        emptied.empty();
        assert_eq!((emptied.len(), ten.len()), (0, 90));
        assert!(emptied.read_u8().is_err());
    }

    #[test]
    fn compressed_sections_inflate_to_4_mib_together_and_not_a_byte_more() {
        let scratch = Scratch::new("cap");
        let zeros = vec![0u8; MAX_INFLATED as usize];
        let mut encoder =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(&zeros).unwrap();
        let stream = encoder.finish().unwrap();
        let file = file_with(&scratch, 0, &stream);
        let debug_file = |size: u64| {
            let mut layout = super::super::file::Layout::default();
            let info = USED.iter().position(|id| *id == SectionId::DebugInfo);
            layout.sections[info.unwrap()] = Some(Placement {
                offset: 0,
                size,
                stored: Stored::Zlib {
                    at: 0,
                    len: stream.len() as u64,
                },
            });
            DebugFile {
                file: file.try_clone().unwrap(),
                layout,
            }
        };
        let at_the_cap = debug_file(MAX_INFLATED);
        let sections = Sections::load(&at_the_cap).expect("4 MiB inflate");
        assert_eq!(sections.dwarf().debug_info.reader().len(), zeros.len());
        assert!(Sections::load(&debug_file(MAX_INFLATED + 1)).is_none());
    }

    #[test]
    fn a_file_cut_short_gives_the_bytes_it_holds_and_fails_past_them() {
        let scratch = Scratch::new("cut");
        let bytes = noise(300);
        let file = file_with(&scratch, 0, &bytes);
        // The section said to be longer than the file (300 bytes and 100 of 0xBB).
        let section = Section::new(&file, plain(2 * BLOCK)).unwrap();
        let mut inside = Paged::whole(&section);
        inside.skip(100).unwrap();
        let mut six = [0u8; 6];
        inside.read_slice(&mut six).unwrap();
        assert_eq!(six, bytes[100..106]);
        assert_eq!(section.resident(), 0, "a block cut short is not kept");
        let mut past = Paged::whole(&section);
        past.skip(500).unwrap();
        assert!(past.clone().read_slice(&mut six).is_err());
        assert!(
            past.find(0).is_err(),
            "found in bytes the file does not hold"
        );
    }

    #[test]
    fn an_empty_section_has_no_strings_and_no_units() {
        let empty = Section::empty();
        let reader = Paged::whole(&empty);
        assert_eq!(reader.string_at(0), None);
        assert_eq!(reader.unit_starts(), Some(Vec::new()));
        assert!(reader.find(0).is_err());
    }

    #[test]
    fn strings_and_finds_read_from_memory_what_is_in_it_and_from_the_file_the_rest() {
        let scratch = Scratch::new("find");
        let mut bytes = noise(3 * BLOCK);
        bytes[..4].copy_from_slice(b"old\0");
        // A byte absent from the reads' first 300 bytes and from the end of block 0.
        let new = (1..=255u8)
            .find(|b| !bytes[..300].contains(b) && !bytes[BLOCK - 10..BLOCK + 10].contains(b))
            .unwrap();
        let first = |from: usize| from + bytes[from..].iter().position(|b| *b == new).unwrap();
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        // Not in memory: read 256 bytes at a time.
        assert_eq!(Paged::whole(&section).find(new).unwrap(), first(0));
        assert_eq!(section.resident(), 0, "find kept what it read");
        // All in memory: a block at a time, from where the reader starts.
        let mut all = vec![0u8; bytes.len()];
        Paged::whole(&section).read_slice(&mut all).unwrap();
        let mut late = Paged::whole(&section);
        late.skip(BLOCK - 10).unwrap();
        assert_eq!(late.find(new).unwrap(), first(BLOCK - 10) - (BLOCK - 10));
        // The file rewritten: what is in memory is what was read.
        std::fs::OpenOptions::new()
            .write(true)
            .open(scratch.0.join("file"))
            .unwrap()
            .write_all_at(b"new\0", 0)
            .unwrap();
        assert_eq!(Paged::whole(&section).string_at(0).as_deref(), Some("old"));
    }

    #[test]
    fn find_looks_no_further_than_the_readers_end() {
        let scratch = Scratch::new("bounded");
        let mut bytes = vec![1u8; 2 * BLOCK];
        bytes[BLOCK + 6] = 0;
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        // Ten bytes over two blocks, the NUL two bytes past them.
        let mut short = Paged::whole(&section);
        short.skip(BLOCK - 6).unwrap();
        let mut longer = short;
        short.truncate(10).unwrap();
        longer.truncate(13).unwrap();
        assert!(short.find(0).is_err(), "read from the file");
        assert_eq!(longer.find(0).unwrap(), 12);
        Paged::whole(&section)
            .read_slice(&mut vec![0u8; bytes.len()])
            .unwrap();
        assert!(short.find(0).is_err(), "read from memory");
        assert_eq!(longer.find(0).unwrap(), 12);
    }

    #[test]
    fn a_reader_hands_its_bytes_over_whole() {
        let scratch = Scratch::new("whole");
        let bytes = b"caf\xc3\xa9 \xff".to_vec();
        let file = file_with(&scratch, 0, &bytes);
        let section = Section::new(&file, plain(bytes.len())).unwrap();
        let mut text = Paged::whole(&section);
        text.truncate(5).unwrap();
        assert_eq!(&*text.to_slice().unwrap(), "caf\u{e9}".as_bytes());
        assert_eq!(text.to_string().unwrap(), "caf\u{e9}");
        let whole = Paged::whole(&section);
        assert_eq!(&*whole.to_slice().unwrap(), &bytes[..]);
        assert!(matches!(whole.to_string(), Err(gimli::Error::BadUtf8)));
        assert_eq!(whole.to_string_lossy().unwrap(), "caf\u{e9} \u{fffd}");
    }

    #[test]
    fn a_compressed_section_is_inflated_from_its_stream_and_no_further() {
        let scratch = Scratch::new("zlib");
        // Several times what the inflater reads from the file at once.
        let bytes = noise(200_000);
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&bytes).unwrap();
        let stream = encoder.finish().unwrap();
        let file = file_with(&scratch, 37, &stream);
        let zlib = |len: usize| Placement {
            offset: 0,
            size: bytes.len() as u64,
            stored: Stored::Zlib {
                at: 37,
                len: len as u64,
            },
        };
        let section = Section::new(&file, zlib(stream.len())).expect("inflated");
        let mut read = vec![0u8; bytes.len()];
        Paged::whole(&section).read_slice(&mut read).unwrap();
        assert!(read == bytes, "the inflated bytes differ");
        assert_eq!(section.resident(), 0, "in memory, not read from the file");
        // A stream cut short by its length is read no further: an unfinished stream, no
        // section.
        assert!(Section::new(&file, zlib(stream.len() / 2)).is_none());
        // One said to go on past the file's end ends where the stream ends.
        let past = Section::new(&file, zlib(stream.len() + 1000)).expect("inflated");
        assert_eq!(past.len, bytes.len());
    }

    #[test]
    fn a_read_of_the_file_stops_at_its_end_and_at_once_where_it_cannot_be_read() {
        let scratch = Scratch::new("read");
        let bytes = noise(1000);
        let file = file_with(&scratch, 0, &bytes);
        let mut into = vec![0u8; 2000];
        assert_eq!(read_fully(&file, &mut into, 500), 600);
        assert_eq!(into[..500], bytes[500..]);
        // A directory opens, and every read of it fails (EISDIR): not a retry, nothing.
        let directory = File::open(&scratch.0).unwrap();
        assert_eq!(read_fully(&directory, &mut into, 0), 0);
    }
}
