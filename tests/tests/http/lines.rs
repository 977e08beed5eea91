//! Source lines and inlined frames: a CPU profile of a hot loop in this test binary (built
//! with the dev profile's line tables) names its file and lines, shows the step inlined
//! into it as a frame of its own, and `go tool pprof -list` and `-lines` read them;
//! `?symbolize=none` answers addresses and mappings only, which `go tool pprof` still
//! reads; `?lines=true` lists lines in the text view; a library whose debug file is
//! looked for where a FIFO sits first still gets its lines, without the profile waiting on
//! the FIFO. Only krabka-pprof's own sampler keeps addresses: of these tests, only
//! `go_tool_pprof_lists_the_source_and_reads_lines` runs against the `pprof` crate's
//! (`scripts/test`), without its inlined frames and exact lines.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::hot::{LINES_HOT, lines_round};
use krabka_pprof_tests::{
    Burner, Profile, Reader, TestServer, assert_every_reader_names_as_addr2line, client, decode,
    pprof_rs_sampler, serial, string,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "10s", threads = true)]
fn app() -> Router {
    Router::new()
}

/// A profile of `seconds` while one thread runs [`lines_round`], with `query` added.
async fn profile_of_the_hot_loop(server: &TestServer, seconds: u32, query: &str) -> Vec<u8> {
    let burner = Burner::start_with(1, Duration::from_secs(20), lines_round);
    let response = client()
        .get(server.url(&format!("/debug/pprof/profile?seconds={seconds}{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.bytes().await.unwrap().to_vec();
    drop(burner.finish());
    body
}

/// One line of a location: the function's name, its file and start line, and the line.
#[derive(Clone, Debug, PartialEq)]
struct LineOf {
    name: String,
    filename: String,
    start_line: i64,
    line: i64,
}

/// Each location's lines, innermost first.
fn locations(profile: &Profile) -> Vec<Vec<LineOf>> {
    profile
        .location
        .iter()
        .map(|location| {
            location
                .line
                .iter()
                .map(|line| {
                    let function = profile
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .expect("a line's function");
                    LineOf {
                        name: string(profile, function.name).to_owned(),
                        filename: string(profile, function.filename).to_owned(),
                        start_line: function.start_line,
                        line: line.line,
                    }
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn the_hot_function_has_its_file_its_lines_and_the_step_inlined_into_it() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let profile = decode(&profile_of_the_hot_loop(&server, 2, "").await);
    let locations = locations(&profile);
    let in_hot: Vec<&Vec<LineOf>> = locations
        .iter()
        .filter(|lines| {
            lines
                .last()
                .is_some_and(|outer| outer.name.ends_with("hot::lines_hot"))
        })
        .collect();
    assert!(
        !in_hot.is_empty(),
        "no location in lines_hot: {locations:#?}"
    );

    let body = LINES_HOT + 2..=LINES_HOT + 8;
    for lines in &in_hot {
        let hot = lines.last().unwrap();
        assert!(
            hot.filename.starts_with('/') && hot.filename.ends_with("tests/src/hot.rs"),
            "{hot:?}"
        );
        assert_eq!(hot.start_line, LINES_HOT + 2, "{hot:?}");
        // Line 0 is code the compiler made up (DWARF's "no line").
        assert!(hot.line == 0 || body.contains(&hot.line), "{lines:?}");
    }
    assert!(
        in_hot.iter().any(|lines| lines.last().unwrap().line > 0),
        "{in_hot:?}"
    );

    // `lines_step` is `#[inline(always)]`: a line of its own, inside lines_hot, whose
    // own line is the call's.
    let stepped: Vec<&&Vec<LineOf>> = in_hot
        .iter()
        .filter(|lines| lines.iter().any(|l| l.name.ends_with("hot::lines_step")))
        .collect();
    assert!(
        !stepped.is_empty(),
        "the inlined step is not a frame of its own: {in_hot:#?}"
    );
    for lines in stepped {
        let at = lines
            .iter()
            .position(|l| l.name.ends_with("hot::lines_step"))
            .unwrap();
        assert_eq!(
            at + 2,
            lines.len(),
            "inlined into lines_hot itself: {lines:?}"
        );
        let step = &lines[at];
        assert!(step.filename.ends_with("tests/src/hot.rs"), "{step:?}");
        assert_eq!(step.start_line, LINES_HOT + 13, "{step:?}");
        assert!(
            step.line == 0 || (LINES_HOT + 14..=LINES_HOT + 17).contains(&step.line),
            "{lines:?}"
        );
        assert_eq!(
            lines[at + 1].line,
            LINES_HOT + 5,
            "the call's line: {lines:?}"
        );
    }

    let mapping = profile
        .mapping
        .iter()
        .find(|m| {
            string(&profile, m.filename) == std::env::current_exe().unwrap().to_str().unwrap()
        })
        .expect("this binary's mapping");
    assert!(mapping.has_functions && mapping.has_filenames);
    assert!(mapping.has_line_numbers && mapping.has_inline_frames);
}

#[tokio::test]
async fn go_tool_pprof_lists_the_source_and_reads_lines() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let body = profile_of_the_hot_loop(&server, 2, "").await;

    // Each reader of pprof's text: the machine's `go tool pprof` and an older one.
    for reader in Reader::TEXT {
        lists_the_source_and_reads_lines(reader, &body);
    }
}

/// What `-list` and `-lines` of one reader show of [`profile_of_the_hot_loop`].
fn lists_the_source_and_reads_lines(reader: Reader, body: &[u8]) {
    // `-list` reads the source file the profile names and prints its lines with their
    // samples.
    let listed = reader.run(&["-list", "lines_hot"], body);
    assert!(
        listed.contains("ROUTINE ======================== "),
        "{reader:?}: {listed}"
    );
    assert!(listed.contains("tests/src/hot.rs"), "{reader:?}: {listed}");
    assert!(
        listed.contains("x = lines_step(x, i);"),
        "{reader:?}: {listed}"
    );
    assert!(
        listed.contains("pub fn lines_hot(rounds: u64) -> u64 {"),
        "{reader:?}: {listed}"
    );

    // `-lines`: one row per line, `function file:line`.
    let top = reader.run(&["-top", "-lines", "-nodecount=1000"], body);
    if pprof_rs_sampler() {
        // The `pprof` crate's frames and lines are the `backtrace` crate's, and in a
        // process that has symbolized with it before (any earlier profile test) they
        // drift: the inlined step's frames go missing and the loop's samples land on
        // `lines_hot`'s call line or its `for` line, from one run to the next (CI, and
        // `scripts/test`'s selection run here; this test alone gets them right). What
        // is required there: rows of `lines_hot` at lines of its own body.
        let own = LINES_HOT + 2..=LINES_HOT + 8;
        assert!(
            top.lines().any(|row| row.contains("lines_hot")
                && row
                    .rsplit_once("hot.rs:")
                    .and_then(|(_, line)| line.split_whitespace().next()?.parse().ok())
                    .is_some_and(|line: i64| own.contains(&line))),
            "no row for lines_hot at a line of its body ({own:?}), {reader:?}: {top}"
        );
        return;
    }
    // The step inlined into the loop is a row of its own, and the loop's call of it one
    // at the call's line.
    assert!(
        top.lines()
            .any(|row| row.contains("lines_step") && row.contains("hot.rs:")),
        "{reader:?}: {top}"
    );
    let hot_call = format!("hot.rs:{}", LINES_HOT + 5);
    assert!(
        top.lines()
            .any(|row| row.contains("lines_hot") && row.contains(&hot_call)),
        "no row for lines_hot at the call ({hot_call}), {reader:?}: {top}"
    );
}

#[tokio::test]
async fn the_text_view_lists_lines_with_lines_true() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start_with(1, Duration::from_secs(20), lines_round);
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=1&format=text&lines=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    drop(burner.finish());
    // Rows end in `function file:line`; the heaviest are the loop's own lines and the
    // step's (the call's line, which only adds to cum, may fall below the 30 shown).
    let line_of = |row: &str, function: &str| -> Option<i64> {
        let (_, at) = row.split_once(&format!("{function} "))?;
        let (file, line) = at.rsplit_once(':')?;
        file.ends_with("tests/src/hot.rs")
            .then(|| line.parse().ok())?
    };
    let hot: Vec<i64> = text
        .lines()
        .filter_map(|r| line_of(r, "hot::lines_hot"))
        .collect();
    assert!(!hot.is_empty(), "{text}");
    assert!(
        hot.iter()
            .all(|l| (LINES_HOT + 2..=LINES_HOT + 8).contains(l)),
        "{hot:?}: {text}"
    );
    let step: Vec<i64> = text
        .lines()
        .filter_map(|r| line_of(r, "hot::lines_step"))
        .collect();
    assert!(!step.is_empty(), "{text}");
    assert!(
        step.iter()
            .all(|l| (LINES_HOT + 14..=LINES_HOT + 17).contains(l)),
        "{step:?}: {text}"
    );
}

#[tokio::test]
async fn symbolize_none_gives_addresses_and_mappings_that_go_tool_pprof_reads() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let body = profile_of_the_hot_loop(&server, 1, "&symbolize=none").await;
    let profile = decode(&body);
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mapping = profile
        .mapping
        .iter()
        .find(|m| string(&profile, m.filename) == exe)
        .expect("this binary's mapping");
    assert!(!mapping.has_functions, "{mapping:?}");
    assert!(!mapping.has_line_numbers);
    assert!(mapping.build_id != 0, "the build ID, to find the binary by");
    assert!(mapping.memory_start < mapping.memory_limit);
    assert_addresses_only(&profile, "the CPU profile");

    // Every reader reads it as it is, by address.
    for reader in Reader::ALL {
        let raw = reader.run(&["-raw", "-symbolize=none"], &body);
        assert!(raw.contains(exe), "{reader:?}: the mapping's file: {raw}");
        assert!(raw.contains("Locations"), "{reader:?}: {raw}");
        let top = reader.run(&["-top", "-symbolize=none", "-nodecount=5"], &body);
        assert!(top.contains("flat%"), "{reader:?}: {top}");
    }
    // And with the binary at hand (the mapping's file, matched by build ID) they name the
    // code itself, offline, from the exact mapping: the machine's `go tool pprof` and
    // google/pprof's, with llvm-symbolizer and without. (Go 1.20 and older misname a
    // binary whose code does not start on a page, as this one's does not: see
    // `every_reader_names_each_address_as_addr2line_does`.)
    for reader in [Reader::Go, Reader::Standalone] {
        for &symbolizers in reader.symbolizers() {
            let symbolized = reader.run_with(symbolizers, &["-top", "-nodecount=1000"], &body);
            assert!(
                symbolized.contains("lines_hot"),
                "{reader:?} ({symbolizers:?}): {symbolized}"
            );
        }
    }
}

/// A `symbolize=none` CPU profile of this test binary (a PIE whose code does not start
/// on a page), symbolized offline by every reader with either symbolizer, names at each
/// of its locations a function `addr2line -f -i` names there.
#[tokio::test]
async fn every_reader_names_each_address_as_addr2line_does() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let body = profile_of_the_hot_loop(&server, 1, "&symbolize=none").await;
    let exe = std::env::current_exe().unwrap();
    let checked =
        assert_every_reader_names_as_addr2line(&body, std::process::id(), &exe, "the CPU profile");
    assert!(checked >= 5, "{checked} locations");
}

/// What a `symbolize=none` answer holds: addresses in mappings, which `go tool pprof`
/// symbolizes (some, so that the rest cannot pass vacuously), each with no line; and no
/// function named after code, only the profiler's own markers (`[…]`: a stack that could
/// not be read or was cut short, which have no mapping).
fn assert_addresses_only(profile: &Profile, what: &str) {
    let mapped: Vec<_> = profile
        .location
        .iter()
        .filter(|l| l.mapping_id != 0)
        .collect();
    assert!(
        !mapped.is_empty(),
        "{what}: none of {} locations lies in a mapping: without names it must still say \
         where each address lies",
        profile.location.len()
    );
    for location in &mapped {
        assert!(
            location.address != 0 && location.line.is_empty(),
            "{what}: {location:?}"
        );
    }
    let names: Vec<&str> = profile
        .function
        .iter()
        .map(|f| string(profile, f.name))
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with('[')),
        "{what} names functions: {names:?}"
    );
}

#[tokio::test]
async fn the_thread_dump_and_bad_values_follow_the_same_rules() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let response = client()
        .get(server.url("/debug/pprof/threads?symbolize=none"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    assert_addresses_only(&profile, "the thread dump");
    assert!(!profile.mapping.is_empty());
    assert!(profile.mapping.iter().all(|m| !m.has_functions));

    for (query, says) in [
        (
            "/debug/pprof/profile?symbolize=local",
            "`symbolize` must be full",
        ),
        (
            "/debug/pprof/profile?symbolize=none&format=text",
            "only the pprof format",
        ),
        ("/debug/pprof/profile?lines=true", "format=text"),
        (
            "/debug/pprof/profile?lines=maybe&format=text",
            "`lines` must be true or false",
        ),
        (
            "/debug/pprof/threads?debug=1&symbolize=none",
            "takes neither",
        ),
        ("/debug/pprof/threads?lines=true", "format=text"),
    ] {
        let response = client().get(server.url(query)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
        let text = response.text().await.unwrap();
        assert!(text.contains(says), "{query}: {text}");
    }
    // The profiler is still usable: a valid request right after works.
    let response = client()
        .get(server.url("/debug/pprof/threads?format=text&lines=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    // Rows end in `file:line`: this binary's own lines with glibc; with musl, where the
    // dump's stacks end in libc (no unwind tables there), libc's own.
    let with_a_line = |row: &str| {
        row.rsplit_once(':').is_some_and(|(file, line)| {
            file.contains('/') && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit())
        })
    };
    assert!(
        text.lines().any(with_a_line),
        "no row of the thread dump by line names a file and line: {text}"
    );
}

/// The C function of [`a_library_whose_debug_file_is_looked_for_at_a_fifo_first_has_its_lines`],
/// loaded with `dlopen`.
static C_SPIN: OnceLock<extern "C" fn(u64) -> u64> = OnceLock::new();

/// One round of the C library's loop.
fn c_round() {
    let spin = C_SPIN.get().expect("the C library is loaded");
    std::hint::black_box(spin(std::hint::black_box(20_000)));
}

fn run(command: &mut Command) {
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(status.success(), "{command:?}");
}

/// Builds, in `dir`, a C library with line tables (`cc -g`), stripped and linked to its
/// debug file as Debian's `dh_strip` leaves them: the debug file in `.debug/` beside the
/// library, and, where its debug link is looked for first (beside the library), a FIFO
/// nobody writes to. The library's path.
fn library_beside_a_fifo(dir: &Path) -> PathBuf {
    let source = dir.join("krabka_c_spin.c");
    std::fs::write(
        &source,
        "unsigned long krabka_c_spin(unsigned long rounds) {\n\
         \x20   unsigned long x = 0x2545f4914f6cdd1d;\n\
         \x20   for (unsigned long i = 0; i < rounds; i++)\n\
         \x20       x = (x ^ (x >> 12)) * 0x9e3779b97f4a7c15 + i;\n\
         \x20   return x;\n\
         }\n",
    )
    .unwrap();
    let built = dir.join("built.so");
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-g", "-O1", "-o"])
        .arg(&built)
        .arg(&source));
    let debug = dir.join("libkrabka_c.so.debug");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&built)
        .arg(&debug));
    let library = dir.join("libkrabka_c.so");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&built)
        .arg(&library));
    std::fs::create_dir_all(dir.join(".debug")).unwrap();
    std::fs::rename(&debug, dir.join(".debug").join("libkrabka_c.so.debug")).unwrap();
    run(Command::new("mkfifo").arg(&debug));
    library
}

