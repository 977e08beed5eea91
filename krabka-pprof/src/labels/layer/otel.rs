//! The local root's OpenTelemetry ids (feature `opentelemetry`), read through
//! `tracing_opentelemetry::get_otel_context` at the first enter of a span of its trace.
//! Never earlier: at creation the OpenTelemetry span is still a builder, and reading its
//! context starts it, after which an HTTP server's `set_parent(remote)` fails and the
//! trace id is a fresh one that no trace backend has.
//!
//! The context is found by downcasting the dispatch to tracing-opentelemetry's own type:
//! an application that uses another version of tracing-opentelemetry than this crate's
//! (0.34) gets no OpenTelemetry ids, silently, and its samples carry our own `span_id`.

use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt as _;
use tracing::dispatcher::WeakDispatch;
use tracing::span;

use super::spans::Ids;

/// The span attribute Grafana's span profiles look a trace's profile up by.
const PROFILE_ID: &str = "pyroscope.profile.id";

/// The span id and trace id of `root`'s OpenTelemetry context, if it has a valid and
/// sampled one; with `mark`, the root also gets [`PROFILE_ID`] (the span id), which
/// links the trace to its samples. Must be called with no span's extensions locked.
pub(crate) fn ids(root: &span::Id, dispatch: &WeakDispatch, mark: bool) -> Option<Ids> {
    let dispatch = dispatch.upgrade()?;
    let cx = tracing_opentelemetry::get_otel_context(root, &dispatch)?;
    let span = cx.span();
    let context = span.span_context();
    if !context.is_valid() || !context.is_sampled() {
        return None;
    }
    // `Display` is the zero-padded lowercase hex of the W3C format (16 and 32 digits);
    // `LowerHex` does not pad.
    let span_id = context.span_id().to_string();
    let trace_id = context.trace_id().to_string();
    if mark {
        span.set_attribute(KeyValue::new(PROFILE_ID, span_id.clone()));
    }
    Some(Ids {
        span_id,
        trace_id: Some(trace_id),
    })
}
