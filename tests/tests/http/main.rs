//! HTTP tests of the profiling routes against real servers on 127.0.0.1, in a process that
//! allocates with the system allocator.

mod access;
mod control;
mod cpu;
mod errors;
mod fidelity;
mod host;
mod lines;
#[cfg(feature = "push")]
mod push;
mod recent;
mod responsiveness;
mod scrapers;
mod sessions;
mod shapes;
mod truth;
mod views;
mod wall;
mod windows;
