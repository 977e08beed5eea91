//! The objects loaded in this process (the executable, shared libraries, the vDSO), read
//! from `dl_iterate_phdr`: where each is mapped, its build ID, and where its unwind tables
//! are (`.eh_frame_hdr`, and `.eh_frame` decoded from it). Taken once per profile, off
//! the signal path; the sampler and the symbolizer both use it.

#[cfg(target_os = "linux")]
use std::ffi::{CStr, c_int, c_void};
use std::ops::Range;
use std::path::PathBuf;

/// One `PT_LOAD` segment, at its address in this process.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub(crate) avma: Range<u64>,
    pub(crate) file_offset: u64,
    pub(crate) executable: bool,
}

/// An executable, shared library or the vDSO, as mapped in this process.
#[derive(Clone, Debug)]
pub(crate) struct LoadedObject {
    /// The path shown in profiles (the executable's real path, not `/proc/self/exe`).
    pub(crate) name: String,
    /// Where to read the ELF file from; `None` for the vDSO, which exists only in memory.
    pub(crate) file: Option<PathBuf>,
    /// Load bias: an address in the file plus `bias` is the address in this process.
    pub(crate) bias: u64,
    pub(crate) segments: Vec<Segment>,
    /// From the lowest segment start to the highest segment end.
    pub(crate) range: Range<u64>,
    pub(crate) build_id: Option<Vec<u8>>,
    /// `PT_GNU_EH_FRAME`, in this process's addresses.
    pub(crate) eh_frame_hdr: Option<Range<u64>>,
    pub(crate) is_vdso: bool,
}

impl LoadedObject {
    /// The file name without its directory.
    pub(crate) fn short_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }

    /// Whether a blocklist entry names this object: its file name, or that name's stem
    /// with or without `lib` and before a version (`libc` names `libc.so.6` and
    /// `libc-2.31.so` but not `libcrypto.so.3`; `pthread` names `libpthread.so.0`;
    /// `libgcc` names `libgcc_s.so.1`); `vdso` names the vDSO. Never a directory.
    pub(crate) fn is_named(&self, entry: &str) -> bool {
        if entry.is_empty() {
            return false;
        }
        if self.is_vdso && entry == "vdso" {
            return true;
        }
        let file = self.short_name();
        if file == entry {
            return true;
        }
        let stem = file.split('.').next().unwrap_or(file);
        [entry.to_owned(), format!("lib{entry}")]
            .iter()
            .any(|name| {
                stem == name
                    || stem
                        .strip_prefix(name.as_str())
                        .is_some_and(|rest| rest.starts_with(['-', '_']))
            })
    }

    /// The executable segment.
    pub(crate) fn text(&self) -> Option<&Segment> {
        self.segments.iter().find(|s| s.executable)
    }

    /// The pprof mapping of this object's code, as the kernel lists it in
    /// `/proc/self/maps` (and as Go's runtime, perf and every other profiler write it):
    /// the pages that hold the executable segment, and the file offset of the first.
    /// Readers compute the load bias from these and the ELF program headers: Go's own
    /// (`go tool pprof` since 1.21) as `memory_start` minus the segment's page-aligned
    /// address, google/pprof's (`binutils`, with llvm-symbolizer or addr2line) as
    /// `memory_start - file_offset + p_offset - p_vaddr`, both of which give the bias
    /// only from page-aligned values when the segment does not start on a page (lld
    /// and GNU ld lay it out so). Go 1.20 and older take `p_vaddr` unaligned and misname
    /// such binaries, Go's own profiles of them too (docs/release-builds.md).
    /// `(memory_start..memory_limit, file_offset)`.
    pub(crate) fn mapping(&self) -> (Range<u64>, u64) {
        let page = page_size();
        let down = |address: u64| address - address % page;
        let up = |address: u64| address.div_ceil(page) * page;
        match self.text() {
            Some(text) => (
                down(text.avma.start)..up(text.avma.end),
                down(text.file_offset),
            ),
            None => (down(self.range.start)..up(self.range.end), 0),
        }
    }

    /// The whole mapped image as a byte slice, up to the end of its last page (where the
    /// vDSO keeps its section headers); only the vDSO is read this way.
    ///
    /// # Safety
    /// The object must still be mapped (the vDSO always is).
    pub(crate) unsafe fn image(&self) -> &'static [u8] {
        const PAGE: u64 = 4096;
        let end = self.range.end.div_ceil(PAGE) * PAGE;
        let len = (end - self.range.start) as usize;
        // SAFETY: the caller guarantees the mapping; mappings are whole pages, and `range`
        // covers this object's PT_LOAD segments, which are readable.
        unsafe { std::slice::from_raw_parts(self.range.start as *const u8, len) }
    }
}

