use super::*;

#[test]
fn pointer_authentication_bits_are_stripped_from_return_addresses() {
    // Objects up to a 48-bit address; a signed return address carries a code above.
    let objects = Objects::current();
    let mask = code_address_mask(&objects);
    let highest = objects.iter().map(|o| o.range.end).max().unwrap();
    assert_eq!(mask, u64::MAX >> highest.leading_zeros());
    let code = highest - 0x100;
    let signed = code | (0x2a << 55);
    assert_eq!(signed & mask, code, "the authentication code is removed");
    assert_eq!(code & mask, code, "a plain address is kept");
}

#[test]
fn every_object_gives_unwind_tables_and_libraries_give_copies() {
    let objects = Objects::current();
    let memory = Memory::choose().memory;
    let (_, tables) = unwinder_for(&objects, &memory);
    let with_tables = objects.iter().filter(|o| o.eh_frame_hdr.is_some()).count();
    assert_eq!(tables.len(), with_tables, "every object's tables are read");
    let libc = objects
        .iter()
        .find(|o| o.short_name().starts_with("libc.so"))
        .expect("libc is loaded");
    let libc_tables = Tables::of(libc, &memory).expect("libc has unwind tables");
    let in_libc = |slice: &MemorySlice| libc.range.contains(&(slice.ptr as u64));
    assert!(
        !in_libc(&libc_tables.hdr) && !in_libc(&libc_tables.eh_frame),
        "a library's tables are read from copies, never from its own pages"
    );
    // SAFETY: reading the library's own loaded header, which this test keeps loaded.
    let original = unsafe {
        std::slice::from_raw_parts(libc_tables.hdr_address as *const u8, libc_tables.hdr.len)
    };
    assert_eq!(
        &*libc_tables.hdr, original,
        "the copy is the header's bytes"
    );
    assert!(
        libc_tables.eh_frame.len > 1024,
        "{}",
        libc_tables.eh_frame.len
    );
    let copied = &*libc_tables.eh_frame;
    assert_eq!(
        (eh_frame_len(copied), &copied[copied.len() - 4..]),
        (copied.len(), &[0u8; 4][..]),
        "the copy of .eh_frame ends at its terminator, not at its segment's end"
    );

    // The executable's and the vDSO's tables are read where they are loaded: no
    // copy, and `.eh_frame` as far as its segment, never past it.
    for object in objects
        .iter()
        .filter(|o| o.is_vdso || o.file.as_deref() == Some(std::path::Path::new("/proc/self/exe")))
    {
        let tables = Tables::of(object, &memory).expect("unwind tables");
        let name = &object.name;
        assert!(tables._owned.is_empty(), "{name}: copied");
        assert_eq!(tables.hdr.ptr as u64, tables.hdr_address, "{name}");
        assert_eq!(
            tables.eh_frame.ptr as u64, tables.eh_frame_address,
            "{name}"
        );
        let end = tables.eh_frame_address + tables.eh_frame.len as u64;
        assert!(
            object
                .segments
                .iter()
                .any(|s| s.avma.contains(&tables.eh_frame_address) && s.avma.end == end),
            "{name}: .eh_frame in place up to {end:#x}, not a segment's end: {:?}",
            object.segments
        );
    }
    assert_eq!(
        objects
            .iter()
            .filter(|o| o.file.as_deref() == Some(std::path::Path::new("/proc/self/exe")))
            .count(),
        1,
        "the executable is listed"
    );
}

#[test]
fn each_address_is_looked_up_once_and_what_is_remembered_is_bounded() {
    use std::sync::atomic::Ordering::Relaxed;
    let objects = Objects::current();
    let unwinding = Unwinding::new(&objects, &[], Memory::choose().memory);
    let code = Unwinding::covers as *const () as u64;
    assert_eq!(unwinding.covers(code + 1), Some(true));
    assert_eq!(unwinding.covers(code + 1), Some(true));
    let looked_up = || unwinding.looked_up.load(Relaxed);
    assert_eq!(looked_up(), 1, "the second from memory");
    assert_eq!(unwinding.covers(8), None);
    assert_eq!(unwinding.covers(code + 1), Some(true));
    assert_eq!(looked_up(), 2, "both remembered");
    // Addresses below every mapping: in no object.
    for address in (2..=MAX_COVERED as u64 * 2).map(|i| i * 8) {
        assert_eq!(unwinding.covers(address), None);
    }
    let remembered = unwinding.covered.lock().unwrap().len();
    assert!((1..=MAX_COVERED).contains(&remembered), "{remembered}");
    assert_eq!(looked_up(), 1 + 2 * MAX_COVERED);
}

/// A copy that runs into memory that cannot be read is refused whole: the reader
/// returns the readable part first, and the copy asks for the rest where it
/// begins, which fails. Three pages of a file of two, each with bytes of its own:
/// the third, past the file's end, cannot be read (even through `/proc/self/mem`,
/// which reads pages the process itself may not). With either reader.
#[test]
fn a_copy_that_runs_into_unreadable_memory_is_refused() {
    use std::os::fd::AsRawFd as _;
    // The kernel's page size (4 KiB here, 16 or 64 KiB on some arm64 kernels): the
    // third page must lie wholly past the file's end.
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page).expect("a page size");
    let path = std::env::temp_dir().join(format!("krabka-copy-{}", std::process::id()));
    let mut contents = vec![0xaa; page];
    contents.resize(2 * page, 0xbb);
    std::fs::write(&path, &contents).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // SAFETY: a fresh private mapping of the open file, this test's own; its third
    // page lies past the file's end and is never touched but by the readers.
    let pages = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            3 * page,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(pages, libc::MAP_FAILED);
    let second = pages as u64 + page as u64;
    let pid = libc::pid_t::try_from(std::process::id()).unwrap();
    for memory in [Memory::choose().memory, Memory::VmReadv { pid }] {
        let name = memory.name();
        let copied = copy_of(&memory, second, page).expect("a readable page");
        assert!(copied.iter().all(|b| *b == 0xbb), "{name}");
        assert!(
            copy_of(&memory, second, 2 * page).is_none(),
            "{name}: a copy into the page past the file's end"
        );
    }
    // SAFETY: the mapping made above, no longer read.
    assert_eq!(unsafe { libc::munmap(pages, 3 * page) }, 0);
}

#[test]
fn an_eh_frame_ends_at_its_terminator() {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&[1; 8]);
    bytes.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
    bytes.extend_from_slice(&4u64.to_le_bytes());
    bytes.extend_from_slice(&[2; 4]);
    bytes.extend_from_slice(&0u32.to_le_bytes());
    let whole = bytes.len();
    bytes.extend_from_slice(&[0xee; 64]);
    assert_eq!(
        eh_frame_len(&bytes),
        whole,
        "up to and with the zero terminator"
    );
    assert_eq!(eh_frame_len(&bytes[..10]), 10, "a cut entry: what there is");
    let huge = [0xff, 0xff, 0xff, 0x7f, 0, 0];
    assert_eq!(eh_frame_len(&huge), huge.len(), "a length past the end");
    // A 64-bit length that ends just short of the address space's end: passed over
    // like any length past the end, never stepped to (the next entry's length would
    // be read at an offset that overflows).
    let mut wrapping = 0xffff_ffffu32.to_le_bytes().to_vec();
    wrapping.extend_from_slice(&(u64::MAX - 13).to_le_bytes());
    assert_eq!(eh_frame_len(&wrapping), wrapping.len());
}
