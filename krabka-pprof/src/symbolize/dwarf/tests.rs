//! The DWARF reader's tests, over this test binary's own DWARF and copies of it split
//! as packagers split them.
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Stage, resolve, resolve_observed, resolve_with_roots};
use crate::objects::{LoadedObject, Objects};
use crate::symbolize::names::FunctionLine;

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

fn named(level: &FunctionLine) -> String {
    level.name.clone()
}

/// The levels found inside [`a_function_with_lines`], outermost being it.
fn inside(found: &[Vec<FunctionLine>]) -> Vec<&Vec<FunctionLine>> {
    found
        .iter()
        .filter(|levels| {
            levels
                .last()
                .is_some_and(|l| named(l).ends_with("dwarf::tests::a_function_with_lines"))
        })
        .collect()
}

/// A lookup of no address returns at once: no file is looked for, opened or read (a
/// profile whose samples all fell in other objects asks each object for nothing).
#[test]
fn no_addresses_open_no_debug_file() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let roots = [Path::new(super::DEBUG_ROOT)];
    let mut stages = Vec::new();
    let found = resolve_observed(object, &addresses, &roots, &mut |stage| stages.push(stage));
    assert!(
        stages.contains(&Stage::Opened),
        "this binary's own DWARF is found: {stages:?}"
    );
    assert!(!inside(&found).is_empty());
    stages.clear();
    let found = resolve_observed(object, &[], &roots, &mut |stage| stages.push(stage));
    assert!(found.is_empty());
    assert_eq!(stages, [], "a file opened for no address");
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
            outermost
                .filename
                .ends_with("krabka-pprof/src/symbolize/dwarf/tests.rs"),
            "{outermost:?}"
        );
        assert!(
            Path::new(&outermost.filename).is_absolute(),
            "{outermost:?}"
        );
        // Line 0 is code the compiler made up (DWARF's "no line").
        assert!(
            outermost.line == 0 || lines.contains(&outermost.line),
            "line {} of dwarf/tests.rs; the function spans {lines:?}",
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
    let inlined: Vec<&Vec<FunctionLine>> = inside(&found)
        .into_iter()
        .filter(|levels| levels.iter().any(|l| named(l).ends_with("an_inlined_step")))
        .collect();
    assert!(!inlined.is_empty(), "{:?}", inside(&found));
    for levels in inlined {
        // What it inlined in turn (`black_box`) comes first, innermost first.
        let at = levels
            .iter()
            .position(|l| named(l).ends_with("dwarf::tests::an_inlined_step"))
            .unwrap();
        let step = &levels[at];
        assert!(
            step.filename
                .ends_with("krabka-pprof/src/symbolize/dwarf/tests.rs"),
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
        assert!(
            caller.filename.ends_with("src/symbolize/dwarf/tests.rs"),
            "{levels:?}"
        );
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
        let dir =
            std::env::temp_dir().join(format!("krabka-pprof-lines-{name}-{}", std::process::id()));
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

/// A library of this test's own at `file`, as if loaded where `object` is: its build ID
/// is its own, not this binary's.
fn as_if_library_loaded_from(object: &LoadedObject, file: &Path) -> LoadedObject {
    LoadedObject {
        build_id: None,
        ..as_if_loaded_from(object, file)
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

    // Beside the binary, where the link is looked for first.
    std::fs::rename(
        bin.join(".debug").join("stripped.debug"),
        bin.join("stripped.debug"),
    )
    .unwrap();
    assert_eq!(
        resolve_with_roots(&loaded, &addresses, &[&root]),
        want,
        "the debug file beside the binary"
    );
    // Under a root by the binary's own directory, as `/usr/lib/debug/usr/bin/x.debug`.
    let dir = std::fs::canonicalize(&bin).unwrap();
    let under = root.join(dir.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&under).unwrap();
    std::fs::rename(bin.join("stripped.debug"), under.join("stripped.debug")).unwrap();
    assert_eq!(
        resolve_with_roots(&loaded, &addresses, &[&root]),
        want,
        "the debug file under the root by the binary's directory"
    );
    // Gone from there too: no lines (each find above was the file where it was put).
    std::fs::remove_file(under.join("stripped.debug")).unwrap();
    assert!(
        resolve_with_roots(&loaded, &addresses, &[&root])
            .iter()
            .all(Vec::is_empty),
        "lines with the debug file gone"
    );
}

/// Where distributions install `object`'s debug file under `root`:
/// `<root>/.build-id/xx/yyyy.debug`; its directory is made.
fn build_id_path(root: &Path, object: &LoadedObject) -> PathBuf {
    let id = object
        .build_id
        .as_deref()
        .expect("rustc links with a build ID");
    let hex = crate::objects::hex(id);
    let dir = root.join(".build-id").join(&hex[..2]);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}.debug", &hex[2..]))
}

/// Runs `work` on a thread of its own and waits for it by this test's own clock: a
/// lookup that blocks (on a FIFO) or runs away (on a crafted file) fails the test instead
/// of hanging it. `unblock` runs if it times out, to let the thread go.
fn within<T: Send + 'static>(
    limit: std::time::Duration,
    work: impl FnOnce() -> T + Send + 'static,
    unblock: impl FnOnce(),
) -> T {
    let (send, receive) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    let thread = std::thread::spawn(move || {
        let _ = send.send(work());
    });
    match receive.recv_timeout(limit) {
        Ok(done) => {
            thread.join().unwrap();
            done
        }
        Err(_) => {
            unblock();
            panic!(
                "the lookup did not return within {limit:?} ({:?})",
                started.elapsed()
            );
        }
    }
}

/// Writes `bytes` over `path` the way `cp` does: truncated first, then rewritten in
/// place (the same inode, which a reader of the file keeps reading).
fn cp_over(path: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    file.write_all(bytes).unwrap();
}

#[test]
fn a_debug_file_truncated_after_it_is_opened_gives_no_lines_and_no_sigbus() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let want = resolve(object, &addresses);
    let scratch = Scratch::new("truncated");
    let (stripped, debug) = split(&scratch.0);
    let root = scratch.0.join("debug-root");
    let installed = build_id_path(&root, object);
    std::fs::copy(&debug, &installed).unwrap();
    let loaded = as_if_loaded_from(object, &stripped);
    assert_eq!(resolve_with_roots(&loaded, &addresses, &[&root]), want);

    // `cp` truncates the file it writes over before it writes: a lookup that has opened
    // the file but not yet read its sections finds nothing there. Reading what is gone
    // through a memory map raised SIGBUS, which kills the process.
    let found = resolve_observed(&loaded, &addresses, &[&root], &mut |stage| {
        if stage == Stage::Opened {
            cp_over(&installed, &[]);
        }
    });
    assert!(found.iter().all(Vec::is_empty), "lines from an empty file");

    // Rewritten with other bytes of the same length (every byte past the ELF header
    // changed): whatever the lookup makes of them, it returns.
    let original = std::fs::read(&debug).unwrap();
    let mut garbled = original.clone();
    for byte in &mut garbled[64..] {
        *byte = byte.rotate_left(3) ^ 0xa5;
    }
    let _ = resolve_observed(&loaded, &addresses, &[&root], &mut |stage| {
        if stage == Stage::Opened {
            cp_over(&installed, &garbled);
        }
    });
    // Half of it, cut inside the DWARF sections.
    let _ = resolve_observed(&loaded, &addresses, &[&root], &mut |stage| {
        if stage == Stage::Opened {
            cp_over(&installed, &original[..original.len() / 2]);
        }
    });
    // And once the file is whole again, its lines are read again.
    cp_over(&installed, &original);
    assert_eq!(resolve_with_roots(&loaded, &addresses, &[&root]), want);
}

#[test]
fn a_debug_file_rewritten_in_place_while_lookups_read_it_never_kills_the_process() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let want = resolve(object, &addresses);
    let scratch = Scratch::new("rewritten");
    let (stripped, debug) = split(&scratch.0);
    let root = scratch.0.join("debug-root");
    let installed = build_id_path(&root, object);
    std::fs::copy(&debug, &installed).unwrap();
    let loaded = as_if_loaded_from(object, &stripped);
    let original = std::fs::read(&debug).unwrap();

    // One thread looks lines up again and again while another writes over the file the
    // way `cp` does: empty, then the bytes of another file (half of it, garbled), then
    // its own bytes again. Both loops are bounded; the process must outlive them.
    let lookups = {
        let (loaded, addresses, root) = (loaded.clone(), addresses.clone(), root.clone());
        std::thread::spawn(move || {
            let mut with_lines = 0;
            for _ in 0..40 {
                let found = resolve_with_roots(&loaded, &addresses, &[&root]);
                with_lines += usize::from(found.iter().any(|levels| !levels.is_empty()));
            }
            with_lines
        })
    };
    let garbled: Vec<u8> = original.iter().map(|b| b ^ 0x5a).collect();
    let versions: [&[u8]; 4] = [&[], &original[..original.len() / 2], &garbled, &original];
    for round in 0..12 {
        cp_over(&installed, versions[round % versions.len()]);
    }
    let with_lines = lookups.join().expect("the lookups returned");
    eprintln!("{with_lines} of 40 lookups found lines while the file was rewritten");
    cp_over(&installed, &original);
    assert_eq!(resolve_with_roots(&loaded, &addresses, &[&root]), want);
}

