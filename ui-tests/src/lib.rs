//! Compile-fail and compile-pass cases for `#[pprof_routes]`; see `tests/ui.rs`.