#[tokio::test]
#[cfg_attr(
    target_env = "musl",
    ignore = "a static musl binary cannot dlopen: no library is loaded"
)]
async fn a_library_whose_debug_file_is_looked_for_at_a_fifo_first_has_its_lines() {
    let _serial = serial().await;
    let dir = std::env::temp_dir().join(format!("krabka-pprof-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let library = library_beside_a_fifo(&dir);
    let path = std::ffi::CString::new(library.to_str().unwrap()).unwrap();
    // SAFETY: the library was just built from the C above, and stays loaded for the rest
    // of the process; `krabka_c_spin` has the signature it is called with.
    let spin = unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!handle.is_null(), "dlopen {}", library.display());
        let spin = libc::dlsym(handle, c"krabka_c_spin".as_ptr());
        assert!(!spin.is_null());
        std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64) -> u64>(spin)
    };
    C_SPIN.get_or_init(|| spin);

    let server = TestServer::start(app);
    let burner = Burner::start_with(1, Duration::from_secs(20), c_round);
    let request = client()
        .get(server.url("/debug/pprof/profile?seconds=2"))
        .send();
    // A symbolizer that opened the FIFO would wait in open(2) for a writer for ever, and
    // the profile with it: judged by this test's clock, then the FIFO is opened for
    // writing to let that thread go.
    let response = match tokio::time::timeout(Duration::from_secs(60), request).await {
        Ok(response) => response.unwrap(),
        Err(_) => {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("libkrabka_c.so.debug"));
            panic!("no profile 60 s after it was asked for: its symbols waited on the FIFO");
        }
    };
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    drop(burner.finish());
    let _ = std::fs::remove_dir_all(&dir);

    let locations = locations(&profile);
    let in_c: Vec<&LineOf> = locations
        .iter()
        .filter_map(|lines| lines.last())
        .filter(|outer| outer.name == "krabka_c_spin")
        .collect();
    assert!(
        !in_c.is_empty(),
        "no location in the C library: {locations:#?}"
    );
    for spin in &in_c {
        assert!(
            spin.filename.starts_with('/') && spin.filename.ends_with("/krabka_c_spin.c"),
            "lines from the debug file in .debug/: {spin:?}"
        );
        assert!((1..=5).contains(&spin.line), "{spin:?}");
        assert_eq!(spin.start_line, 1, "{spin:?}");
    }
}
