//! Helpers for krabka-pprof's HTTP tests: real servers on `127.0.0.1:0` and loopback
//! clients (`servers.rs`), profile decoding with `pprof::protos` (`profiles.rs`), the
//! pprof readers and `addr2line` (`readers.rs`), CPU burners that keep their own clocks
//! (`burners.rs`), the functions whose names the tests look for (`hot.rs`), threads
//! parked in known places for thread dumps (`parked.rs`), threads behind code without
//! unwind tables (`untabled.rs`), arbitrary query strings and what the contract says of
//! each (`queries.rs`), the kernel's tick and the cores, measured (`machine.rs`). Here:
//! what every test binary shares, the one-profile-at-a-time lock and the choice of
//! sampler.

pub use pprof::protos::{Message as _, Profile};

mod burners;
pub mod hot;
mod machine;
pub mod parked;
mod profiles;
pub mod queries;
mod readers;
mod servers;
#[cfg(target_arch = "x86_64")]
pub mod untabled;

pub use burners::*;
pub use machine::*;
pub use profiles::*;
pub use readers::*;
pub use servers::*;

/// The guard of the tests' guarded apps: admits requests that say they come from inside
/// (`X-Internal: yes`).
pub fn internal_only(parts: &axum::http::request::Parts) -> bool {
    parts.headers.get("x-internal").is_some_and(|v| v == "yes")
}

/// The CPU profiler is one per process: tests that take profiles hold this so the tests
/// of one binary do not answer each other's requests with 409. Tests that burn CPU, here
/// or in a child process, hold it too, so that no two tests' burners share the cores.
/// A tokio mutex: it is held across awaits, and a failed test must not poison it.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// [`serial`], for a test that is not async (it must not be called on a runtime).
pub fn serial_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.blocking_lock()
}

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The environment variable that makes the servers of this process take CPU profiles with
/// the `pprof` crate's sampler instead of krabka-pprof's own: `KRABKA_TEST_SAMPLER=pprof-rs`.
/// `scripts/test` runs the CPU HTTP tests again with it, so both backends pass them.
pub const SAMPLER_VAR: &str = "KRABKA_TEST_SAMPLER";

/// Whether this process's CPU profiles come from the `pprof` crate's sampler.
pub fn pprof_rs_sampler() -> bool {
    match std::env::var(SAMPLER_VAR).as_deref() {
        Ok("pprof-rs") => true,
        Ok("" | "krabka") | Err(_) => false,
        Ok(other) => panic!("{SAMPLER_VAR}={other}: write pprof-rs or krabka"),
    }
}

/// Whether the test calling it checks what only krabka-pprof's own sampler promises while
/// this process runs against the `pprof` crate's: then it prints why it does not run
/// (with [`skip`]), and the test returns.
pub fn krabka_sampler_only(test: &str, why: &str) -> bool {
    if pprof_rs_sampler() {
        skip(
            test,
            &format!("against the pprof crate's sampler, which {why}"),
        );
        return true;
    }
    false
}

/// Applies [`SAMPLER_VAR`] to this process, before its first profile.
pub fn choose_sampler() {
    if pprof_rs_sampler() {
        krabka_pprof::__private::use_pprof_rs_sampler();
    }
}