/// Every object loaded at the time it was taken, sorted by address.
#[derive(Clone, Debug, Default)]
pub(crate) struct Objects {
    list: Vec<LoadedObject>,
}

impl Objects {
    /// The objects loaded now.
    #[cfg(target_os = "linux")]
    pub(crate) fn current() -> Objects {
        let mut list: Vec<LoadedObject> = Vec::new();
        // SAFETY: the callback only reads the `dl_phdr_info` the loader hands it, for the
        // duration of the call, and pushes owned copies into `list`.
        unsafe {
            libc::dl_iterate_phdr(Some(collect), (&raw mut list).cast::<c_void>());
        }
        // SAFETY: getauxval has no preconditions.
        let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
        let executable = std::env::current_exe()
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        for (i, object) in list.iter_mut().enumerate() {
            object.is_vdso = vdso != 0 && object.range.start == vdso;
            if object.is_vdso {
                object.file = None;
                if object.name.is_empty() {
                    object.name = "[vdso]".to_owned();
                }
            } else if i == 0 && (object.name.is_empty() || object.name == "/proc/self/exe") {
                // The first object, unnamed, is the executable (a static musl binary names
                // it by the link, which profiles should not show).
                object.file = Some(PathBuf::from("/proc/self/exe"));
                object.name = executable
                    .clone()
                    .unwrap_or_else(|| "[executable]".to_owned());
            } else if object.name.is_empty() {
                object.file = None;
                object.name = format!("[anonymous object at {:#x}]", object.range.start);
            }
        }
        list.retain(|o| !o.segments.is_empty());
        list.sort_by_key(|o| o.range.start);
        Objects { list }
    }

    /// No objects: profiling is unsupported on this target.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn current() -> Objects {
        Objects::default()
    }

    /// These objects, with the one at `index` replaced: a test's stand-in for a binary
    /// loaded from another file.
    #[cfg(test)]
    pub(crate) fn with(&self, index: usize, object: LoadedObject) -> Objects {
        let mut list = self.list.clone();
        list[index] = object;
        Objects { list }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &LoadedObject> {
        self.list.iter()
    }

    pub(crate) fn get(&self, index: usize) -> Option<&LoadedObject> {
        self.list.get(index)
    }

    /// These objects, and those of `older` that no object of these overlaps: the objects a
    /// session saw, a library unloaded since included, so its frames still have a name.
    pub(crate) fn merged_with(&self, older: &Objects) -> Objects {
        let mut list = self.list.clone();
        for object in &older.list {
            let overlaps = self.list.iter().any(|new| {
                new.range.start < object.range.end && object.range.start < new.range.end
            });
            if !overlaps {
                list.push(object.clone());
            }
        }
        list.sort_by_key(|o| o.range.start);
        Objects { list }
    }

    /// The object whose segments contain `avma`, with its index.
    pub(crate) fn find(&self, avma: u64) -> Option<(usize, &LoadedObject)> {
        let i = self.list.partition_point(|o| o.range.start <= avma);
        let index = i.checked_sub(1)?;
        let object = &self.list[index];
        object
            .segments
            .iter()
            .any(|s| s.avma.contains(&avma))
            .then_some((index, object))
    }
}

/// The dynamic loader's count of objects loaded and unloaded in this process's life
/// (`dlpi_adds`, `dlpi_subs`): a change means the list of objects changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loaded {
    adds: u64,
    subs: u64,
}

impl Loaded {
    /// The counts now; the loader's lock is taken for one object only.
    #[cfg(target_os = "linux")]
    pub(crate) fn now() -> Loaded {
        unsafe extern "C" fn first(
            info: *mut libc::dl_phdr_info,
            _size: usize,
            data: *mut c_void,
        ) -> c_int {
            // SAFETY: the loader passes a valid info for the duration of the callback, and
            // `data` is the `Loaded` that `now` passed in.
            unsafe {
                let loaded = &mut *data.cast::<Loaded>();
                loaded.adds = (*info).dlpi_adds;
                loaded.subs = (*info).dlpi_subs;
            }
            1
        }
        let mut loaded = Loaded { adds: 0, subs: 0 };
        // SAFETY: the callback only copies two counters, during the call.
        unsafe {
            libc::dl_iterate_phdr(Some(first), (&raw mut loaded).cast::<c_void>());
        }
        loaded
    }

