//! The `#[pprof_routes]` attribute of [krabka-pprof](https://docs.rs/krabka-pprof).
//!
//! Depend on `krabka-pprof`, not on this crate: it re-exports the attribute and holds the
//! runtime the expansion calls.

mod args;
mod duration;
mod expand;
mod rules;

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
/// All keys are optional; `#[pprof_routes]` alone means the defaults.
///
/// | key | type | default | rule |
/// |---|---|---|---|
/// | `cpu_default` | duration string | `"30s"` | 1 s ≤ value ≤ `cpu_max`; used when `?seconds` is missing |
/// | `cpu_max` | duration string | `"60s"` | 1 s ≤ value ≤ 1 h; longer requests are clamped to it |
/// | `frequency` | integer, Hz | `99` | 1 ≤ value ≤ 1000 |
/// | `blocklist` | array of strings | `[]` (unwind through every library) | non-empty library names |
/// | `heap` | bool | `false` | `true` needs krabka-pprof's `heap-profiling` feature |
/// | `heap_default` | duration string | `"10s"` | 1 s ≤ value ≤ `heap_max`; only with `heap = true` |
/// | `heap_max` | duration string | `"30s"` | 1 s ≤ value ≤ 1 h; only with `heap = true` |
/// | `prefix` | path string | `"/debug/pprof"` | starts with `/`, no trailing `/`, no `{`, `}`, `*` |
/// | `guard` | path to `fn(&Parts) -> bool` | none | admits a request when it returns `true`; else 403 |
/// | `token_env` | environment variable name | none | requests need `Authorization: Bearer <its value>` |
/// | `crate` | path string | `"::krabka_pprof"` | the path to krabka-pprof, for re-exports and renames |
///
/// Durations use humantime's grammar: `"500ms"`, `"90s"`, `"1m 30s"`, `"2h"`.
///
/// # What it accepts
///
/// A function with a body, free or a method, sync or `async`, with any visibility,
/// generics, parameters and other attributes, whose declared return type is axum's
/// `Router` or `Router<S>`. The signature stays as written; `return` in the body keeps
/// working; the profiling routes are merged into whatever router the body returns.
///
/// # Errors
///
/// Every mistake is a compile error pointing at the token to fix: an unknown key lists the
/// valid ones, a repeated key points at the second, and all value errors of one attribute
/// are reported together. The function itself is still emitted, so its own errors and IDE
/// help stay intact.
#[proc_macro_attribute]
pub fn pprof_routes(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
