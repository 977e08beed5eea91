//! The DWARF reader's tests, over this test binary's own DWARF and copies of it split
//! as packagers split them.
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{resolve, resolve_with_roots};
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