#[test]
fn a_fifo_or_a_directory_where_a_debug_file_is_looked_for_is_passed_over_at_once() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let want = resolve(object, &addresses);
    assert!(!inside(&want).is_empty());
    let scratch = Scratch::new("fifo");
    let (stripped, debug) = split(&scratch.0);
    // A binary that links its debug file, installed in `.debug/` beside it; and where
    // the debug file by build ID would be (looked at first), a FIFO nobody writes to.
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
    let root = scratch.0.join("debug-root");
    let by_id = build_id_path(&root, object);
    let fifo = std::ffi::CString::new(by_id.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);

    let limit = std::time::Duration::from_secs(60);
    let release = |path: PathBuf| {
        move || {
            // Opening the other end lets a reader blocked in open(2) or read(2) go.
            let _ = std::fs::OpenOptions::new().write(true).open(path);
        }
    };
    let found = within(
        limit,
        {
            let (loaded, addresses, root) = (loaded.clone(), addresses.clone(), root.clone());
            move || resolve_with_roots(&loaded, &addresses, &[&root])
        },
        release(by_id.clone()),
    );
    assert_eq!(found, want, "the linked debug file, past the FIFO");

    // A directory there instead: passed over as well.
    std::fs::remove_file(&by_id).unwrap();
    std::fs::create_dir(&by_id).unwrap();
    let found = within(
        limit,
        {
            let (loaded, addresses, root) = (loaded.clone(), addresses.clone(), root.clone());
            move || resolve_with_roots(&loaded, &addresses, &[&root])
        },
        || {},
    );
    assert_eq!(found, want, "the linked debug file, past the directory");

    // The FIFO as the binary itself (a library's path taken over): nothing, at once.
    std::fs::remove_dir(&by_id).unwrap();
    let own = scratch.0.join("own-fifo");
    let own_c = std::ffi::CString::new(own.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(own_c.as_ptr(), 0o600) }, 0);
    let fifo_object = as_if_loaded_from(object, &own);
    let found = within(
        limit,
        {
            let addresses = addresses.clone();
            move || resolve_with_roots(&fifo_object, &addresses, &[&root])
        },
        release(own.clone()),
    );
    assert!(found.iter().all(Vec::is_empty));
}

