//! The `#[pprof_routes]` attribute of [krabka-pprof](https://docs.rs/krabka-pprof).
//!
//! Depend on `krabka-pprof`, not on this crate: it re-exports the attribute and holds the
//! runtime the expansion calls. `docs/keys.md` is the only copy of the keys table, which
//! krabka-pprof's docs show through the re-export: it lives here because a published crate
//! can include only its own files.

// Imports point one way, no circle: expand -> args; args -> values, keys, rules;
// values -> keys, rules, duration, size; rules -> duration, size. `rules.rs` knows no spans, so it
// reads like its runtime twin in krabka-pprof's config.rs.
mod args;
mod duration;
mod expand;
mod keys;
mod placement;
mod rules;
mod size;
mod values;

#[cfg(test)]
mod properties;

use proc_macro::TokenStream;

/// Adds Go-compatible pprof endpoints to the `axum::Router` a function builds.
///
/// ```ignore
/// use axum::{Router, routing::get};
///
/// #[krabka_pprof::pprof_routes(cpu_max = "60s")]
/// fn app() -> Router {
///     Router::new().route("/", get(|| async { "hello" }))
/// }
/// // app() now also answers GET /debug/pprof/profile?seconds=N
/// ```
///
/// `go tool pprof http://127.0.0.1:PORT/debug/pprof/profile?seconds=5` then reads a CPU
/// profile of the running service.
///
/// # Keys
///
#[doc = include_str!("../docs/keys.md")]
///
/// # What it accepts
///
/// A function with a body, free or a method, sync or `async`, with any visibility,
/// generics, parameters and other attributes, whose declared return type is axum's
/// `Router` or `Router<S>`. The signature stays as written; `return` in the body keeps
/// working; the profiling routes are merged into whatever router the body returns.
#[proc_macro_attribute]
pub fn pprof_routes(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
