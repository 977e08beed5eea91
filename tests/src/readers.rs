//! The pprof readers the tests read profiles with, and `addr2line`, the judge of what an
//! address names.
//!
//! - [`Reader::Go`]: the machine's `go tool pprof`, the one users run (Go 1.26 here).
//! - [`Reader::OldGo`]: an older `go tool pprof` (Debian 12's Go 1.19), so that a change
//!   of pprof's text or defaults is seen the day it matters. Go 1.20 and older name the
//!   code of a binary whose executable segment does not start on a page wrongly (they
//!   take its address unaligned where the mapping is whole pages, as the kernel, Go's
//!   runtime and this crate write it); the tests name code with the other readers.
//! - [`Reader::Standalone`]: google/pprof's own CLI, which symbolizes with
//!   `llvm-symbolizer` where it finds one and with `addr2line` otherwise (`go tool pprof`
//!   uses Go's own DWARF reader, whatever is on the path).
//!
//! `scripts/install-test-deps` installs all three; `KRABKA_OLD_GO` and `KRABKA_PPROF`
//! point elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::temp_path;

/// A program that reads pprof profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// `go tool pprof` of the `go` on the path.
    Go,
    /// `go tool pprof` of an older Go (1.19).
    OldGo,
    /// google/pprof's CLI.
    Standalone,
}

/// Which symbolizer a reader may find on the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Symbolizers {
    /// The path as it is (`llvm-symbolizer` and `addr2line` on it).
    AsInstalled,
    /// A path with `addr2line`, `nm`, `objdump` and `c++filt` but no `llvm-symbolizer`.
    WithoutLlvm,
}

impl Reader {
    /// The readers of pprof's text that the tests compare: the machine's and an older one.
    pub const TEXT: [Reader; 2] = [Reader::Go, Reader::OldGo];
    /// Every reader.
    pub const ALL: [Reader; 3] = [Reader::Go, Reader::OldGo, Reader::Standalone];

    /// The paths worth running this reader with: google/pprof's with llvm-symbolizer and
    /// without; `go tool pprof` symbolizes with Go's own DWARF reader, whatever the path
    /// holds, so once.
    pub fn symbolizers(self) -> &'static [Symbolizers] {
        match self {
            Reader::Standalone => &[Symbolizers::AsInstalled, Symbolizers::WithoutLlvm],
            Reader::Go | Reader::OldGo => &[Symbolizers::AsInstalled],
        }
    }

    /// Whether this reader names the code of a binary whose executable segment does not
    /// start on a page as `addr2line` does (Go 1.20 and older do not; see the module).
    pub fn names_unaligned_code(self) -> bool {
        self != Reader::OldGo
    }

    fn program(self) -> (PathBuf, &'static [&'static str]) {
        match self {
            Reader::Go => (PathBuf::from("go"), &["tool", "pprof"]),
            Reader::OldGo => (
                std::env::var_os("KRABKA_OLD_GO")
                    .map_or_else(|| PathBuf::from("/usr/lib/go-1.19/bin/go"), PathBuf::from),
                &["tool", "pprof"],
            ),
            Reader::Standalone => (
                std::env::var_os("KRABKA_PPROF").map_or_else(
                    || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-tools/bin/pprof"),
                    PathBuf::from,
                ),
                &[],
            ),
        }
    }

    /// Runs this reader with `args` (a report such as `-top`) on a profile body.
    pub fn run(self, args: &[&str], body: &[u8]) -> String {
        self.run_with(Symbolizers::AsInstalled, args, body)
    }

    /// Runs this reader with only the given symbolizers on the path.
    pub fn run_with(self, symbolizers: Symbolizers, args: &[&str], body: &[u8]) -> String {
        let (program, leading) = self.program();
        let path = temp_path("profile.pb.gz");
        std::fs::write(&path, body).expect("write the profile");
        let mut command = Command::new(&program);
        command
            .args(leading)
            .args(args)
            .arg(&path)
            // pprof keeps its history and fetched profiles under $HOME; Go its build
            // cache (where `go tool pprof` is built on first use) under $HOME too
            // unless GOCACHE says otherwise.
            .env("HOME", std::env::temp_dir());
        if symbolizers == Symbolizers::WithoutLlvm {
            command.env("PATH", path_without_llvm());
        }
        let output = command.output().unwrap_or_else(|err| {
            panic!(
                "cannot run {self:?}'s pprof, {} ({err}): run scripts/install-test-deps, \
                 which installs Go, Debian's golang-1.19-go and google/pprof",
                program.display()
            )
        });
        let _ = std::fs::remove_file(&path);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{self:?}'s pprof failed: {}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }
}