    /// Nothing is ever loaded where objects are not listed.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn now() -> Loaded {
        Loaded { adds: 0, subs: 0 }
    }

    /// Whether objects were loaded or unloaded since these counts were taken.
    pub(crate) fn changed(&self) -> bool {
        Loaded::now() != *self
    }
}

#[cfg(target_os = "linux")]
unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the loader passes a valid info for the duration of the callback, and
        // `data` is the `Vec` that `Objects::current` passed in.
        let (info, list) = unsafe { (&*info, &mut *data.cast::<Vec<LoadedObject>>()) };
        // SAFETY: as above; the loader's program headers outlive the callback.
        if let Some(object) = unsafe { read_object(info) } {
            list.push(object);
        }
    }));
    // Stop iterating if anything went wrong; what was collected is still usable.
    c_int::from(result.is_err())
}

/// Reads one object's program headers.
///
/// # Safety
/// `info` must come from `dl_iterate_phdr` and be used only during its callback.
#[cfg(target_os = "linux")]
unsafe fn read_object(info: &libc::dl_phdr_info) -> Option<LoadedObject> {
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let bias = info.dlpi_addr;
    let headers: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
        &[]
    } else {
        // SAFETY: the loader provides `dlpi_phnum` program headers at `dlpi_phdr`.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    let mut segments = Vec::new();
    let mut eh_frame_hdr = None;
    let mut build_id = None;
    for header in headers {
        let start = bias.wrapping_add(header.p_vaddr);
        let end = start.wrapping_add(header.p_memsz);
        match header.p_type {
            libc::PT_LOAD => segments.push(Segment {
                avma: start..end,
                file_offset: header.p_offset,
                executable: header.p_flags & libc::PF_X != 0,
            }),
            libc::PT_GNU_EH_FRAME => eh_frame_hdr = Some(start..end),
            libc::PT_NOTE if build_id.is_none() => {
                // SAFETY: PT_NOTE segments are mapped and `p_memsz` bytes long.
                let notes = unsafe {
                    std::slice::from_raw_parts(start as *const u8, header.p_memsz as usize)
                };
                build_id = gnu_build_id(notes);
            }
            _ => {}
        }
    }
    let range = segments.iter().map(|s| s.avma.start).min().unwrap_or(0)
        ..segments.iter().map(|s| s.avma.end).max().unwrap_or(0);
    let file = (!name.is_empty()).then(|| PathBuf::from(&name));
    Some(LoadedObject {
        name,
        file,
        bias,
        segments,
        range,
        build_id,
        eh_frame_hdr,
        is_vdso: false,
    })
}

/// The size of a page of this process's memory: the unit the kernel maps files in.
pub(crate) fn page_size() -> u64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if let Ok(size @ 1..) = u64::try_from(size) {
            return size;
        }
    }
    4096
}

/// The `NT_GNU_BUILD_ID` descriptor in a run of ELF notes.
fn gnu_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align4 = |n: usize| (n + 3) & !3;
    let u32_at = |bytes: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    while notes.len() >= 12 {
        let name_size = u32_at(notes, 0)? as usize;
        let desc_size = u32_at(notes, 4)? as usize;
        let kind = u32_at(notes, 8)?;
        let name_start = 12;
        let desc_start = name_start + align4(name_size);
        let next = desc_start + align4(desc_size);
        let name = notes.get(name_start..name_start + name_size)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return notes
                .get(desc_start..desc_start + desc_size)
                .map(<[u8]>::to_vec);
        }
        notes = notes.get(next..)?;
    }
    None
}

/// Where `.eh_frame` starts, from the `eh_frame_ptr` field of `.eh_frame_hdr`.
pub(crate) fn eh_frame_address(hdr: &[u8], hdr_address: u64) -> Option<u64> {
    const DW_EH_PE_PCREL: u8 = 0x10;
    const DW_EH_PE_DATAREL: u8 = 0x30;
    if hdr.first() != Some(&1) {
        return None;
    }
    let encoding = *hdr.get(1)?;
    let field = hdr_address + 4;
    let (value, _) = read_encoded(hdr.get(4..)?, encoding & 0x0f)?;
    let base = match encoding & 0x70 {
        0 => 0,
        DW_EH_PE_PCREL => field,
        DW_EH_PE_DATAREL => hdr_address,
        _ => return None,
    };
    Some(base.wrapping_add(value as u64))
}