/// `RssFile:` or `RssAnon:` of this process, in bytes.
fn rss(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    kib * 1024
}

/// The resident bytes of every mapping of `path` in this process (`/proc/self/smaps`).
fn resident_in_mappings_of(path: &Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let path = path.to_str().unwrap();
    let mut in_it = false;
    let mut resident = 0;
    for line in smaps.lines() {
        if line.starts_with(|c: char| c.is_ascii_hexdigit()) && line.contains('-') {
            in_it = line.ends_with(path);
        } else if in_it && let Some(rest) = line.strip_prefix("Rss:") {
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap();
            resident += kib * 1024;
        }
    }
    resident
}

#[test]
fn a_lookup_keeps_no_page_of_the_debug_file_resident() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let want = resolve(object, &addresses);
    let scratch = Scratch::new("resident");
    let (stripped, debug) = split(&scratch.0);
    let root = scratch.0.join("debug-root");
    let installed = build_id_path(&root, object);
    std::fs::copy(&debug, &installed).unwrap();
    let loaded = as_if_loaded_from(object, &stripped);
    // Once first, so that the lookup's own code is resident before measuring.
    assert_eq!(resolve_with_roots(&loaded, &addresses, &[&root]), want);

    let (file_before, anon_before) = (rss("RssFile:"), rss("RssAnon:"));
    // After each unit, before what was read of it may be given back: the lookup's peaks.
    let mut at_peak: Option<(u64, u64, u64)> = None;
    let found = resolve_observed(&loaded, &addresses, &[&root], &mut |stage| {
        if stage == Stage::UnitRead {
            let now = (
                resident_in_mappings_of(&installed),
                rss("RssFile:"),
                rss("RssAnon:"),
            );
            let most = at_peak.get_or_insert(now);
            *most = (most.0.max(now.0), most.1.max(now.1), most.2.max(now.2));
        }
    });
    assert_eq!(found, want);
    let (mapped, file_peak, anon_peak) = at_peak.expect("the lookup read a unit");
    eprintln!(
        "at the lookup's peak: {} KiB of the debug file mapped; RssFile {:+} KiB, RssAnon \
         {:+} KiB",
        mapped / 1024,
        (file_peak as i64 - file_before as i64) / 1024,
        (anon_peak as i64 - anon_before as i64) / 1024,
    );
    assert_eq!(
        mapped, 0,
        "pages of the debug file resident in this process"
    );
}

/// The bytes each thread holds from the heap, and their peak: how much a lookup
/// allocates, measured on its own thread while other tests run on theirs.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub(crate) struct Counting;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn add(bytes: isize) {
        // Neither cell has a destructor: both are there for as long as the thread runs.
        let _ = LIVE.try_with(|live| {
            let now = live.get() + bytes;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }

    // SAFETY: every call is passed to the system allocator as it came; the counting
    // beside it neither allocates nor touches the memory.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires of it.
            let at = unsafe { System.alloc(layout) };
            if !at.is_null() {
                add(layout.size() as isize);
            }
            at
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as for `alloc`.
            let at = unsafe { System.alloc_zeroed(layout) };
            if !at.is_null() {
                add(layout.size() as isize);
            }
            at
        }

        unsafe fn dealloc(&self, at: *mut u8, layout: Layout) {
            // SAFETY: `at` came from this allocator (the system's) with `layout`.
            unsafe { System.dealloc(at, layout) };
            add(-(layout.size() as isize));
        }

        unsafe fn realloc(&self, at: *mut u8, layout: Layout, size: usize) -> *mut u8 {
            // SAFETY: `at` came from this allocator with `layout`; `size` is the caller's.
            let moved = unsafe { System.realloc(at, layout, size) };
            if !moved.is_null() {
                add(size as isize - layout.size() as isize);
            }
            moved
        }
    }

    /// What `work` returns, and the most it held from the heap at once, on this thread.
    pub(crate) fn peak_of<T>(work: impl FnOnce() -> T) -> (T, usize) {
        LIVE.set(0);
        PEAK.set(0);
        let done = work();
        (done, PEAK.get().max(0) as usize)
    }
}

