//! What the layer keeps in a span's extensions, and the label set a span's samples get:
//! the local root's name and id (shared by every span of the local trace), the named
//! fields' values (the parent's, with the span's own over them), and the interned set
//! made of both at the first enter. A span that adds no field values shares its
//! parent's set, so entering a child costs no interning.

use std::fmt;
use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span;

use crate::labels::keys;
use crate::labels::table::{self, Handle, LabelSet};

/// Which of the span labels a layer writes (`LabelsLayer::with_span_name` and so on).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) span_name: bool,
    pub(crate) span_id: bool,
    pub(crate) trace_id: bool,
}

/// A span field the user named: its name, and the label key it becomes.
#[derive(Clone, Debug)]
pub(crate) struct Wanted {
    pub(crate) name: Box<str>,
    pub(crate) key: Arc<str>,
}

impl Wanted {
    pub(crate) fn new(name: &str) -> Wanted {
        Wanted {
            name: name.into(),
            key: Arc::from(&*keys::key_of(name)),
        }
    }
}

/// The ids of a local root's samples: OpenTelemetry's (with the trace id) when it gave
/// the root a sampled context, else ours.
pub(crate) struct Ids {
    pub(crate) span_id: String,
    pub(crate) trace_id: Option<String>,
}

/// The local root of a trace in this process: the first span with no parent the layer
/// sees. Every span under it holds this.
pub(crate) struct Root {
    /// Valid while any span under the root lives: the registry keeps a span open while it
    /// has children. What tracing-opentelemetry is asked about.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(crate) id: span::Id,
    name: Arc<str>,
    /// Our `span_id`, when OpenTelemetry gives none.
    pub(crate) local_id: u64,
    /// Resolved at the first enter of any span of this trace, never at creation (reading
    /// OpenTelemetry's context then would start its span before `set_parent` can run).
    ids: OnceLock<Ids>,
}

/// A span's named field values, and the set its samples carry, interned at its first
/// enter. Shared by a parent and the children that add no values of their own.
pub(crate) struct Fields {
    set: LabelSet,
    /// The handle, and the set it names (held while the handle may be in a thread's word).
    interned: OnceLock<(Handle, Option<Arc<LabelSet>>)>,
}

impl Fields {
    fn new(set: LabelSet) -> Arc<Fields> {
        Arc::new(Fields {
            set,
            interned: OnceLock::new(),
        })
    }

    /// The handle of the span set, if it was interned.
    #[inline]
    pub(crate) fn handle(&self) -> Option<Handle> {
        self.interned.get().map(|(handle, _)| *handle)
    }

    /// The handle of the span set, interning it (and resolving the root's ids) the first
    /// time. Called with no span's extensions locked: resolving may read OpenTelemetry's
    /// context, which locks the root's.
    pub(crate) fn intern(
        &self,
        root: &Root,
        shape: Shape,
        resolve: impl FnOnce() -> Option<Ids>,
    ) -> Handle {
        if let Some(handle) = self.handle() {
            return handle;
        }
        let ids = match root.ids.get() {
            Some(ids) => ids,
            None => {
                // Not `get_or_init`: resolving may call into the application's tracer,
                // which may enter spans of this trace again. Two threads resolving at
                // once get the same ids; one is kept.
                let resolved = resolve().unwrap_or_else(|| Ids {
                    span_id: format!("{:016x}", root.local_id),
                    trace_id: None,
                });
                let _ = root.ids.set(resolved);
                root.ids.get().expect("just set")
            }
        };
        let mut pairs: Vec<(Arc<str>, Arc<str>)> = self.set.pairs().to_vec();
        if shape.span_name {
            pairs.push((Arc::from("span_name"), root.name.clone()));
        }
        if shape.span_id {
            pairs.push((Arc::from("span_id"), Arc::from(&*ids.span_id)));
        }
        let trace_id = ids.trace_id.as_deref().filter(|_| shape.trace_id);
        if let Some(trace_id) = trace_id {
            pairs.push((Arc::from("trace_id"), Arc::from(trace_id)));
        }
        if pairs.is_empty() {
            let _ = self.interned.set((0, None));
            return 0;
        }
        // With an id in it the set is this trace's alone: not worth looking up by content.
        let shared = !shape.span_id && trace_id.is_none();
        let (handle, set) = table::intern(LabelSet::of(pairs), shared);
        // Another thread may have interned it first: keep theirs (ours is freed by the
        // sweep once this drops).
        let _ = self.interned.set((handle, Some(set)));
        self.handle().expect("just set")
    }
}

