//! Function names for code addresses, from the ELF symbol tables of the loaded objects
//! (`.symtab`, else `.dynsym`). Tables are streamed through a small buffer with positioned
//! reads (never a map, which a file truncated meanwhile would turn into `SIGBUS`), from
//! regular files only (`symbolize/opening.rs`), and nothing is cached: a profile's
//! symbolization costs a few pages of memory while it runs and none afterwards (the
//! `backtrace` crate's caches, used by the `pprof` crate, stay resident for the life of
//! the process).

use std::fs::File;
#[cfg(unix)]
use std::os::unix::fs::FileExt as _;
#[cfg(windows)]
use std::os::windows::fs::FileExt as _;

use super::names::demangle;
use super::opening::open_regular;
use crate::objects::LoadedObject;

/// A resolved function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Symbol {
    /// Demangled, without the Rust hash suffix.
    pub(crate) name: String,
    /// As written in the symbol table.
    pub(crate) raw: String,
}

/// Where an object's ELF image is read from.
enum Source<'a> {
    File(File),
    Memory(&'a [u8]),
}

impl Source<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Option<usize> {
        match self {
            #[cfg(unix)]
            Source::File(file) => file.read_at(buf, offset).ok(),
            // Never reached in practice (no objects are listed off Linux), but positional
            // reads exist there too, so the crate builds everywhere.
            #[cfg(windows)]
            Source::File(file) => file.seek_read(buf, offset).ok(),
            Source::Memory(bytes) => {
                let start = usize::try_from(offset).ok()?;
                let available = bytes.get(start..)?;
                let n = available.len().min(buf.len());
                buf[..n].copy_from_slice(&available[..n]);
                Some(n)
            }
        }
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return None;
            }
            done += n;
        }
        Some(())
    }
}