#[global_allocator]
static COUNTING: counting::Counting = counting::Counting;

/// `name`'s size in the ELF file at `path`.
fn section_size(path: &Path, name: &str) -> usize {
    use object::{Object as _, ObjectSection as _};
    let bytes = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    elf.section_by_name(name).map_or(0, |s| s.size() as usize)
}

#[test]
fn crafted_range_lists_and_aranges_of_millions_of_ranges_keep_the_lookup_bounded() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let scratch = Scratch::new("crafted");
    let (stripped, debug) = split(&scratch.0);
    let root = scratch.0.join("debug-root");
    let installed = build_id_path(&root, object);
    std::fs::copy(&debug, &installed).unwrap();
    let loaded = as_if_loaded_from(object, &stripped);
    let (want, honest) = counting::peak_of(|| resolve_with_roots(&loaded, &addresses, &[&root]));
    assert!(!inside(&want).is_empty());

    // Each crafted file: this binary's debug file with one section replaced, installed
    // where its build ID says, then looked up on a thread of its own.
    let crafted = |section: &str, contents: Vec<u8>| {
        let replacement = scratch.0.join("replacement");
        std::fs::write(&replacement, contents).unwrap();
        let _ = std::fs::remove_file(&installed);
        objcopy(&[
            format!("--update-section={section}={}", replacement.display()).as_ref(),
            debug.as_os_str(),
            installed.as_os_str(),
        ]);
        let (loaded, addresses, root) = (loaded.clone(), addresses.clone(), root.clone());
        let started = std::time::Instant::now();
        let (found, peak) = within(
            std::time::Duration::from_secs(120),
            move || counting::peak_of(|| resolve_with_roots(&loaded, &addresses, &[&root])),
            || {},
        );
        eprintln!(
            "{section} crafted: returned in {:?}, held {} KiB of heap at most (the honest \
             file: {} KiB)",
            started.elapsed(),
            peak / 1024,
            honest / 1024
        );
        assert!(
            peak <= 2 * honest + (4 << 20),
            "{section}: {peak} bytes of heap at once; the honest file took {honest}"
        );
        found
    };

    // A million range-list entries, none ending its list, each covering every address:
    // every function DIE with `DW_AT_ranges` claims every wanted address, with a list
    // that runs to the end of the section.
    let entries = (section_size(&debug, ".debug_ranges") / 16).max(1 << 20);
    let mut ranges = Vec::with_capacity(entries * 16);
    for _ in 0..entries {
        ranges.extend_from_slice(&1u64.to_le_bytes());
        ranges.extend_from_slice(&(1u64 << 62).to_le_bytes());
    }
    let found = crafted(".debug_ranges", ranges);
    assert_eq!(found.len(), addresses.len());
    for levels in &found {
        assert!(
            levels.len() <= super::inline::MAX_LEVELS,
            "{} levels",
            levels.len()
        );
    }

    // One address-range set of a million entries, each covering every address.
    let tuples = 1usize << 20;
    let mut aranges = Vec::with_capacity(16 + tuples * 16);
    aranges.extend_from_slice(&(12 + 16 * tuples as u32).to_le_bytes());
    aranges.extend_from_slice(&2u16.to_le_bytes());
    aranges.extend_from_slice(&0u32.to_le_bytes());
    aranges.extend_from_slice(&[8, 0, 0, 0, 0, 0]);
    for _ in 0..tuples {
        aranges.extend_from_slice(&1u64.to_le_bytes());
        aranges.extend_from_slice(&(1u64 << 62).to_le_bytes());
    }
    let found = crafted(".debug_aranges", aranges);
    assert_eq!(found.len(), addresses.len());
}

/// A C library with DWARF (`cc -g`, DWARF 5 with today's gcc and clang), built in `dir`:
/// small enough for its debug sections to inflate within the cap. Its path, and the
/// file address of [`C_FUNCTION`] in it.
fn c_library(dir: &Path) -> (PathBuf, u64) {
    let (library, ranges) = c_build(
        dir,
        "libkrabka_lines.so",
        &[(
            "krabka_lines.c",
            "unsigned long krabka_c_function(unsigned long rounds) {\n\
             \x20   unsigned long x = 14;\n\
             \x20   for (unsigned long i = 0; i < rounds; i++)\n\
             \x20       x = (x * 3) ^ (x >> 7) ^ i;\n\
             \x20   return x;\n\
             }\n",
        )],
        &["-g", "-O1"],
        &[C_FUNCTION],
    );
    (library, ranges[0].start)
}

const C_FUNCTION: &str = "krabka_c_function";