/// A directory of links to the binutils pprof may use, and the path that holds it and
/// the directories of `go` and the older Go, but no `llvm-symbolizer`.
fn path_without_llvm() -> String {
    let dir = std::env::temp_dir().join(format!("krabka-pprof-no-llvm-{}", std::process::id()));
    if !dir.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        for tool in ["addr2line", "nm", "objdump", "c++filt"] {
            if let Some(found) = which(tool) {
                let _ = std::os::unix::fs::symlink(found, dir.join(tool));
            }
        }
    }
    let mut parts = vec![dir];
    parts.extend(which("go").and_then(|go| go.parent().map(Path::to_path_buf)));
    let path = std::env::join_paths(parts).unwrap();
    let path = path.into_string().unwrap();
    assert!(
        !std::env::split_paths(&path).any(|dir| dir.join("llvm-symbolizer").exists()),
        "{path} still holds llvm-symbolizer"
    );
    path
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The machine's `go tool pprof` with `args` on a profile body.
pub fn go_pprof(args: &[&str], body: &[u8]) -> String {
    Reader::Go.run(args, body)
}

/// What each reader of pprof's text ([`Reader::TEXT`]) prints for `args`.
pub fn go_pprof_each(args: &[&str], body: &[u8]) -> Vec<(Reader, String)> {
    Reader::TEXT
        .iter()
        .map(|reader| (*reader, reader.run(args, body)))
        .collect()
}

/// Every function `addr2line -f -i` names at each address of `binary` (link-time
/// addresses), innermost inlined first, demangled and reduced by [`short_name`].
pub fn addr2line_functions(binary: &Path, addresses: &[u64]) -> Vec<Vec<String>> {
    let output = Command::new("addr2line")
        .args(["-a", "-f", "-i", "-C", "-e"])
        .arg(binary)
        .args(addresses.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("run addr2line (binutils; scripts/install-test-deps installs it)");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    // "0x…" opens each address; then a function line and a file:line line per frame.
    let mut all: Vec<Vec<String>> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("0x") {
            all.push(Vec::new());
            continue;
        }
        let current = all.last_mut().expect("an address line first");
        current.push(short_name(line));
        lines.next(); // its file:line
    }
    assert_eq!(all.len(), addresses.len(), "{text}");
    all
}

/// A function's name as every reader can be compared by: its last path segment, without
/// generic arguments or a legacy hash, and closures and async blocks as `{}` (the
/// readers and manglings spell them `{closure#0}`, `{{closure}}`, `{async_fn#0}`).
pub fn short_name(name: &str) -> String {
    let name = name.trim();
    // Drop generic arguments and trailing `(...)`-like decorations at depth 0.
    let mut flat = String::new();
    let mut depth = 0usize;
    let mut previous = ' ';
    for c in name.chars() {
        match c {
            '<' => depth += 1,
            // `fn(A) -> B` inside generic arguments closes nothing.
            '>' if previous != '-' => depth = depth.saturating_sub(1),
            _ if depth == 0 => flat.push(c),
            _ => {}
        }
        previous = c;
    }
    let mut segments: Vec<&str> = flat.split("::").filter(|s| !s.is_empty()).collect();
    if segments.len() > 1
        && segments.last().is_some_and(|s| {
            s.len() == 17 && s.starts_with('h') && s[1..].chars().all(|c| c.is_ascii_hexdigit())
        })
    {
        segments.pop();
    }
    let last = segments.last().copied().unwrap_or("");
    if last.starts_with('{') {
        "{}".to_owned()
    } else {
        // A shim's decoration: `call_once{{vtable.shim}}` is `call_once` to DWARF. And
        // leading underscores, which legacy demanglers do not agree on the count of.
        last.split('{')
            .next()
            .unwrap_or(last)
            .trim_start_matches('_')
            .to_owned()
    }
}