#[derive(Clone, Copy, Debug)]
struct Section {
    kind: u32,
    /// Where it is loaded, as the file states it (0 if it is not).
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const SYMBOL_SIZE: usize = 24;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The section headers of a 64-bit little-endian ELF image.
fn sections(source: &Source<'_>) -> Option<Vec<Section>> {
    let mut header = [0u8; 64];
    source.read_exact_at(&mut header, 0)?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let shoff = u64_at(&header, 0x28);
    let shentsize = usize::from(u16_at(&header, 0x3a));
    let mut shnum = usize::from(u16_at(&header, 0x3c));
    if shoff == 0 || shentsize < 64 {
        return None;
    }
    let mut raw = vec![0u8; shentsize];
    if shnum == 0 {
        // More than 0xff00 sections: the count is in section 0's size.
        source.read_exact_at(&mut raw, shoff)?;
        shnum = usize::try_from(u64_at(&raw, 32)).ok()?;
    }
    (0..shnum.min(1 << 16))
        .map(|i| {
            source.read_exact_at(&mut raw, shoff + (i * shentsize) as u64)?;
            Some(Section {
                kind: u32_at(&raw, 4),
                addr: u64_at(&raw, 16),
                offset: u64_at(&raw, 24),
                size: u64_at(&raw, 32),
                link: u32_at(&raw, 40),
                entsize: u64_at(&raw, 56),
            })
        })
        .collect()
}

/// A function symbol that contains at least one of the wanted addresses.
#[derive(Clone, Copy)]
struct Candidate {
    size: u64,
    name_offset: u32,
}

/// The function symbol starting highest in a gap between two wanted addresses: what a
/// symbol without a size (assembly written without `.size`, such as musl's `memcpy`)
/// is measured by. Such a symbol covers what follows it up to the next function's start
/// and the end of its section, as `perf` and `addr2line` read it.
#[derive(Clone, Copy)]
struct Start {
    start: u64,
    sized: bool,
    section: u16,
    name_offset: u32,
}

/// Resolves `addresses` (addresses as stated in the object's file, i.e. minus its load
/// bias; sorted, unique) to the function containing each, where the symbol tables know it.
pub(crate) fn resolve(object: &LoadedObject, addresses: &[u64]) -> Vec<Option<Symbol>> {
    debug_assert!(addresses.windows(2).all(|w| w[0] < w[1]));
    let source = if object.is_vdso {
        // SAFETY: the vDSO stays mapped for the life of the process.
        Source::Memory(unsafe { object.image() })
    } else {
        match object.file.as_deref().and_then(open_regular) {
            Some(file) => Source::File(file),
            None => return vec![None; addresses.len()],
        }
    };
    let Some(sections) = sections(&source) else {
        return vec![None; addresses.len()];
    };
    let table = sections
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .or_else(|| sections.iter().find(|s| s.kind == SHT_DYNSYM));
    let Some(table) = table else {
        return vec![None; addresses.len()];
    };
    let Some(strings) = sections.get(table.link as usize).copied() else {
        return vec![None; addresses.len()];
    };
    let mut best: Vec<Option<Candidate>> = vec![None; addresses.len()];
    let mut highest: Vec<Option<Start>> = vec![None; addresses.len()];
    scan(&source, table, addresses, &mut best, &mut highest);
    // The nearest function start at or below each address, by a running maximum over
    // the gaps; where it has no size and no sized function contains the address, the
    // address is that function's.
    let mut nearest: Option<Start> = None;
    for (i, address) in addresses.iter().enumerate() {
        if let Some(start) = highest[i]
            && nearest.is_none_or(|n| start.start > n.start)
        {
            nearest = Some(start);
        }
        if best[i].is_none()
            && let Some(start) = nearest.filter(|n| !n.sized)
            && let Some(section) = sections.get(usize::from(start.section))
            && (section.addr..section.addr.saturating_add(section.size)).contains(address)
        {
            best[i] = Some(Candidate {
                size: 0,
                name_offset: start.name_offset,
            });
        }
    }
    best.iter()
        .map(|candidate| {
            let candidate = (*candidate)?;
            let raw = read_name(&source, &strings, candidate.name_offset)?;
            Some(Symbol {
                name: demangle(&raw),
                raw,
            })
        })
        .collect()
}

/// Streams the symbol table, keeping for each address the smallest function containing it,
/// and for each gap below an address (`highest[i]`: starts above `addresses[i - 1]`, at
/// or below `addresses[i]`) the function starting highest in it.
fn scan(
    source: &Source<'_>,
    table: &Section,
    addresses: &[u64],
    best: &mut [Option<Candidate>],
    highest: &mut [Option<Start>],
) {
    let entsize = (table.entsize as usize).max(SYMBOL_SIZE);
    let count = (table.size / entsize as u64) as usize;
    const CHUNK: usize = 2048;
    let mut buf = vec![0u8; CHUNK * entsize];
    let mut first = 0usize;
    while first < count {
        let n = CHUNK.min(count - first);
        let bytes = &mut buf[..n * entsize];
        if source
            .read_exact_at(bytes, table.offset + (first * entsize) as u64)
            .is_none()
        {
            return;
        }
        for entry in bytes.chunks_exact(entsize) {
            let kind = entry[4] & 0xf;
            let section_index = u16_at(entry, 6);
            let start = u64_at(entry, 8);
            let size = u64_at(entry, 16);
            if !(kind == STT_FUNC || kind == STT_GNU_IFUNC) || section_index == 0 {
                continue;
            }
            let mut i = addresses.partition_point(|a| *a < start);
            if let Some(gap) = highest.get_mut(i)
                // At one start, a sized symbol wins over an alias without a size.
                && gap.is_none_or(|g| start > g.start || (start == g.start && size > 0))
            {
                *gap = Some(Start {
                    start,
                    sized: size > 0,
                    section: section_index,
                    name_offset: u32_at(entry, 0),
                });
            }
            let end = start.saturating_add(size);
            while i < addresses.len() && addresses[i] < end {
                if best[i].is_none_or(|b| size < b.size) {
                    best[i] = Some(Candidate {
                        size,
                        name_offset: u32_at(entry, 0),
                    });
                }
                i += 1;
            }
        }
        first += n;
    }
}

fn read_name(source: &Source<'_>, strings: &Section, offset: u32) -> Option<String> {
    let start = strings.offset + u64::from(offset);
    let limit = strings.size.checked_sub(u64::from(offset))?;
    let mut len = 256usize;
    loop {
        let want = (len as u64).min(limit) as usize;
        let mut buf = vec![0u8; want];
        let got = source.read_at(&mut buf, start)?;
        buf.truncate(got);
        if let Some(nul) = buf.iter().position(|b| *b == 0) {
            buf.truncate(nul);
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
        if want as u64 >= limit || len >= 1 << 16 {
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
        len *= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Objects;

    #[inline(never)]
    fn a_function_with_a_findable_name() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn resolves_functions_of_this_test_binary() {
        let objects = Objects::current();
        let here = a_function_with_a_findable_name as *const () as u64;
        let (_, object) = objects.find(here).unwrap();
        let resolved = resolve(object, &[here - object.bias, here - object.bias + 1]);
        let name = &resolved[0].as_ref().expect("resolved").name;
        assert!(
            name.ends_with("symtab::tests::a_function_with_a_findable_name"),
            "{name}"
        );
        assert_eq!(resolved[1].as_ref().map(|s| &s.name), Some(name));
        assert!(
            resolved[0].as_ref().unwrap().raw.starts_with("_R")
                || resolved[0].as_ref().unwrap().raw.starts_with("_ZN")
        );
    }

    #[test]
    fn resolves_libc_and_the_vdso_from_their_dynamic_symbols() {
        let objects = Objects::current();
        let getpid = libc::getpid as *const () as u64;
        let (_, libc_object) = objects.find(getpid).expect("getpid is in libc");
        let resolved = resolve(libc_object, &[getpid - libc_object.bias]);
        assert!(
            resolved[0]
                .as_ref()
                .is_some_and(|s| s.name.contains("getpid")),
            "{:?}",
            resolved[0]
        );
        let vdso = objects.iter().find(|o| o.is_vdso).expect("a vDSO");
        // The vDSO exports clock_gettime; every exported function resolves to itself.
        let text = vdso.text().expect("vDSO code");
        let probe: Vec<u64> = (text.avma.start..text.avma.end)
            .step_by(16)
            .map(|a| a - vdso.bias)
            .collect();
        let names: Vec<String> = resolve(vdso, &probe)
            .into_iter()
            .flatten()
            .map(|s| s.name)
            .collect();
        assert!(
            names.iter().any(|n| n.contains("clock_gettime")),
            "{names:?}"
        );
    }

    // A function as assembly writes it without `.size`: its symbol's size is 0, as for
    // musl's `memcpy` in a static binary; and right after it, one with a size.
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    std::arch::global_asm!(
        ".text",
        ".globl krabka_sizeless_function",
        ".type krabka_sizeless_function, @function",
        "krabka_sizeless_function:",
        "nop",
        "nop",
        "nop",
        "ret",
        ".globl krabka_sized_function",
        ".type krabka_sized_function, @function",
        "krabka_sized_function:",
        "nop",
        "nop",
        "nop",
        "ret",
        ".size krabka_sized_function, . - krabka_sized_function",
    );

    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    #[test]
    fn a_function_symbol_without_a_size_covers_up_to_the_next_function() {
        unsafe extern "C" {
            safe fn krabka_sizeless_function();
            safe fn krabka_sized_function();
        }
        let objects = Objects::current();
        let start = krabka_sizeless_function as *const () as u64;
        let (_, object) = objects.find(start).unwrap();
        let here = a_function_with_a_findable_name as *const () as u64;
        let next = krabka_sized_function as *const () as u64;
        let mut probe = vec![
            start - object.bias,
            start - object.bias + 2,
            here - object.bias,
            next - object.bias + 1,
            // Just past the sized function: whatever lies there, not the sizeless one.
            next - object.bias + 4,
        ];
        probe.sort_unstable();
        let names: Vec<Option<String>> = resolve(object, &probe)
            .into_iter()
            .map(|s| s.map(|s| s.name))
            .collect();
        let sizeless = probe
            .iter()
            .position(|a| *a == start - object.bias)
            .unwrap();
        assert_eq!(names[sizeless].as_deref(), Some("krabka_sizeless_function"));
        assert_eq!(
            names[sizeless + 1].as_deref(),
            Some("krabka_sizeless_function")
        );
        let at = |address: u64| {
            names[probe
                .iter()
                .position(|a| *a == address - object.bias)
                .unwrap()]
            .as_deref()
        };
        assert_eq!(at(next + 1), Some("krabka_sized_function"), "{names:?}");
        assert_ne!(at(next + 4), Some("krabka_sizeless_function"), "{names:?}");
        let sized = probe.iter().position(|a| *a == here - object.bias).unwrap();
        assert!(
            names[sized]
                .as_deref()
                .is_some_and(|n| n.ends_with("a_function_with_a_findable_name")),
            "{names:?}"
        );
    }

    #[test]
    fn unknown_addresses_stay_unknown() {
        let objects = Objects::current();
        let here = a_function_with_a_findable_name as *const () as u64;
        let (_, object) = objects.find(here).unwrap();
        assert_eq!(resolve(object, &[0]), vec![None]);
    }

    /// A 64-bit little-endian ELF header with `count` section headers of `entsize`
    /// bytes right after it, section `i` of kind `i`, loaded at `0x1000 * i`.
    fn elf_image(count: u16, entsize: u16) -> Vec<u8> {
        let mut image = vec![0u8; 64];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2;
        image[5] = 1;
        image[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        // A program header count whose high byte is not zero, beside the section
        // header's fields, so that a field read a byte off is read wrong.
        image[0x38..0x3a].copy_from_slice(&0x0303u16.to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&entsize.to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&count.to_le_bytes());
        for i in 0..u64::from(count) {
            let mut header = vec![0u8; usize::from(entsize)];
            if header.len() >= 64 {
                header[4..8].copy_from_slice(&(i as u32).to_le_bytes());
                header[16..24].copy_from_slice(&(0x1000 * i).to_le_bytes());
                header[24..32].copy_from_slice(&(0x10 * i).to_le_bytes());
                header[32..40].copy_from_slice(&(i + 1).to_le_bytes());
                header[40..44].copy_from_slice(&7u32.to_le_bytes());
                header[56..64].copy_from_slice(&24u64.to_le_bytes());
            }
            image.extend_from_slice(&header);
        }
        image
    }

    #[test]
    fn section_headers_are_read_from_a_crafted_image_and_anything_else_is_refused() {
        // 258 sections: a count with a high byte of its own.
        let image = elf_image(258, 64);
        let found = sections(&Source::Memory(&image)).expect("a valid image");
        assert_eq!(found.len(), 258);
        let last = found[257];
        assert_eq!(
            (
                last.kind,
                last.addr,
                last.offset,
                last.size,
                last.link,
                last.entsize
            ),
            (257, 0x1000 * 257, 0x10 * 257, 258, 7, 24)
        );
        // Each check refuses on its own, whatever the others say.
        let refused = |patch: &dyn Fn(&mut Vec<u8>)| {
            let mut image = elf_image(3, 64);
            patch(&mut image);
            sections(&Source::Memory(&image)).is_none()
        };
        assert!(refused(&|image| image[0] = b'X'), "not ELF");
        assert!(refused(&|image| image[4] = 1), "32-bit");
        assert!(refused(&|image| image[5] = 2), "big-endian");
        assert!(
            refused(&|image| image[0x28..0x30].fill(0)),
            "no section headers"
        );
        assert!(!refused(&|_| ()));
        let short_entries = elf_image(3, 32);
        assert!(
            sections(&Source::Memory(&short_entries)).is_none(),
            "entries too short"
        );
        let truncated = &image[..image.len() - 1];
        assert!(sections(&Source::Memory(truncated)).is_none(), "cut short");
    }

    /// An ELF64 symbol table entry: a function in section 1.
    fn function_symbol(name_offset: u32, start: u64, size: u64) -> [u8; SYMBOL_SIZE] {
        let mut entry = [0u8; SYMBOL_SIZE];
        entry[..4].copy_from_slice(&name_offset.to_le_bytes());
        entry[4] = STT_FUNC;
        entry[6..8].copy_from_slice(&1u16.to_le_bytes());
        entry[8..16].copy_from_slice(&start.to_le_bytes());
        entry[16..24].copy_from_slice(&size.to_le_bytes());
        entry
    }

    /// Scans `symbols`, the whole image, for `addresses`.
    fn scan_of(
        symbols: &[[u8; SYMBOL_SIZE]],
        addresses: &[u64],
    ) -> (Vec<Option<Candidate>>, Vec<Option<Start>>) {
        let image = symbols.concat();
        let table = Section {
            kind: SHT_SYMTAB,
            addr: 0,
            offset: 0,
            size: image.len() as u64,
            link: 0,
            entsize: SYMBOL_SIZE as u64,
        };
        let mut best = vec![None; addresses.len()];
        let mut highest = vec![None; addresses.len()];
        scan(
            &Source::Memory(&image),
            &table,
            addresses,
            &mut best,
            &mut highest,
        );
        (best, highest)
    }

    /// The table is read in chunks of 2,048 entries; the last, shorter one ends where
    /// the table (here, the image) does.
    #[test]
    fn a_table_longer_than_a_chunk_is_read_to_its_last_entry() {
        let symbols: Vec<_> = (0..2_100u32)
            .map(|i| function_symbol(i, 0x1000 + 16 * u64::from(i), 16))
            .collect();
        let (best, _) = scan_of(&symbols, &[0x1000 + 16 * 2_099 + 4]);
        let found = best[0].expect("the last entry's function");
        assert_eq!((found.name_offset, found.size), (2_099, 16));
    }

    /// In a gap below an address, the function starting highest is kept, and at one
    /// start a sized symbol wins over an alias without a size, whichever comes first.
    #[test]
    fn a_gaps_highest_start_is_kept_and_a_sized_symbol_wins_over_its_alias() {
        let alias = function_symbol(1, 0x1800, 0);
        let sized = function_symbol(2, 0x1800, 0x10);
        let lower = function_symbol(3, 0x1000, 0x20);
        for symbols in [[alias, sized, lower], [sized, alias, lower]] {
            let (best, highest) = scan_of(&symbols, &[0x2000]);
            assert!(best[0].is_none(), "no function contains 0x2000");
            let gap = highest[0].expect("a start below 0x2000");
            assert_eq!(
                (gap.start, gap.sized, gap.section, gap.name_offset),
                (0x1800, true, 1, 2)
            );
        }
        let (_, highest) = scan_of(&[lower, alias], &[0x2000]);
        let gap = highest[0].expect("a start below 0x2000");
        assert_eq!((gap.start, gap.sized, gap.name_offset), (0x1800, false, 1));
    }

    /// An address is in the smallest function that contains it, whichever the table
    /// lists first (of two the same, the first); a function ends before its end.
    #[test]
    fn the_smallest_function_containing_an_address_is_its_own() {
        let outer = function_symbol(1, 0x1000, 0x100);
        let inner = function_symbol(2, 0x1010, 0x10);
        let twin = function_symbol(3, 0x1010, 0x10);
        for symbols in [vec![outer, inner, twin], vec![twin, outer, inner]] {
            let first = if symbols[0] == twin { 3 } else { 2 };
            let (best, _) = scan_of(&symbols, &[0x1014, 0x1020, 0x1100]);
            let names: Vec<Option<u32>> = best.iter().map(|b| b.map(|b| b.name_offset)).collect();
            assert_eq!(names, [Some(first), Some(1), None]);
        }
    }

    /// A name is read to its NUL however long (in reads that grow), and one without a
    /// NUL stops at the table's end or at 64 KiB, whichever comes first.
    #[test]
    fn names_are_read_to_their_nul_and_capped_without_one() {
        let name_of = |table: &[u8], offset: u32| {
            let strings = Section {
                kind: 3,
                addr: 0,
                offset: 0,
                size: table.len() as u64,
                link: 0,
                entsize: 0,
            };
            read_name(&Source::Memory(table), &strings, offset)
        };
        let mut table = b"\0short\0".to_vec();
        let long = "x".repeat(300);
        table.extend_from_slice(long.as_bytes());
        table.push(0);
        assert_eq!(name_of(&table, 1).as_deref(), Some("short"));
        assert_eq!(name_of(&table, 7).as_deref(), Some(long.as_str()));
        assert_eq!(name_of(&table, 0).as_deref(), Some(""));
        assert_eq!(name_of(&table, table.len() as u32 + 1), None);
        let unended = b"abc".to_vec();
        assert_eq!(name_of(&unended, 0).as_deref(), Some("abc"));
        let huge = vec![b'a'; 70_000];
        assert_eq!(name_of(&huge, 0).map(|n| n.len()), Some(1 << 16));
    }

    /// A read that crosses the image's end is refused, not filled from elsewhere: the
    /// short read's rest is asked for past it, where nothing is.
    #[test]
    fn an_exact_read_past_the_end_of_the_image_is_refused() {
        let image: Vec<u8> = (0..10).collect();
        let source = Source::Memory(&image);
        let mut buf = [0u8; 4];
        assert_eq!(source.read_exact_at(&mut buf, 6), Some(()));
        assert_eq!(buf, [6, 7, 8, 9]);
        let mut buf = [0u8; 8];
        assert_eq!(source.read_exact_at(&mut buf, 6), None);
        assert_eq!(source.read_exact_at(&mut buf, 11), None);
    }

    #[test]
    fn demangles_rust_names_without_hash() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("memcpy"), "memcpy");
    }
}