#[test]
fn compressed_debug_sections_are_inflated_within_the_cap() {
    let (objects, index, addresses) = probe();
    let object = objects.get(index).unwrap();
    let scratch = Scratch::new("compressed");
    let (library, function) = c_library(&scratch.0);
    let at: Vec<u64> = (function..function + 8).collect();
    let loaded_from = |file: &Path| as_if_library_loaded_from(object, file);
    let plain = resolve(&loaded_from(&library), &at);
    for levels in &plain {
        let outermost = levels
            .last()
            .expect("lines for every byte of the C function");
        assert_eq!(outermost.name, C_FUNCTION, "{plain:?}");
        assert!(outermost.filename.ends_with("/krabka_lines.c"), "{plain:?}");
        assert!((1..=5).contains(&outermost.line), "{plain:?}");
    }

    // zlib, as `SHF_COMPRESSED` sections (what distributions ship) and as GNU's older
    // `.zdebug_*` sections: the same lines.
    for format in ["zlib", "zlib-gnu"] {
        let compressed = scratch.0.join(format!("libkrabka_lines.{format}.so"));
        objcopy(&[
            format!("--compress-debug-sections={format}").as_ref(),
            library.as_os_str(),
            compressed.as_os_str(),
        ]);
        assert_eq!(resolve(&loaded_from(&compressed), &at), plain, "{format}");
    }

    // This binary's own DWARF inflates to far more than 4 MiB: no lines, at once.
    let (_, debug) = split(&scratch.0);
    let compressed = scratch.0.join("compressed.debug");
    objcopy(&[
        "--compress-debug-sections=zlib".as_ref(),
        debug.as_os_str(),
        compressed.as_os_str(),
    ]);
    let root = scratch.0.join("debug-root");
    std::fs::rename(&compressed, build_id_path(&root, object)).unwrap();
    let stripped = scratch.0.join("stripped");
    let found = resolve_with_roots(&as_if_loaded_from(object, &stripped), &addresses, &[&root]);
    assert!(found.iter().all(Vec::is_empty), "inflated past the cap");
}

/// A unit's code ranges read from its root DIE alone (where `.debug_aranges` is missing,
/// as in LLVM's builds) are the ranges gimli reads with the whole unit, and that reading
/// serves what gcc writes before DWARF 5: one span (`DW_AT_high_pc` an address in DWARF
/// 3, a size since) and range lists (`-ffunction-sections`). DWARF 5's range lists may
/// need the unit's bases: those units may be left to the whole unit's reading, and a
/// split unit's must be (its `DW_AT_low_pc` is an index into `.debug_addr`).
#[test]
fn a_units_ranges_read_from_its_root_alone_are_the_whole_units() {
    let scratch = Scratch::new("root-ranges");
    let files = [
        (
            "krabka_one.c",
            "unsigned long krabka_one(unsigned long x) { return x * 3 + 1; }\n\
             unsigned long krabka_two(unsigned long x) { return (x >> 3) ^ x; }\n",
        ),
        (
            "krabka_other.c",
            "unsigned long krabka_three(unsigned long x) { return x * x + 7; }\n",
        ),
    ];
    // Each version with and without function sections, and DWARF 5 split.
    let builds = ["-gdwarf-3", "-gdwarf-4", "-gdwarf-5"]
        .into_iter()
        .flat_map(|version| [vec![version], vec![version, "-ffunction-sections"]])
        .chain([vec!["-gdwarf-5", "-gsplit-dwarf"]]);
    for flags in builds {
        let build = flags.join(" ");
        let (function_sections, split) = (
            flags.contains(&"-ffunction-sections"),
            flags.contains(&"-gsplit-dwarf"),
        );
        let flags = [&flags[..], &["-O1"]].concat();
        let (library, _) = c_build(
            &scratch.0,
            &format!("libkrabka_roots{}.so", build.replace(' ', "")),
            &files,
            &flags,
            &[],
        );
        let file = super::file::DebugFile::find(&library, &library, None, &[]).expect("DWARF");
        let sections = super::sections::Sections::load(&file).unwrap();
        let dwarf = sections.dwarf();
        let mut headers = dwarf.units();
        let mut units = 0;
        while let Some(header) = headers.next().unwrap() {
            let unit = dwarf.unit(header).unwrap();
            let mut whole = Vec::new();
            let mut ranges = dwarf.unit_ranges(&unit).unwrap();
            while let Some(range) = ranges.next().unwrap() {
                whole.push((range.begin, range.end));
            }
            assert!(!whole.is_empty(), "{build}: a unit with code");
            let mut alone = Vec::new();
            let read = super::units::root_ranges(&dwarf, &header, &mut |begin, end| {
                alone.push((begin, end));
            });
            if split {
                assert!(read.is_none(), "{build}: the address needs the unit's base");
            } else if header.version() < 5 || !function_sections {
                assert!(read.is_some(), "{build}: read from the root alone");
            }
            if read.is_some() {
                assert_eq!(alone, whole, "{build}");
            }
            units += 1;
        }
        assert_eq!(units, 2, "{build}");
    }
}

