//! HTTP tests of the CPU profiling routes against a real server on 127.0.0.1.

mod cpu;
mod errors;
mod fidelity;
mod responsiveness;
mod shapes;