/// How many superseded field sets a span keeps alive. A set another thread still has in
/// its word must stay interned until that thread exits the span; a span recorded again
/// and again while entered elsewhere lets go of the oldest (their samples then show the
/// labels as expired, never as another set's).
const RETIRED: usize = 4;

/// The layer's span extension.
pub(crate) struct SpanLabels {
    pub(crate) root: Arc<Root>,
    pub(crate) fields: Arc<Fields>,
    retired: Vec<Arc<Fields>>,
}

impl SpanLabels {
    /// The labels of a new span: under `parent`'s root with its own values over the
    /// parent's, or a new local root.
    pub(crate) fn new(
        parent: Option<(&Arc<Root>, &Arc<Fields>)>,
        id: &span::Id,
        name: &'static str,
        values: Values<'_>,
    ) -> SpanLabels {
        match parent {
            Some((root, fields)) => SpanLabels {
                root: root.clone(),
                fields: if values.found.is_empty() {
                    fields.clone()
                } else {
                    Fields::new(fields.set.merged(&LabelSet::of(values.found)))
                },
                retired: Vec::new(),
            },
            None => SpanLabels {
                root: Arc::new(Root {
                    id: id.clone(),
                    name: values.otel_name.unwrap_or_else(|| Arc::from(name)),
                    local_id: local_id(),
                    ids: OnceLock::new(),
                }),
                fields: Fields::new(LabelSet::of(values.found)),
                retired: Vec::new(),
            },
        }
    }

    /// Field values recorded after creation: the span's set becomes one with them over
    /// its current values. Returns the fields superseded, if any changed.
    pub(crate) fn record(&mut self, values: Values<'_>) -> Option<Arc<Fields>> {
        if values.found.is_empty() {
            return None;
        }
        let set = self.fields.set.merged(&LabelSet::of(values.found));
        if set == self.fields.set {
            return None;
        }
        let old = std::mem::replace(&mut self.fields, Fields::new(set));
        if self.retired.len() == RETIRED {
            self.retired.remove(0);
        }
        self.retired.push(old.clone());
        Some(old)
    }
}

/// The named field values of a span's attributes or record, and (for a root) its
/// `otel.name`.
pub(crate) struct Values<'a> {
    wanted: &'a [Wanted],
    found: Vec<(Arc<str>, Arc<str>)>,
    want_otel_name: bool,
    otel_name: Option<Arc<str>>,
}

impl<'a> Values<'a> {
    pub(crate) fn new(wanted: &'a [Wanted], want_otel_name: bool) -> Values<'a> {
        Values {
            wanted,
            found: Vec::new(),
            want_otel_name,
            otel_name: None,
        }
    }

    fn wanted(&self, field: &Field) -> Option<&Wanted> {
        self.wanted.iter().find(|w| *w.name == *field.name())
    }

    fn put(&mut self, field: &Field, value: &str) {
        if self.want_otel_name && field.name() == "otel.name" {
            self.otel_name = Some(Arc::from(&*keys::value_of(value)));
        }
        if let Some(wanted) = self.wanted(field) {
            let key = wanted.key.clone();
            self.found.push((key, Arc::from(&*keys::value_of(value))));
        }
    }
}

impl Visit for Values<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // Formatted only for the fields wanted.
        let otel_name = self.want_otel_name && field.name() == "otel.name";
        if otel_name || self.wanted(field).is_some() {
            self.put(field, &format!("{value:?}"));
        }
    }
}

/// A new local root's id: unique in the process (splitmix64 is a bijection, over a
/// counter), unlike tracing's span ids, which the registry hands out again after 8,191
/// spans; seeded per process, so two instances of a service do not repeat each other's.
/// Never 0.
fn local_id() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        std::collections::hash_map::RandomState::new().hash_one(0x6b72_6162_6b61_u64)
    });
    loop {
        let id = splitmix64(seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)));
        if id != 0 {
            return id;
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64's published outputs (Vigna's reference, seed 0): a bijection, so ids
    /// drawn from a counter never repeat; a step changed would not be one.
    #[test]
    fn span_ids_are_splitmix64_of_a_counter() {
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    }
}
