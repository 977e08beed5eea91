//! [`layer()`]: a `tracing_subscriber::Layer` that labels the CPU samples taken while a
//! span is entered with its local root's `span_name` and `span_id` (what Grafana
//! Pyroscope's span profiles link a trace by), OpenTelemetry's `trace_id` where it has
//! one, and the span fields the user names.
//!
//! The work is where a layer does it: at a span's creation its labels go in its
//! extensions (`spans.rs`: the root, inherited from the parent, and the field values);
//! at its first enter the set is interned (and the root's OpenTelemetry ids read,
//! `otel.rs`); each later enter finds the handle in the layer's cache by span id
//! (`slots.rs`; the registry only on a miss) and swaps the span half of the thread's
//! label word, and each exit puts it back from a per-thread stack (`stack.rs`) with no
//! lookup.

#[cfg(feature = "opentelemetry")]
mod otel;
mod slots;
mod spans;
mod stack;

use std::sync::Arc;
#[cfg(feature = "opentelemetry")]
use std::sync::OnceLock;

use tracing::span;
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use slots::Slots;
use spans::{Shape, SpanLabels, Values, Wanted};

/// The layer that puts tracing spans on CPU samples as labels: see [`layer()`].
pub struct LabelsLayer {
    fields: Arc<[Wanted]>,
    shape: Shape,
    /// The handles of spans entered before, by id: what spares an enter the registry.
    slots: Slots,
    /// The dispatch this layer is part of, to ask tracing-opentelemetry for a root's
    /// context (weak: the dispatch owns the layer).
    #[cfg(feature = "opentelemetry")]
    dispatch: OnceLock<tracing::dispatcher::WeakDispatch>,
}

/// A layer that labels the CPU samples taken while a span is entered:
///
/// - `span_name`: the name of the span's local root (the outermost span of its trace in
///   this process), or its `otel.name` field if it was given one at creation;
/// - `span_id`: 16 lowercase hex digits, the same for every span under one local root
///   and different for the next: the root's OpenTelemetry span id where it has a sampled
///   context (feature `opentelemetry`), else an id of the layer's own, unique in the
///   process (not tracing's span id, which the registry reuses);
/// - `trace_id`: 32 hex digits, the root's OpenTelemetry trace id, with the
///   `opentelemetry` feature and a sampled context only;
/// - the fields named with [`with_fields`](LabelsLayer::with_fields).
///
/// ```
/// use tracing_subscriber::prelude::*;
///
/// let subscriber = tracing_subscriber::registry().with(krabka_pprof::labels::layer());
/// tracing::subscriber::with_default(subscriber, || {
///     let span = tracing::info_span!("GET /users");
///     let _entered = span.enter();
///     // CPU samples taken here carry span_name="GET /users" and span_id="…".
/// });
/// ```
///
/// With the `opentelemetry` feature the layer reads the root's context at the first enter
/// of a span of its trace, through `tracing_opentelemetry::get_otel_context`: the
/// application's tracing-opentelemetry must be version 0.34 (another version gives the
/// layer no context, and samples get the layer's own `span_id`, silently). With the
/// OpenTelemetry layer's `with_context_activation(false)`, that first enter starts the
/// OpenTelemetry span: set its parent (`set_parent`) before entering it. Where the root
/// has a sampled context, it also gets the attribute `pyroscope.profile.id` (its span
/// id), as Grafana's span profiles expect.
pub fn layer() -> LabelsLayer {
    LabelsLayer {
        fields: Arc::new([]),
        shape: Shape {
            span_name: true,
            span_id: true,
            trace_id: true,
        },
        slots: Slots::new(),
        #[cfg(feature = "opentelemetry")]
        dispatch: OnceLock::new(),
    }
}

impl LabelsLayer {
    /// Span fields that become labels too, by name: their values recorded at the span's
    /// creation or later (`span.record`), inherited by the spans under it, a child's
    /// value winning over its parent's. A name that is not a valid label key is written
    /// as [`scope`](super::scope) writes keys (`http.route` stays, `user-agent` becomes
    /// `user_agent`, `span_id` becomes `user.span_id`). A value recorded on a span after a
    /// child was created reaches that child's samples only if the child was not yet
    /// created.
    ///
    /// Keep the values few (a tenant, a route, a job): Pyroscope makes a series of each
    /// distinct set of labels but `span_id`.
    ///
    /// ```
    /// use tracing_subscriber::prelude::*;
    ///
    /// let labels = krabka_pprof::labels::layer().with_fields(["tenant", "http.route"]);
    /// tracing::subscriber::with_default(tracing_subscriber::registry().with(labels), || {
    ///     let request = tracing::info_span!("request", tenant = "acme", http.route = tracing::field::Empty);
    ///     let _entered = request.enter();
    ///     request.record("http.route", "/users/{id}");
    ///     // Samples here carry tenant="acme" and http.route="/users/{id}".
    /// });
    /// ```
    pub fn with_fields<I>(mut self, names: I) -> LabelsLayer
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut fields = self.fields.to_vec();
        for name in names {
            if !fields.iter().any(|w| *w.name == *name.as_ref()) {
                fields.push(Wanted::new(name.as_ref()));
            }
        }
        self.fields = fields.into();
        self
    }

    /// Whether samples carry `span_name`, the local root's name (default: yes).
    ///
    /// ```
    /// let labels = krabka_pprof::labels::layer().with_span_name(false).with_fields(["tenant"]);
    /// # let _ = labels;
    /// ```
    pub fn with_span_name(mut self, span_name: bool) -> LabelsLayer {
        self.shape.span_name = span_name;
        self
    }

    /// Whether samples carry `span_id`, the local root's id (default: yes). Without it
    /// (and without `trace_id`), spans with the same name and fields share one label set.
    ///
    /// ```
    /// let labels = krabka_pprof::labels::layer().with_span_id(false);
    /// # let _ = labels;
    /// ```
    pub fn with_span_id(mut self, span_id: bool) -> LabelsLayer {
        self.shape.span_id = span_id;
        self
    }

    /// Whether samples carry `trace_id` where OpenTelemetry gives the root one (default:
    /// yes; only with the `opentelemetry` feature). Pyroscope servers older than
    /// mid-2026 make a series of each label but `span_id`, so a series per trace: turn it
    /// off for them.
    ///
    /// ```
    /// let labels = krabka_pprof::labels::layer().with_trace_id(false);
    /// # let _ = labels;
    /// ```
    pub fn with_trace_id(mut self, trace_id: bool) -> LabelsLayer {
        self.shape.trace_id = trace_id;
        self
    }

    /// The root's OpenTelemetry ids, if the dispatch has a sampled context for it.
    fn resolve(&self, root: &spans::Root) -> Option<spans::Ids> {
        #[cfg(feature = "opentelemetry")]
        if self.shape.span_id || self.shape.trace_id {
            return otel::ids(&root.id, self.dispatch.get()?, self.shape.span_id);
        }
        let _ = root;
        None
    }
}

