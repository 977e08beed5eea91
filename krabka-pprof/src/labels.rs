//! Labels on CPU samples: which tenant, route or trace burned the CPU.
//!
//! ```
//! use krabka_pprof::labels::{self, LabelsExt};
//!
//! # async fn handle() {}
//! # async fn example() {
//! // This thread, for the closure:
//! let sum = labels::scope(&[("tenant", "acme")], || (0..1000u64).sum::<u64>());
//! // This future, on whichever worker polls it:
//! handle().with_labels(&[("tenant", "acme")]).await;
//! # let _ = sum;
//! # }
//! ```
//!
//! and, for tracing spans, one layer:
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//!
//! tracing_subscriber::registry()
//!     .with(krabka_pprof::labels::layer())
//!     .init();
//! ```
//!
//! Every CPU sample taken while labels are active carries them as pprof sample labels:
//! `go tool pprof -tags` splits the CPU by each value, `-tagfocus tenant=acme` keeps one
//! tenant's, and the text view groups by one on request
//! (`/debug/pprof/profile?seconds=10&format=text&group=tenant`). Samples taken inside a
//! span carry `span_name` and `span_id` of its local root (what Grafana Pyroscope's span
//! profiles link a trace by). The [guide page](crate::guide::labels) says how to read
//! them and what they cost.
//!
//! # What a label set is
//!
//! Values are copied at the call. Nested scopes and futures merge: the inner value wins on
//! the same key. A future's labels apply wherever it is polled (they follow it across
//! worker threads) and end when it completes or is dropped. Keys are ASCII letters,
//! digits, `_` and `.`, not starting with a digit (what `-tagfocus key=value` can name):
//! any other character becomes `_`. The profiler's own keys (`thread`, `thread_id`,
//! `span_name`, `span_id`, `trace_id`) are taken from the user as `user.thread` and so on.
//! A value longer than 1,024 bytes is cut there (at a character boundary, marked `…`);
//! a set keeps its first 64 keys.
//!
//! # Spawned tasks do not inherit
//!
//! `tokio::spawn` carries no context: a task spawned inside a labelled future runs
//! without its labels. Pass them on with [`LabelsExt::with_current_labels`]:
//!
//! ```
//! use krabka_pprof::labels::LabelsExt;
//!
//! # async fn work() {}
//! # async fn example() {
//! tokio::spawn(work().with_current_labels());
//! # }
//! ```
//!
//! # Tracing spans
//!
//! [`layer()`] labels the samples taken while a span is entered with its local root's
//! `span_name` and `span_id` (16 hex digits, the same under one root, unique in the
//! process), and the span fields named with [`LabelsLayer::with_fields`]. With the
//! `opentelemetry` feature, a root with a sampled OpenTelemetry context (from
//! tracing-opentelemetry 0.34) lends its span id and `trace_id` instead. A span's labels
//! are in the word's other half: a scope inside a span, or a span inside a scope, needs
//! no merge; the profile shows both.
//!
//! # Cost
//!
//! The signal handler copies one word per sample (two handles into a table of interned
//! sets), never a string. [`scope`] looks its set up in a small per-thread cache (a miss
//! interns it in the process's table, under a lock); a labelled future swaps one word per
//! poll. A set is freed once no thread holds it and every sample that may carry it has
//! been drained. At most 65,536 sets are alive at once: past that, new sets are one
//! sentinel set (`labels = "[too many distinct label sets]"`), so values with a value per
//! request (a request id) cost a bounded amount. Put those in a span's `span_id` instead.

mod cache;
#[cfg(all(feature = "ebpf-labels", sampler))]
mod ebpf;
// The handler's side (the word's address, the drain's calls, samples' labels) exists for
// this crate's own sampler; elsewhere only the writers' side is used.
#[cfg_attr(not(sampler), allow(dead_code))]
pub(crate) mod current;
mod keys;
mod layer;
#[cfg_attr(not(sampler), allow(dead_code))]
pub(crate) mod table;

pub use layer::{LabelsLayer, layer};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use table::{Handle, LabelSet};

/// Runs `f` with `labels` on this thread's CPU samples, merged over the labels already
/// active (the inner value wins on the same key). The labels end when `f` returns or
/// unwinds.
///
/// ```
/// use krabka_pprof::labels;
///
/// let total = labels::scope(&[("tenant", "acme"), ("job", "reindex")], || {
///     labels::scope(&[("job", "compact")], || {
///         assert_eq!(labels::current().get("job"), Some("compact"));
///         assert_eq!(labels::current().get("tenant"), Some("acme"));
///         1 + 1
///     })
/// });
/// assert_eq!(total, 2);
/// assert!(labels::current().is_empty());
/// ```
pub fn scope<R>(labels: &[(&str, &str)], f: impl FnOnce() -> R) -> R {
    let _entered = cache::enter(labels);
    f()
}

