//! The figures of the Performance table in bench/README.md. Each file is named for what it
//! measures, starts its own services through the harness and returns its rows of the
//! table, each row keeping its id (the `--only` names):
//!
//! - `cpu_profile_cost.rs`: M1 (resident memory around a profile) and M4 (window end to
//!   last byte), which come from the same rounds;
//! - `throughput_while_profiling.rs`: M2;
//! - `throughput_idle_attribute.rs`: M3;
//! - `current_thread_latency.rs`: M5;
//! - `build_time.rs`: M6, the attribute's build and expansion time;
//! - `views.rs`: V, each view of a CPU profile;
//! - `heap.rs`: H, heap dumps and jemalloc's sampling cost;
//! - `handler_cost.rs`: S, the signal handler's cost per sample, by its own clock and
//!   from outside;
//! - `hang_up.rs`: F, how soon a hung-up profile frees the profiler;
//! - `thread_dump.rs`: T;
//! - `wall.rs`: W, wall-clock profiles: what the sweep costs, signals to sleepers, the
//!   answer's delay and memory;
//! - `lines.rs`: L, a CPU profile read with line tables;
//! - `labels_cost.rs`: labels, what setting labels and sampling them cost;
//! - `soak.rs`: K, the soak;
//! - `long_session.rs`: LS, one session held ten minutes on a churning service;
//! - `push.rs`: P, what the pusher costs and how soon windows arrive;
//! - `recorder.rs`: R, what the recorder (`recent`) costs, and RM, its memory over ten
//!   minutes and `/recent?seconds=600`.

pub mod build_time;
pub mod cpu_profile_cost;
pub mod current_thread_latency;
pub mod handler_cost;
pub mod hang_up;
pub mod heap;
pub mod labels_cost;
pub mod lines;
pub mod long_session;
pub mod push;
pub mod recorder;
pub mod soak;
pub mod thread_dump;
pub mod throughput_idle_attribute;
pub mod throughput_while_profiling;
pub mod views;
pub mod wall;

pub const MB: f64 = 1024.0 * 1024.0;

pub use crate::verdict::{Row, Verdict, ratio_row};