impl Default for LabelsLayer {
    fn default() -> LabelsLayer {
        layer()
    }
}

impl Clone for LabelsLayer {
    /// The same settings, for another subscriber (so neither the dispatch this one is in
    /// nor its cache of that registry's span ids).
    fn clone(&self) -> LabelsLayer {
        LabelsLayer {
            fields: self.fields.clone(),
            shape: self.shape,
            slots: Slots::new(),
            #[cfg(feature = "opentelemetry")]
            dispatch: OnceLock::new(),
        }
    }
}

impl std::fmt::Debug for LabelsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelsLayer")
            .field(
                "fields",
                &self.fields.iter().map(|w| &*w.name).collect::<Vec<_>>(),
            )
            .field("span_name", &self.shape.span_name)
            .field("span_id", &self.shape.span_id)
            .field("trace_id", &self.shape.trace_id)
            .finish()
    }
}

impl<S> Layer<S> for LabelsLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        #[cfg(feature = "opentelemetry")]
        let _ = self.dispatch.set(subscriber.downgrade());
        let _ = subscriber;
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        // The registry resolved the parent (explicit, or the current span); a parent the
        // layer has labels for makes this span part of its local trace.
        let parent = span.parent();
        let parent_extensions = parent.as_ref().map(|parent| parent.extensions());
        let inherited = parent_extensions
            .as_ref()
            .and_then(|extensions| extensions.get::<SpanLabels>())
            .map(|labels| (&labels.root, &labels.fields));
        let root = inherited.is_none();
        let mut values = Values::new(&self.fields, root && self.shape.span_name);
        if !self.fields.is_empty() || (root && self.shape.span_name) {
            attrs.record(&mut values);
        }
        let labels = SpanLabels::new(inherited, id, attrs.metadata().name(), values);
        drop(parent_extensions);
        span.extensions_mut().insert(labels);
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if self.fields.is_empty() {
            return;
        }
        let mut found = Values::new(&self.fields, false);
        values.record(&mut found);
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let Some(labels) = extensions.get_mut::<SpanLabels>() else {
            return;
        };
        let Some(old) = labels.record(found) else {
            return;
        };
        // Interned already: this thread may have the span entered now. Its samples take
        // the new values at once (other threads at their next enter).
        let Some(old_handle) = old.handle() else {
            return;
        };
        let (root, fields) = (labels.root.clone(), labels.fields.clone());
        drop(extensions);
        drop(span);
        let new_handle = fields.intern(&root, self.shape, || self.resolve(&root));
        self.slots.put(id.into_u64(), new_handle);
        stack::replaced(id.into_u64(), old_handle, new_handle);
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(handle) = self.slots.get(id.into_u64()) {
            stack::enter(id.into_u64(), handle);
            return;
        }
        let Some(span) = ctx.span(id) else {
            return;
        };
        let extensions = span.extensions();
        let Some(labels) = extensions.get::<SpanLabels>() else {
            return;
        };
        let handle = match labels.fields.handle() {
            Some(handle) => handle,
            None => {
                // The first enter of this set: intern it, with no lock held (resolving
                // the root's OpenTelemetry context locks the root's extensions).
                let (root, fields) = (labels.root.clone(), labels.fields.clone());
                drop(extensions);
                drop(span);
                fields.intern(&root, self.shape, || self.resolve(&root))
            }
        };
        self.slots.put(id.into_u64(), handle);
        stack::enter(id.into_u64(), handle);
    }

    fn on_exit(&self, id: &span::Id, _ctx: Context<'_, S>) {
        // No lookup: what to put back is on this thread's stack.
        stack::exit(id.into_u64());
    }

    fn on_close(&self, id: span::Id, _ctx: Context<'_, S>) {
        // Before the registry may give the id to another span.
        self.slots.forget(id.into_u64());
    }
}

#[cfg(test)]
mod tests;
