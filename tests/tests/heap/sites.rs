//! The child of the allocation tests (`test_child serve-sites` and its kin), as built or
//! stripped of its debug info, and what the tests read from its profiles: each site's
//! totals, where stacks start, stacks by address as Alloy's delta matches them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use krabka_pprof_tests::{
    ChildServer, Profile, client, column, decode, stacks, stacks_by_address, temp_path,
};
use reqwest::StatusCode;

pub(crate) const CHILD: &str = env!("CARGO_BIN_EXE_test_child");
pub(crate) const MIB: f64 = 1024.0 * 1024.0;
pub(crate) const CHURN: &str = "churn_64_kib";
pub(crate) const RETAIN: &str = "retain_64_mib";

/// How the child binary is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Build {
    /// As cargo built it: line tables and inlined frames.
    Lines,
    /// A copy without debug info (`objcopy --strip-debug`): symbol tables only.
    NoLines,
}

/// A child serving `mode`, and the copy of the binary it runs, removed on drop.
pub(crate) struct Child {
    pub(crate) server: ChildServer,
    copy: Option<PathBuf>,
}

impl Child {
    pub(crate) fn start(build: Build, mode: &str, env: &[(&str, Option<&str>)]) -> Child {
        let copy = (build == Build::NoLines).then(|| {
            let copy = temp_path("test_child-no-lines");
            let status = std::process::Command::new("objcopy")
                .arg("--strip-debug")
                .arg(CHILD)
                .arg(&copy)
                .status()
                .expect("objcopy (binutils) runs: scripts/install-test-deps installs it");
            assert!(status.success(), "objcopy --strip-debug");
            copy
        });
        let exe = copy.as_ref().map_or(CHILD, |c| c.to_str().unwrap());
        Child {
            server: ChildServer::start(exe, mode, env),
            copy,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Bytes the churning site has allocated so far, by its own count.
    pub(crate) async fn churned(&self) -> u64 {
        let text = client()
            .get(self.url("/churned"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.parse().expect("a number of bytes")
    }

    /// Waits (at most a minute) until the churning site has allocated `bytes` since `from`.
    pub(crate) async fn churn_past(&self, from: u64, bytes: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.churned().await;
            if now >= from + bytes {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "the churning site stalled at {now}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn get(&self, path: &str) -> reqwest::Response {
        client().get(self.url(path)).send().await.unwrap()
    }

    /// `GET path`, a 200, decoded; and the body.
    pub(crate) async fn profile(&self, path: &str) -> (Profile, Vec<u8>) {
        let response = self.get(path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let body = response.bytes().await.unwrap().to_vec();
        (decode(&body), body)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(copy) = &self.copy {
            let _ = std::fs::remove_file(copy);
        }
    }
}

/// Go's four heap types, in Go's order.
pub(crate) fn go_types() -> Vec<(String, String)> {
    [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    .map(|(t, u)| (t.to_owned(), u.to_owned()))
    .to_vec()
}

/// The allocator's own functions and Rust's allocation shims, which no heap stack may
/// start with (what the stacks started with before they were trimmed).
pub(crate) fn is_allocator(name: &str) -> bool {
    [
        "prof_",
        "_rjem_",
        "je_",
        "imalloc",
        "malloc",
        "__rust_",
        "__rg_",
        "__rdl_",
        "__rustc::",
        "alloc::alloc::",
        "<alloc::alloc::Global",
        "alloc::raw_vec::",
        "tikv_jemallocator::",
        "<tikv_jemallocator::",
        "krabka_pprof::heap::jemalloc::",
        "<krabka_pprof::heap::jemalloc::",
        // test_child's own global allocator, which chooses between two of jemalloc's.
        "<test_child::allocator::Chosen as ",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// One site's totals: `(alloc_space, inuse_space)` over the stacks through `name`; and
/// every one of those stacks starts at `name` itself.
pub(crate) fn site(profile: &Profile, name: &str) -> (f64, f64) {
    let (alloc, inuse) = (
        column(profile, "alloc_space"),
        column(profile, "inuse_space"),
    );
    let mut totals = (0.0, 0.0);
    for (frames, values) in stacks(profile) {
        if !frames.iter().any(|f| f.contains(name)) {
            continue;
        }
        assert!(
            frames[0].ends_with(name),
            "a stack through {name} starts at {}: {frames:?}",
            frames[0]
        );
        totals.0 += values[alloc] as f64;
        totals.1 += values[inuse] as f64;
    }
    totals
}

/// Every stack's first frame is a function of the program or its libraries, never the
/// allocator.
pub(crate) fn assert_stacks_start_at_the_allocation_site(profile: &Profile, build: Build) {
    for (frames, _) in stacks(profile) {
        let first = frames.first().map_or("", String::as_str);
        assert!(
            !is_allocator(first),
            "{build:?}: a stack starts in the allocator: {frames:?}"
        );
    }
}

pub(crate) fn within(found: f64, truth: f64, tolerance: f64) -> bool {
    (found - truth).abs() <= truth * tolerance
}

/// The stacks of a profile by their addresses (as Alloy's delta matches them), their
/// samples summed, with `(alloc_objects, alloc_space)`.
pub(crate) fn alloc_by_address(profile: &Profile) -> HashMap<Vec<u64>, (i64, i64)> {
    let (objects, space) = (
        column(profile, "alloc_objects"),
        column(profile, "alloc_space"),
    );
    let mut by = HashMap::new();
    for (addresses, values) in stacks_by_address(profile) {
        let entry: &mut (i64, i64) = by.entry(addresses).or_default();
        entry.0 += values[objects];
        entry.1 += values[space];
    }
    by
}