/// A C++ member function defined outside its class and inlined: the DIE of its
/// definition has no name of its own, only a `DW_AT_specification` pointing at the
/// declaration in the class, which has the name; the inlined frame is named from there.
#[test]
fn an_inlined_member_defined_outside_its_class_is_named_by_its_declaration() {
    let (objects, index, _) = probe();
    let object = objects.get(index).unwrap();
    let scratch = Scratch::new("member");
    let (library, ranges) = c_build(
        &scratch.0,
        "libkrabka_member.so",
        &[(
            "krabka_member.cpp",
            "struct Krabka {\n\
             \x20   static unsigned long step(unsigned long y);\n\
             };\n\
             inline unsigned long Krabka::step(unsigned long y) {\n\
             \x20   return (y * 2654435761u) ^ (y >> 13);\n\
             }\n\
             extern \"C\" unsigned long krabka_member_outer(unsigned long x) {\n\
             \x20   return Krabka::step(x) + Krabka::step(x >> 1);\n\
             }\n",
        )],
        &["-g", "-O2"],
        &["krabka_member_outer"],
    );
    let at: Vec<u64> = ranges[0].clone().collect();
    let found = resolve(&as_if_library_loaded_from(object, &library), &at);
    let inlined: Vec<&str> = found
        .iter()
        .filter(|levels| levels.len() == 2)
        .map(|levels| levels[0].name.as_str())
        .collect();
    assert!(!inlined.is_empty(), "the inlined calls: {found:?}");
    assert!(
        inlined.iter().all(|name| name.contains("step")),
        "{inlined:?}"
    );
}

#[test]
fn sections_are_read_as_the_file_holds_them_and_only_where_they_are_read() {
    use gimli::{Reader as _, Section as _};
    let scratch = Scratch::new("paged");
    let (_, debug) = split(&scratch.0);
    let bytes = std::fs::read(&debug).unwrap();
    let file = super::file::DebugFile::find(&debug, &debug, None, &[]).expect("DWARF");
    let line = file
        .layout
        .placement(gimli::SectionId::DebugLine)
        .expect(".debug_line");
    let offset = line.offset as usize;
    let expected = &bytes[offset..offset + line.size as usize];
    let sections = super::sections::Sections::load(&file).unwrap();
    let dwarf = sections.dwarf();
    let whole = *dwarf.debug_line.reader();
    assert_eq!(whole.len(), expected.len());
    assert_eq!(sections.resident(), 0, "nothing read before it is read");

    // A few bytes in the middle: one block of the file in memory, no more.
    let mut middle = whole;
    middle.skip(expected.len() / 2 - 3).unwrap();
    let mut six = [0u8; 6];
    middle.read_slice(&mut six).unwrap();
    assert_eq!(six, expected[expected.len() / 2 - 3..][..6]);
    assert!(
        sections.resident() <= 2 * 4096,
        "{} bytes",
        sections.resident()
    );

    // All of it, in pieces that straddle blocks, as gimli reads: the file's bytes, and
    // a NUL found across blocks where the file has it.
    let mut reader = whole;
    let mut read = Vec::with_capacity(expected.len());
    while !reader.is_empty() {
        let mut piece = vec![0u8; 4093.min(reader.len())];
        reader.read_slice(&mut piece).unwrap();
        read.extend_from_slice(&piece);
    }
    assert!(
        read == expected,
        "the section as read differs from the file"
    );
    let mut from = whole;
    from.skip(4090).unwrap();
    let nul = expected[4090..].iter().position(|b| *b == 0).unwrap();
    assert_eq!(from.find(0).unwrap(), nul);

    // Given back: nothing held, and read again as the file holds it; looking for the
    // end of a string reads without keeping.
    sections.release_all();
    assert_eq!(sections.resident(), 0);
    assert_eq!(from.find(0).unwrap(), nul);
    assert_eq!(sections.resident(), 0, "find kept what it read");
    let mut again = whole;
    again.skip(expected.len() / 2 - 3).unwrap();
    again.read_slice(&mut six).unwrap();
    assert_eq!(six, expected[expected.len() / 2 - 3..][..6]);

    // Each section hands out at most eight times its size and 4 MiB: a file that makes
    // a lookup read the same bytes again and again runs out.
    let fresh = super::sections::Sections::load(&file).unwrap();
    let fresh_dwarf = fresh.dwarf();
    let mut block = [0u8; 4096];
    let mut reads = 0u64;
    while reads < 1 << 20
        && fresh_dwarf
            .debug_line
            .reader()
            .clone()
            .read_slice(&mut block)
            .is_ok()
    {
        reads += 1;
    }
    let budget = 8 * expected.len() as u64 + (4 << 20);
    assert_eq!(reads, budget / 4096, "reads of 4 KiB");

    // The file cut short under the reader: a read past the cut fails, and never faults.
    sections.release_all();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&debug)
        .unwrap()
        .set_len(line.offset + 100)
        .unwrap();
    let mut head = whole;
    head.read_slice(&mut six).unwrap();
    assert_eq!(six, expected[..6]);
    let mut past = whole;
    past.skip(200).unwrap();
    assert!(
        past.read_slice(&mut six).is_err(),
        "bytes past the end of the file"
    );
}

/// A C library built by `cc` from `files` (name, text) with `flags`, in `dir`: its path,
/// and the file address range of each function in `functions`.
pub(crate) fn c_build(
    dir: &Path,
    name: &str,
    files: &[(&str, &str)],
    flags: &[&str],
    functions: &[&str],
) -> (PathBuf, Vec<std::ops::Range<u64>>) {
    use object::{Object as _, ObjectSymbol as _};
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let library = dir.join(name);
    let status = Command::new("cc")
        .current_dir(dir)
        .args(["-shared", "-fPIC"])
        .args(flags)
        .arg("-o")
        .arg(&library)
        .args(
            files
                .iter()
                .map(|(file, _)| file)
                .filter(|f| f.ends_with(".c") || f.ends_with(".cpp")),
        )
        .status()
        .expect("cc runs: rustc links with it");
    assert!(status.success(), "cc {flags:?}");
    let bytes = std::fs::read(&library).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let ranges = functions
        .iter()
        .map(|function| {
            let symbol = elf
                .symbols()
                .find(|s| s.name() == Ok(function))
                .unwrap_or_else(|| panic!("{function}'s symbol"));
            symbol.address()..symbol.address() + symbol.size()
        })
        .collect();
    (library, ranges)
}

