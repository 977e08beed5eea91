//! `/tasks`: tokio's task dump. Placeholder until the dump itself lands.

use axum::http::request::Parts;
use axum::response::Response;

use super::response::unavailable;

pub(super) async fn respond(_parts: &Parts) -> Response {
    unavailable(
        "task dumps need the app built with RUSTFLAGS=\"--cfg tokio_unstable\" and \
         krabka-pprof's `task-dump` feature",
    )
}