/// The labels active on this thread now (its scopes and the labelled future it polls; a
/// span's are not included): what [`LabelsExt::with_labels_of`] gives to a future that
/// runs elsewhere.
pub fn current() -> Labels {
    let handle = current::user();
    Labels {
        handle,
        set: table::set_of(handle),
    }
}

/// A label set: what [`current`] returns, cheap to clone, for
/// [`LabelsExt::with_labels_of`].
#[derive(Clone, Default)]
pub struct Labels {
    /// Valid while `set` is held: the table frees a set only when it alone holds it.
    handle: Handle,
    set: Option<Arc<LabelSet>>,
}

impl Labels {
    /// The set of `labels`, checked and copied as [`scope`] does.
    pub fn new(labels: &[(&str, &str)]) -> Labels {
        if labels.is_empty() {
            return Labels::default();
        }
        let (handle, set) = table::intern(keys::set_of(labels), true);
        Labels {
            handle,
            set: Some(set),
        }
    }

    /// The value of `key`, if the set has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.set.as_deref()?.get(key)
    }

    /// The labels, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.set
            .iter()
            .flat_map(|set| set.pairs().iter().map(|(k, v)| (&**k, &**v)))
    }

    /// Whether the set has no labels.
    pub fn is_empty(&self) -> bool {
        self.set.is_none()
    }

    /// This set with `inner`'s labels over it.
    fn merged(&self, inner: &Labels) -> Labels {
        match (&self.set, &inner.set) {
            (None, _) => inner.clone(),
            (_, None) => self.clone(),
            (Some(outer), Some(own)) => {
                let (handle, set) = table::intern(outer.merged(own), true);
                Labels {
                    handle,
                    set: Some(set),
                }
            }
        }
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl PartialEq for Labels {
    fn eq(&self, other: &Labels) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Labels {}

/// Labels for futures: [`with_labels`](LabelsExt::with_labels) and its kin. Implemented
/// for every future.
pub trait LabelsExt: Future + Sized {
    /// This future with `labels` on the CPU samples of every poll, on whichever thread
    /// polls it, merged over the labels active where it is polled (the inner value wins).
    ///
    /// ```
    /// use krabka_pprof::labels::{self, LabelsExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let tenant = async { labels::current().get("tenant").map(str::to_owned) }
    ///     .with_labels(&[("tenant", "acme")])
    ///     .await;
    /// assert_eq!(tenant.as_deref(), Some("acme"));
    /// # }
    /// ```
    fn with_labels(self, labels: &[(&str, &str)]) -> Labeled<Self> {
        self.with_labels_of(&Labels::new(labels))
    }

    /// This future with the labels active here and now ([`current`]): what a task spawned
    /// from a labelled future needs, since `tokio::spawn` carries none.
    fn with_current_labels(self) -> Labeled<Self> {
        self.with_labels_of(&current())
    }

    /// This future with the labels of `labels`, as [`with_labels`](LabelsExt::with_labels).
    fn with_labels_of(self, labels: &Labels) -> Labeled<Self> {
        Labeled {
            inner: self,
            own: labels.clone(),
            merged: None,
        }
    }
}

impl<F: Future> LabelsExt for F {}

pin_project_lite::pin_project! {
    /// A future with labels on the CPU samples of its polls: see [`LabelsExt`].
    #[must_use = "futures do nothing unless polled"]
    pub struct Labeled<F> {
        #[pin]
        inner: F,
        own: Labels,
        // The labels active where it was last polled with others active, and `own` over
        // them: polled again under the same outer set, the merge is not done again.
        merged: Option<(Handle, Labels)>,
    }
}

impl<F> Labeled<F> {
    /// The labels this future adds.
    pub fn labels(&self) -> &Labels {
        &self.own
    }

    /// The future inside.
    pub fn into_inner(self) -> F {
        self.inner
    }
}

impl<F: Future> Future for Labeled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let outer = current::user();
        let mine = if outer == 0 || outer == this.own.handle {
            this.own.handle
        } else {
            match this.merged {
                Some((cached, labels)) if *cached == outer => labels.handle,
                _ => {
                    // The outer set is alive: whoever put its handle in the word holds it.
                    let outer_labels = Labels {
                        handle: outer,
                        set: table::set_of(outer),
                    };
                    let merged = outer_labels.merged(this.own);
                    let handle = merged.handle;
                    *this.merged = Some((outer, merged));
                    handle
                }
            }
        };
        let _restore = current::Restore(current::set_user(mine));
        this.inner.poll(cx)
    }
}

impl<F: std::fmt::Debug> std::fmt::Debug for Labeled<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labeled")
            .field("inner", &self.inner)
            .field("labels", &self.own)
            .finish()
    }
}

#[cfg(test)]
mod tests;
