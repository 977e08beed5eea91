//! `/tasks` over HTTP, in both of its builds. With tokio's task dump (RUSTFLAGS="--cfg
//! tokio_unstable" and the `task-dump` feature, as `scripts/test` builds this binary a
//! second time) the tasks an app parks show up where they wait, grouped; without, the
//! route answers 503 naming both switches.

#[cfg(all(feature = "task-dump", tokio_unstable))]
mod dumps;
#[cfg(tokio_unstable)]
mod hooks;
#[cfg(not(all(feature = "task-dump", tokio_unstable)))]
mod unavailable;