/// Symbolizes a `symbolize=none` profile of `exe` (a PIE, run as process `pid`) with
/// every reader, google/pprof's with `llvm-symbolizer` on the path and without it (see
/// [`Reader::symbolizers`]), and requires the
/// function each names at each of the binary's locations to be one `addr2line -f -i`
/// names at that address: the mapping the profile carries gives every reader the right
/// load bias.
/// Go 1.20 and older take the executable segment's address unaligned (see the module):
/// they are required to name what `addr2line` names that far past each address, which
/// shows the profile is right and that reader wrong. Returns how many locations were
/// checked.
pub fn assert_every_reader_names_as_addr2line(
    body: &[u8],
    pid: u32,
    exe: &Path,
    what: &str,
) -> usize {
    let profile = crate::decode(body);
    let exe = &exe.canonicalize().unwrap();
    let exe_name = exe.to_str().unwrap();
    let mapping = profile
        .mapping
        .iter()
        .find(|m| crate::string(&profile, m.filename) == exe_name)
        .unwrap_or_else(|| panic!("{what}: no mapping of {exe_name}"));
    let mut addresses: Vec<u64> = profile
        .location
        .iter()
        .filter(|l| l.mapping_id == mapping.id)
        .map(|l| l.address)
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert!(!addresses.is_empty(), "{what}: no location in {exe_name}");
    let bias = load_bias(pid, exe);
    let old_shift = executable_segment(exe).1 % 4096;
    // Each reader reads the binary's DWARF whole, seconds each: all at once.
    let runs: Vec<(Reader, Symbolizers)> = Reader::ALL
        .iter()
        .flat_map(|&reader| reader.symbolizers().iter().map(move |&s| (reader, s)))
        .collect();
    let in_file = |shift: u64| {
        addresses
            .iter()
            .map(|a| a - bias + shift)
            .collect::<Vec<_>>()
    };
    let (in_file, old_in_file) = (in_file(0), in_file(old_shift));
    let (truth, old_truth, raws) = std::thread::scope(|scope| {
        let truth = scope.spawn(|| addr2line_functions(exe, &in_file));
        let old_truth = scope.spawn(|| addr2line_functions(exe, &old_in_file));
        let raws: Vec<_> = runs
            .iter()
            .map(|&(reader, symbolizers)| {
                scope.spawn(move || reader.run_with(symbolizers, &["-raw"], body))
            })
            .collect();
        (
            truth.join().unwrap(),
            old_truth.join().unwrap(),
            raws.into_iter()
                .map(|r| r.join().unwrap())
                .collect::<Vec<_>>(),
        )
    });
    for (&(reader, symbolizers), raw) in runs.iter().zip(&raws) {
        {
            let named = location_names(raw);
            // Per location that addr2line names and this reader names: whether each of
            // its names is one addr2line gives at the address, and at the address the
            // old readers look at.
            let mut judged = Vec::new();
            for ((address, chain), old_chain) in addresses.iter().zip(&truth).zip(&old_truth) {
                let Some(names) = named.get(address) else {
                    continue;
                };
                if chain.iter().all(|n| n == "??") || names.is_empty() {
                    continue;
                }
                // The outermost frame: the function whose code the address is in, which
                // every symbolizer agrees on (they differ on what is inlined there:
                // llvm-symbolizer and addr2line, over the same DWARF).
                let outermost = names.last().expect("a frame");
                let right = outermost.iter().any(|name| chain.contains(name));
                let as_old = outermost.iter().any(|name| old_chain.contains(name));
                judged.push((*address, names, chain, right, as_old));
            }
            let context = format!("{what}, {reader:?} ({symbolizers:?})");
            // Half the locations, by the readers users run. Go 1.20 and older, reading the
            // code past each address, give many a file and line but no function, and which
            // ones depends on the binary's layout (22 of 45 in one build of these tests,
            // most in the build before): from them, some named (each as `addr2line` names
            // the code they look at, below).
            let least = if reader.names_unaligned_code() {
                addresses.len().div_ceil(2)
            } else {
                1
            };
            assert!(
                judged.len() >= least,
                "{context}: only {} of {} locations named\n{raw}",
                judged.len(),
                addresses.len()
            );
            if reader.names_unaligned_code() {
                for (address, names, chain, right, _) in &judged {
                    assert!(
                        right,
                        "{context}: {address:#x} ({:#x} in the file) named {names:?}, where \
                         addr2line names {chain:?}\n{raw}",
                        address - bias
                    );
                }
            } else {
                // Go's DWARF reader and addr2line can differ on an arbitrary address (the
                // old reader's are arbitrary: that far past real ones); at real ones, on
                // none here. So: nine in ten as the rule says.
                let as_old = judged.iter().filter(|j| j.4).count();
                assert!(
                    as_old * 10 >= judged.len() * 9,
                    "{context}: of {} locations only {as_old} are named as addr2line names \
                     {old_shift:#x} bytes past them, the segment's offset in its page\n{raw}",
                    judged.len()
                );
            }
        }
    }
    addresses.len()
}