/// A DWARF pointer-encoded value of the given format.
fn read_encoded(bytes: &[u8], format: u8) -> Option<(i64, usize)> {
    let take = |n: usize| bytes.get(..n);
    Some(match format {
        0x00 | 0x04 => (u64::from_le_bytes(take(8)?.try_into().ok()?) as i64, 8),
        0x02 => (i64::from(u16::from_le_bytes(take(2)?.try_into().ok()?)), 2),
        0x03 => (i64::from(u32::from_le_bytes(take(4)?.try_into().ok()?)), 4),
        0x0a => (i64::from(i16::from_le_bytes(take(2)?.try_into().ok()?)), 2),
        0x0b => (i64::from(i32::from_le_bytes(take(4)?.try_into().ok()?)), 4),
        0x0c => (i64::from_le_bytes(take(8)?.try_into().ok()?), 8),
        _ => return None,
    })
}

/// Bytes as lowercase hex, as build IDs are written in mappings and debug file paths.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eh_frame_pointer_encodings() {
        // version 1, pcrel|sdata4, then -16 relative to the field at hdr+4.
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend((-16i32).to_le_bytes());
        assert_eq!(eh_frame_address(&hdr, 0x1000), Some(0x1000 + 4 - 16));
        let mut abs = vec![1u8, 0x04, 0x03, 0x3b];
        abs.extend(0x4242u64.to_le_bytes());
        assert_eq!(eh_frame_address(&abs, 0x1000), Some(0x4242));
        assert_eq!(
            eh_frame_address(&[2, 0x1b, 0, 0, 0, 0, 0, 0], 0),
            None,
            "unknown version"
        );
        // Relative to the header itself (datarel), and the narrower absolute formats.
        let field = |encoding: u8, value: &[u8]| {
            let mut hdr = vec![1u8, encoding, 0x03, 0x3b];
            hdr.extend(value);
            eh_frame_address(&hdr, 0x1000)
        };
        assert_eq!(field(0x3b, &64i32.to_le_bytes()), Some(0x1000 + 64));
        assert_eq!(
            field(0x02, &0xfffeu16.to_le_bytes()),
            Some(0xfffe),
            "udata2"
        );
        assert_eq!(
            field(0x03, &0x8000_0000u32.to_le_bytes()),
            Some(0x8000_0000),
            "udata4"
        );
        assert_eq!(
            field(0x0a, &(-2i16).to_le_bytes()),
            Some(u64::MAX - 1),
            "sdata2"
        );
        assert_eq!(
            field(0x0c, &(-8i64).to_le_bytes()),
            Some(u64::MAX - 7),
            "sdata8"
        );
        assert_eq!(field(0x5b, &0i32.to_le_bytes()), None, "an unknown base");
        assert_eq!(field(0x0d, &[0; 8]), None, "an unknown format");
        assert_eq!(field(0x03, &[0; 3]), None, "cut short");
    }

    /// The loader's counts move when a library is loaded, and not otherwise.
    #[cfg(elf)]
    #[test]
    fn the_loaders_counts_change_when_a_library_is_loaded() {
        use crate::symbolize::dwarf::tests::{Scratch, c_build};
        let scratch = Scratch::new("loaded");
        let (library, _) = c_build(
            &scratch.0,
            "libkrabka_loaded.so",
            &[("krabka_loaded.c", "int krabka_loaded(void) { return 7; }\n")],
            &[],
            &[],
        );
        let before = Loaded::now();
        assert!(!before.changed(), "nothing loaded since");
        let path = std::ffi::CString::new(library.to_str().unwrap()).unwrap();
        // SAFETY: the path is a NUL-terminated string; the library has no constructors.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null());
        assert!(before.changed(), "a library loaded");
        assert!(!Loaded::now().changed());
        // SAFETY: the handle came from dlopen, and nothing of the library is used after.
        unsafe { libc::dlclose(handle) };
    }

    #[test]
    fn build_id_note_is_found() {
        let mut notes = Vec::new();
        // An unrelated note first.
        notes.extend(4u32.to_ne_bytes());
        notes.extend(2u32.to_ne_bytes());
        notes.extend(1u32.to_ne_bytes());
        notes.extend(b"ABC\0");
        notes.extend([9, 9, 0, 0]);
        notes.extend(4u32.to_ne_bytes());
        notes.extend(5u32.to_ne_bytes());
        notes.extend(3u32.to_ne_bytes());
        notes.extend(b"GNU\0");
        notes.extend([1, 2, 3, 4, 5, 0, 0, 0]);
        assert_eq!(gnu_build_id(&notes), Some(vec![1, 2, 3, 4, 5]));
        assert_eq!(gnu_build_id(&notes[..20]), None);
    }

    fn object(name: &str) -> LoadedObject {
        LoadedObject {
            name: name.to_owned(),
            file: None,
            bias: 0,
            segments: Vec::new(),
            range: 0..0,
            build_id: None,
            eh_frame_hdr: None,
            is_vdso: false,
        }
    }

    /// A session's objects: the newest listing, and the older listing's objects that no
    /// newer one overlaps (a library unloaded since), by address.
    #[test]
    fn merged_objects_keep_the_new_and_the_old_that_nothing_new_overlaps() {
        let at = |name: &str, range: Range<u64>| LoadedObject {
            range,
            ..object(name)
        };
        let newer = Objects {
            list: vec![at("app", 0x1000..0x2000), at("libnew.so", 0x5000..0x6000)],
        };
        let older = Objects {
            list: vec![
                at("libgone.so", 0x3000..0x4000),
                at("libreplaced.so", 0x1800..0x2800),
                at("libedge.so", 0x2000..0x3000),
                at("libunder.so", 0x0800..0x1001),
                at("libbelow.so", 0x0400..0x1000),
            ],
        };
        let merged = newer.merged_with(&older);
        let names: Vec<&str> = merged.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "libbelow.so",
                "app",
                "libedge.so",
                "libgone.so",
                "libnew.so"
            ],
            "ranges that only touch do not overlap"
        );
    }

    #[test]
    fn blocklist_entries_name_libraries_not_substrings() {
        let named = |path: &str, entry: &str| object(path).is_named(entry);
        assert!(named("/lib/x86_64-linux-gnu/libc.so.6", "libc"));
        assert!(named("/lib64/libc-2.31.so", "libc"));
        assert!(named("/lib/x86_64-linux-gnu/libgcc_s.so.1", "libgcc"));
        assert!(named("/lib/x86_64-linux-gnu/libpthread.so.0", "pthread"));
        assert!(named("/usr/lib/libssl.so.3", "libssl.so.3"));
        assert!(!named("/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "libc"));
        assert!(!named("/usr/lib/x86_64-linux-gnu/libcurl.so.4", "libc"));
        assert!(
            !named("/srv/pthread-bench/libc/app", "libc"),
            "directories do not count"
        );
        assert!(!named("/srv/app", "pthread"));
        assert!(!named("/lib/x86_64-linux-gnu/libc.so.6", ""));
        let mut vdso = object("linux-vdso.so.1");
        vdso.is_vdso = true;
        assert!(vdso.is_named("vdso"));
        assert!(!vdso.is_named("libc"), "the vDSO is named by `vdso` alone");
        assert!(!named("/lib/x86_64-linux-gnu/libc.so.6", "vdso"));
    }

    /// The mapping a profile carries is the kernel's own line of `/proc/self/maps`, which
    /// is what pprof's readers compute the load bias from: the executable's (whose code
    /// does not start on a page with lld or GNU ld) and libc's.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_mapping_of_code_is_the_kernels_line_in_proc_self_maps() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line_of = |address: u64| -> (Range<u64>, u64) {
            maps.lines()
                .find_map(|line| {
                    let mut fields = line.split_whitespace();
                    let (start, end) = fields.next()?.split_once('-')?;
                    let range =
                        u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?;
                    let offset = u64::from_str_radix(fields.nth(1)?, 16).ok()?;
                    range.contains(&address).then_some((range, offset))
                })
                .unwrap_or_else(|| panic!("{address:#x} is in no line of {maps}"))
        };
        let objects = Objects::current();
        for here in [
            build_id_note_is_found as *const () as u64,
            libc::getpid as *const () as u64,
        ] {
            let (_, object) = objects.find(here).unwrap();
            let text = object.text().unwrap();
            assert_eq!(object.mapping(), line_of(here), "{}", object.name);
            assert_eq!(
                object.mapping().0.start % page_size(),
                0,
                "{}: whole pages",
                object.name
            );
            assert!(object.mapping().0.contains(&text.avma.start));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_listed() {
        let objects = Objects::current();
        let here = build_id_note_is_found as *const () as u64;
        let (_, object) = objects.find(here).expect("this code is in a loaded object");
        assert_eq!(
            object.file.as_deref(),
            Some(std::path::Path::new("/proc/self/exe"))
        );
        assert!(object.text().is_some_and(|t| t.avma.contains(&here)));
        assert!(
            object.eh_frame_hdr.is_some(),
            "Rust executables have unwind tables"
        );
        assert!(objects.iter().any(|o| o.is_vdso), "Linux maps a vDSO");
        assert!(
            objects
                .iter()
                .any(|o| o.short_name().starts_with("libc.so"))
        );
        assert!(objects.find(0).is_none());
    }
}