/// A link-time-optimised C library, as DWARF 4 and 5: the concrete functions refer to
/// their names in other units (`DW_FORM_ref_addr`), the inlined call has a range list
/// and a call site in a header of its own, neither the caller's file nor the callee's.
#[test]
fn an_lto_builds_inlined_calls_across_units_have_their_names_files_and_lines() {
    let (objects, index, _) = probe();
    let object = objects.get(index).unwrap();
    let scratch = Scratch::new("lto");
    let files: [(&str, &str); 4] = [
        (
            "krabka_a.c",
            "unsigned long krabka_inner(unsigned long x);\n\
             unsigned long krabka_outer(unsigned long rounds) {\n\
             \x20   unsigned long x = 14;\n\
             \x20   for (unsigned long i = 0; i < rounds; i++)\n\
             \x20       x = krabka_inner(x ^ i);\n\
             \x20   return x;\n\
             }\n",
        ),
        (
            "krabka_b.c",
            "#include \"krabka_step.h\"\n\
             unsigned long krabka_inner(unsigned long x) {\n\
             \x20   unsigned long y = x * 3;\n\
             #include \"krabka_call.h\"\n\
             \x20   return (y >> 7) ^ (y << 3);\n\
             }\n",
        ),
        (
            "krabka_step.h",
            "static inline unsigned long krabka_step(unsigned long y) {\n\
             \x20   return (y * 2654435761u) ^ (y >> 13);\n\
             }\n",
        ),
        ("krabka_call.h", "    y = krabka_step(y);\n"),
    ];
    // Each also with each function in a section of its own (the units' code ranges are
    // then range lists, not one span), and each without `.debug_aranges` (as LLVM
    // builds are: the units are placed by their own ranges instead).
    let builds = ["-gdwarf-4", "-gdwarf-5"]
        .into_iter()
        .flat_map(|version| [(version, false), (version, true)])
        .flat_map(|(version, sections)| [(version, sections, true), (version, sections, false)]);
    for (version, sections, aranges) in builds {
        let flags = [version, "-O2", "-flto", "-ffunction-sections"];
        let flags = if sections { &flags[..] } else { &flags[..3] };
        let (mut library, ranges) = c_build(
            &scratch.0,
            &format!("libkrabka_lto{version}{sections}.so"),
            &files,
            flags,
            &["krabka_inner", "krabka_outer"],
        );
        if !aranges {
            let without = scratch
                .0
                .join(format!("libkrabka_lto{version}{sections}-no-aranges.so"));
            objcopy(&[
                "--remove-section=.debug_aranges".as_ref(),
                library.as_os_str(),
                without.as_os_str(),
            ]);
            library = without;
        }
        let version = format!("{version}, function sections {sections}, aranges {aranges}");
        let loaded = as_if_library_loaded_from(object, &library);
        let described = |levels: &Vec<FunctionLine>| -> Vec<(String, String, i64, i64)> {
            levels
                .iter()
                .map(|l| {
                    let file = l.filename.rsplit('/').next().unwrap_or_default().to_owned();
                    (l.name.clone(), file, l.line, l.start_line)
                })
                .collect()
        };
        let own = |line: i64| ("krabka_inner".to_owned(), "krabka_b.c".to_owned(), line, 2);
        let inlined = [
            ("krabka_step".to_owned(), "krabka_step.h".to_owned(), 2, 1),
            // At the call, in the header it stands in: no first line of that file.
            ("krabka_inner".to_owned(), "krabka_call.h".to_owned(), 1, 0),
        ];
        let inner: Vec<u64> = ranges[0].clone().collect();
        let chains: Vec<_> = resolve(&loaded, &inner).iter().map(described).collect();
        let mut two_levels = 0;
        for chain in &chains {
            match chain.as_slice() {
                [one] => assert_eq!(*one, own(one.2), "{version}: {chains:?}"),
                two => {
                    assert_eq!(two, inlined, "{version}: {chains:?}");
                    two_levels += 1;
                }
            }
        }
        assert!(
            two_levels > 0,
            "{version}: the inlined call's range list: {chains:?}"
        );
        assert!(two_levels < chains.len(), "{version}: {chains:?}");
        let outer: Vec<u64> = ranges[1].clone().collect();
        for chain in resolve(&loaded, &outer).iter().map(described) {
            assert_eq!(
                chain,
                [(
                    "krabka_outer".to_owned(),
                    "krabka_a.c".to_owned(),
                    chain[0].2,
                    2
                )],
                "{version}"
            );
            assert!((2..=7).contains(&chain[0].2), "{version}: {chain:?}");
        }
    }
}