/// The names `pprof -raw` gives each location, by address, innermost frame first, each
/// frame's name and system name reduced by [`short_name`]. Its lines: `ID: 0xADDR M=n NAME FILE:LINE[:COL] s=N[(SYSTEM NAME)]`,
/// and for each further inlined frame the same from NAME on; names may hold spaces.
fn location_names(raw: &str) -> std::collections::HashMap<u64, Vec<Vec<String>>> {
    let mut named = std::collections::HashMap::new();
    let mut current: Option<u64> = None;
    let section = raw
        .split_once("\nLocations\n")
        .map_or("", |(_, rest)| rest)
        .split("\nMappings\n")
        .next()
        .unwrap_or("");
    for line in section.lines() {
        let mut rest = line.trim_start();
        if let Some((id, after)) = rest.split_once(": 0x")
            && id.chars().all(|c| c.is_ascii_digit())
        {
            let (address, after) = after.split_once(' ').unwrap_or((after, ""));
            current = u64::from_str_radix(address, 16).ok();
            rest = after.trim_start();
            if let Some(after) = rest.strip_prefix("M=") {
                rest = after.split_once(' ').map_or("", |(_, r)| r);
            }
            rest = rest.strip_prefix("[F] ").unwrap_or(rest);
        }
        let Some(address) = current else { continue };
        let Some((name_and_file, start_and_system)) = rest.rsplit_once(" s=") else {
            continue;
        };
        let Some((name, _file)) = name_and_file.rsplit_once(' ') else {
            continue;
        };
        // pprof's simplified name (which `fn() -> T` in generic arguments confuses) and
        // the system name it comes from, where they differ.
        let system = start_and_system
            .split_once('(')
            .and_then(|(_, system)| system.strip_suffix(')'));
        let mut candidates: Vec<String> = [Some(name), system]
            .into_iter()
            .flatten()
            .filter(|n| !n.is_empty() && *n != "??")
            .map(short_name)
            .collect();
        candidates.dedup();
        if !candidates.is_empty() {
            named
                .entry(address)
                .or_insert_with(Vec::new)
                .push(candidates);
        }
    }
    named
}

/// Where process `pid` loaded `exe`: by the ELF program headers and the kernel's line
/// for its code in `/proc/PID/maps`, the address of file offset `p_offset` is
/// `start - offset + p_offset`, which is `p_vaddr` plus the bias.
fn load_bias(pid: u32, exe: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let exe = exe.canonicalize().unwrap();
    let (start, offset) = maps
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (range, perms, offset, path) = (fields[0], fields[1], fields[2], fields.get(5)?);
            (Path::new(path) == exe && perms.contains('x')).then(|| {
                let start = range.split('-').next().unwrap();
                (
                    u64::from_str_radix(start, 16).unwrap(),
                    u64::from_str_radix(offset, 16).unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("no code of {} in /proc/{pid}/maps", exe.display()));
    let (p_offset, p_vaddr) = executable_segment(&exe);
    start - offset + p_offset - p_vaddr
}

/// The file offset and link-time address of the executable `PT_LOAD` segment, as
/// `readelf -lW` lists them.
fn executable_segment(exe: &Path) -> (u64, u64) {
    let output = Command::new("readelf")
        .arg("-lW")
        .arg(exe)
        .output()
        .expect("run readelf (binutils)");
    let listed = String::from_utf8_lossy(&output.stdout);
    listed
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let hex = |field: &str| u64::from_str_radix(field.trim_start_matches("0x"), 16).ok();
            (fields.first() == Some(&"LOAD") && fields.contains(&"E"))
                .then(|| Some((hex(fields[1])?, hex(fields[2])?)))?
        })
        .unwrap_or_else(|| panic!("no executable LOAD segment: {listed}"))
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn names_reduce_to_what_every_reader_shows() {
        for (name, short) in [
            (
                "krabka_pprof_tests::hot::lines_hot::hbd499b41bd387988",
                "lines_hot",
            ),
            ("krabka_pprof_tests::hot::lines_hot", "lines_hot"),
            ("lines_hot", "lines_hot"),
            ("<u64>::wrapping_add", "wrapping_add"),
            ("core::ops::function::FnOnce::call_once<F, ()>", "call_once"),
            ("std::thread::spawn::{{closure}}", "{}"),
            ("{closure#0}", "{}"),
            ("{async_fn#0}", "{}"),
            (
                "core::ops::function::FnOnce::call_once{{vtable.shim}}",
                "call_once",
            ),
        ] {
            assert_eq!(short_name(name), short, "{name}");
        }
    }
}