/// Code the linker discarded (`--gc-sections`) keeps its line rows, at address 0: no
/// address there is given its lines.
#[test]
fn the_lines_of_code_the_linker_discarded_name_no_address() {
    let (objects, index, _) = probe();
    let object = objects.get(index).unwrap();
    let scratch = Scratch::new("discarded");
    let (library, ranges) = c_build(
        &scratch.0,
        "libkrabka_gc.so",
        &[(
            "krabka_gc.c",
            "static __attribute__((used)) unsigned long krabka_dropped(unsigned long x) {\n\
             \x20   return x * 7 + 3;\n\
             }\n\
             unsigned long krabka_kept(unsigned long x) {\n\
             \x20   return x * 5 + 1;\n\
             }\n",
        )],
        &["-g", "-O1", "-ffunction-sections", "-Wl,--gc-sections"],
        &["krabka_kept"],
    );
    let loaded = as_if_library_loaded_from(object, &library);
    let mut at: Vec<u64> = (0..8).collect();
    at.extend(ranges[0].clone());
    let found = resolve(&loaded, &at);
    assert!(found[..8].iter().all(Vec::is_empty), "{:?}", &found[..8]);
    for levels in &found[8..] {
        let outermost = levels.last().expect("the kept function's lines");
        assert_eq!(outermost.name, "krabka_kept");
        assert!((4..=6).contains(&outermost.line), "{levels:?}");
    }
}

/// A unit's line program is read only until every address asked for has its row: an
/// address in the unit's first function reads the start of the program, one in its
/// last reads all of it (counted in the blocks of the file the sections hold, which
/// `release_all` empties between the two).
#[test]
fn a_line_program_is_read_only_as_far_as_the_addresses_asked_for() {
    let scratch = Scratch::new("line-program");
    let count = 3000;
    let text: String = (0..count)
        .map(|i| format!("unsigned long krabka_f{i}(unsigned long x) {{ return x * {i} + 1; }}\n"))
        .collect();
    let names: Vec<String> = [0, count - 1]
        .iter()
        .map(|i| format!("krabka_f{i}"))
        .collect();
    let (library, ranges) = c_build(
        &scratch.0,
        "libkrabka_rows.so",
        &[("krabka_rows.c", &text)],
        &["-g", "-O1"],
        &[&names[0], &names[1]],
    );
    let file = super::file::DebugFile::find(&library, &library, None, &[]).expect("DWARF");
    let sections = super::sections::Sections::load(&file).unwrap();
    let dwarf = sections.dwarf();
    let header = dwarf.units().next().unwrap().expect("one unit");
    let unit = dwarf.unit(header).unwrap();
    let unit = gimli::UnitRef::new(&dwarf, &unit);
    let whole = section_size(&library, ".debug_line");
    let mut read = Vec::new();
    for range in &ranges {
        sections.release_all();
        let rows = super::rows::line_rows(unit, &[range.start]).expect("a line program");
        let (path, line) = rows[0].clone().expect("a row at the function");
        assert!(path.ends_with("krabka_rows.c"), "{path}");
        read.push((line, sections.resident()));
    }
    eprintln!("{whole} bytes of line program; (line, bytes held after the lookup): {read:?}");
    assert_eq!(
        [read[0].0, read[1].0],
        [1, i64::from(count)],
        "each function on its own line"
    );
    assert!(
        whole > 8 * 4096,
        "a line program of {whole} bytes: too small to tell"
    );
    assert!(
        read[0].1 < whole / 2,
        "{} bytes held for the first function, of {whole}",
        read[0].1
    );
    assert!(
        read[1].1 >= whole,
        "{} bytes held for the last function, of {whole}",
        read[1].1
    );
}

/// Between two units a lookup keeps what it has read of the file (the abbreviations,
/// strings and line programs units share), up to a mebibyte; past it, it gives all of
/// it back. An address every 64 KiB of this test binary's code: units enough to pass
/// the mebibyte.
#[test]
fn a_lookup_keeps_at_most_a_mebibyte_of_the_file_between_units() {
    use object::{Object as _, ObjectSection as _};
    let (objects, index, _) = probe();
    let object = objects.get(index).unwrap();
    let bytes = std::fs::read(object.file.as_ref().unwrap()).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let text = elf.section_by_name(".text").expect(".text");
    let addresses: Vec<u64> = (text.address()..text.address() + text.size())
        .step_by(64 << 10)
        .collect();
    let mut kept = Vec::new();
    let found = resolve_observed(
        object,
        &addresses,
        &[Path::new(super::DEBUG_ROOT)],
        &mut |stage| {
            if let Stage::Kept(held) = stage {
                kept.push(held);
            }
        },
    );
    assert!(found.iter().filter(|levels| !levels.is_empty()).count() > 10);
    eprintln!("{} units; bytes kept after each: {kept:?}", kept.len());
    assert!(
        kept.iter().all(|held| *held <= super::HOLD),
        "more than {} bytes kept: {kept:?}",
        super::HOLD
    );
    assert!(
        kept.iter().any(|held| *held > 0),
        "nothing kept between units: {kept:?}"
    );
    assert!(
        kept.windows(2).any(|w| w[1] < w[0]),
        "the lookup never gave back what it kept: {kept:?}"
    );
}
