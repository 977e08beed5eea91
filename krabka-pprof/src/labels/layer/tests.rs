use std::collections::HashSet;
use std::sync::{Arc, Barrier};

use tracing::{Dispatch, info_span};
use tracing_subscriber::prelude::*;

use super::*;
use crate::labels::current;
use crate::labels::table::{self, LabelSet};

/// The span half of this thread's word.
fn span_half() -> u32 {
    current::halves(current::word()).1
}

/// The set the span half names: what a sample taken now would carry besides the user's.
fn span_set() -> Arc<LabelSet> {
    table::set_of(span_half()).expect("a span set is alive while its span is entered")
}

fn is_hex(value: &str, digits: usize) -> bool {
    value.len() == digits
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn with_layer<R>(layer: LabelsLayer, f: impl FnOnce() -> R) -> R {
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f)
}

#[test]
fn an_entered_span_sets_the_span_half_of_the_word_and_its_exit_puts_it_back() {
    with_layer(layer(), || {
        crate::labels::scope(&[("tenant", "kept")], || {
            let before = current::word();
            assert_eq!(current::halves(before).1, 0);
            let span = info_span!("request");
            {
                let _entered = span.enter();
                let (user, _) = current::halves(current::word());
                assert_eq!(
                    user,
                    current::halves(before).0,
                    "the user half is left alone"
                );
                let set = span_set();
                assert_eq!(set.get("span_name"), Some("request"));
                let id = set.get("span_id").expect("a span_id");
                assert!(is_hex(id, 16), "{id:?}");
                assert_eq!(set.get("trace_id"), None, "no OpenTelemetry context");
            }
            assert_eq!(current::word(), before);
            assert_eq!(stack::depth(), 0);
        });
    });
}

#[test]
fn spans_under_a_local_root_carry_its_name_and_id() {
    with_layer(layer(), || {
        let first = info_span!("GET /users", otel.name = "GET /users/{id}");
        let (root_id, child_id) = first.in_scope(|| {
            let root = span_set();
            assert_eq!(
                root.get("span_name"),
                Some("GET /users/{id}"),
                "otel.name wins"
            );
            info_span!("db").in_scope(|| {
                info_span!("row").in_scope(|| {
                    let child = span_set();
                    assert_eq!(child.get("span_name"), root.get("span_name"));
                    (
                        root.get("span_id").map(str::to_owned),
                        child.get("span_id").map(str::to_owned),
                    )
                })
            })
        });
        assert_eq!(root_id, child_id);
        let second =
            info_span!("GET /orders").in_scope(|| span_set().get("span_id").map(str::to_owned));
        assert_ne!(root_id, second, "another root, another id");
        // An explicit parent makes a span part of that parent's trace, wherever it is entered.
        let orphan = info_span!(parent: &first, "later");
        let inherited = orphan.in_scope(|| span_set().get("span_id").map(str::to_owned));
        assert_eq!(inherited, root_id);
    });
}

/// `otel.name` recorded as text or through `Display` (`%`, as `tracing-opentelemetry`'s
/// users often write it) names the root; no other field does, before it or after it.
#[test]
fn a_roots_otel_name_is_read_however_it_is_recorded_and_from_no_other_field() {
    with_layer(layer(), || {
        let route = String::from("GET /orders/{id}");
        let spans = [
            info_span!(
                "GET /orders",
                otel.name = "GET /orders/{id}",
                user = "alice"
            ),
            info_span!("GET /orders", otel.name = %route, user = "alice"),
            info_span!("GET /orders", user = "alice", otel.name = %route, tenant = "acme"),
        ];
        for span in spans {
            let name = span.in_scope(|| span_set().get("span_name").map(str::to_owned));
            assert_eq!(name.as_deref(), Some(&*route), "{span:?}");
        }
        let plain = info_span!("GET /orders", user = "alice");
        let name = plain.in_scope(|| span_set().get("span_name").map(str::to_owned));
        assert_eq!(name.as_deref(), Some("GET /orders"), "the span's own name");
    });
}

#[test]
fn named_fields_become_labels_inherited_with_the_child_winning() {
    let labels = layer().with_fields(["tenant", "region", "span_id"]);
    with_layer(labels, || {
        let root = info_span!(
            "request",
            tenant = "acme",
            region = "eu",
            ignored = 7,
            span_id = 42
        );
        root.in_scope(|| {
            let set = span_set();
            assert_eq!(set.get("tenant"), Some("acme"));
            assert_eq!(set.get("region"), Some("eu"));
            assert_eq!(set.get("ignored"), None, "not named");
            assert_eq!(
                set.get("user.span_id"),
                Some("42"),
                "a field does not take the layer's key"
            );
            assert!(is_hex(set.get("span_id").unwrap(), 16));
            let child = info_span!("tenant switch", tenant = "globex");
            child.in_scope(|| {
                let set = span_set();
                assert_eq!(set.get("tenant"), Some("globex"), "the child's value wins");
                assert_eq!(set.get("region"), Some("eu"), "the rest is inherited");
                let handle = span_half();
                info_span!("no fields of its own").in_scope(|| {
                    assert_eq!(
                        span_half(),
                        handle,
                        "a child that adds nothing shares its parent's set"
                    );
                });
            });
        });
    });
}

#[test]
fn a_field_recorded_later_labels_the_samples_from_then_on() {
    with_layer(layer().with_fields(["tenant"]), || {
        let root = info_span!("request", tenant = tracing::field::Empty);
        let _root = root.enter();
        assert_eq!(span_set().get("tenant"), None);
        let early = info_span!("created before the record");
        {
            let _early = early.enter();
            root.record("tenant", "acme");
            assert_eq!(
                span_set().get("tenant"),
                None,
                "a child keeps what it inherited"
            );
        }
        assert_eq!(
            span_set().get("tenant"),
            Some("acme"),
            "the child's exit puts back the root's new set, not the one it replaced"
        );
        root.record("tenant", "globex");
        assert_eq!(
            span_set().get("tenant"),
            Some("globex"),
            "at once, inside the span"
        );
        info_span!("created after").in_scope(|| {
            assert_eq!(span_set().get("tenant"), Some("globex"));
        });
        drop(_root);
        assert_eq!(span_half(), 0);
        root.in_scope(|| assert_eq!(span_set().get("tenant"), Some("globex")));
    });
}

#[test]
fn span_ids_stay_unique_where_tracing_reuses_its_own() {
    const ROOTS: usize = 20_000;
    let (mut ours, mut tracing_ids) = (HashSet::new(), HashSet::new());
    with_layer(layer(), || {
        for _ in 0..ROOTS {
            let span = info_span!("request");
            tracing_ids.insert(span.id().expect("enabled").into_u64());
            let id = span.in_scope(|| span_set().get("span_id").map(str::to_owned));
            ours.insert(id.expect("a span_id"));
        }
    });
    assert!(
        tracing_ids.len() < ROOTS,
        "the registry reused its ids (after 8,191 spans on a slot): {} distinct",
        tracing_ids.len()
    );
    assert_eq!(ours.len(), ROOTS);
}

#[test]
fn one_span_entered_on_two_threads_at_once_sets_each_threads_word() {
    with_layer(layer(), || {
        let span = info_span!("shared");
        let both = Barrier::new(2);
        let seen: Vec<u32> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let entered = span.enter();
                        both.wait();
                        let inside = span_half();
                        both.wait();
                        drop(entered);
                        assert_eq!(span_half(), 0, "each thread puts back its own");
                        assert_eq!(stack::depth(), 0);
                        inside
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("the thread"))
                .collect()
        });
        assert_ne!(seen[0], 0);
        assert_eq!(seen[0], seen[1]);
    });
}

#[test]
fn exits_out_of_order_and_exits_never_entered_leave_a_word_that_makes_sense() {
    with_layer(layer(), || {
        let (a, b) = (info_span!("a"), info_span!("b"));
        let entered_a = a.enter();
        let in_a = span_half();
        let entered_b = b.enter();
        let in_b = span_half();
        assert_ne!(in_a, in_b, "two roots");
        drop(entered_a);
        assert_eq!(span_half(), in_b, "b is still entered");
        assert_eq!(stack::depth(), 1);
        // An exit of a span this thread never entered (through the dispatcher, as a
        // misbehaving integration might) changes nothing.
        let other = info_span!("elsewhere");
        let other_id = other.id().expect("enabled");
        tracing::dispatcher::get_default(|dispatch: &Dispatch| dispatch.exit(&other_id));
        assert_eq!(span_half(), in_b);
        drop(entered_b);
        assert_eq!(span_half(), 0, "what a replaced, back once b exits");
        assert_eq!(stack::depth(), 0);
    });
}

#[test]
fn a_closed_spans_id_no_longer_finds_its_handle() {
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer()));
    let labels = dispatch
        .downcast_ref::<LabelsLayer>()
        .expect("the layer in the dispatch");
    tracing::dispatcher::with_default(&dispatch, || {
        let span = info_span!("request");
        let id = span.id().expect("enabled").into_u64();
        assert_eq!(
            labels.slots.get(id),
            None,
            "not entered yet: nothing interned"
        );
        let handle = span.in_scope(span_half);
        assert_eq!(
            labels.slots.get(id),
            Some(handle),
            "later enters skip the registry"
        );
        drop(span);
        // The registry may now give `id` to another span: a hit would give that span
        // this one's labels (freed, or another set's once the slot's generation wraps).
        assert_eq!(labels.slots.get(id), None);
    });
}

#[test]
fn a_slot_names_one_span_at_a_time() {
    let slots = Slots::new();
    slots.put(7, 0x101);
    assert_eq!(slots.get(7), Some(0x101));
    slots.put(7, 0x202);
    assert_eq!(
        slots.get(7),
        Some(0x202),
        "a span's new set replaces its old"
    );
    slots.forget(8);
    assert_eq!(slots.get(7), Some(0x202), "another id's close leaves it");
    slots.forget(7);
    assert_eq!(slots.get(7), None);
    // Ids that share a slot take turns.
    let other = (1..).find(|&id| {
        slots.put(7, 1);
        slots.put(id, 2);
        id != 7 && slots.get(7).is_none()
    });
    let other = other.expect("some id shares 7's slot");
    assert_eq!(slots.get(other), Some(2));
    assert_eq!(
        slots.get(7),
        None,
        "evicted, so found through the registry again"
    );
}

fn nest(depth: usize, max: usize) {
    let span = info_span!("level", depth);
    let _entered = span.enter();
    let here = span_half();
    assert_eq!(span_set().get("depth"), Some(depth.to_string().as_str()));
    if depth < max {
        nest(depth + 1, max);
    }
    assert_eq!(
        span_half(),
        here,
        "level {depth} again after its child exits"
    );
}

#[test]
fn spans_nested_deeper_than_the_inline_stack_unwind_to_each_level() {
    with_layer(layer().with_fields(["depth"]), || {
        nest(0, 40);
        assert_eq!(span_half(), 0);
        assert_eq!(stack::depth(), 0);
    });
}

#[test]
fn a_layer_without_span_labels_or_fields_puts_no_set_in_the_word() {
    let labels = layer()
        .with_span_name(false)
        .with_span_id(false)
        .with_trace_id(false);
    assert_eq!(
        format!("{:?}", labels.clone().with_fields(["tenant"])),
        r#"LabelsLayer { fields: ["tenant"], span_name: false, span_id: false, trace_id: false }"#
    );
    with_layer(labels.clone(), || {
        info_span!("request").in_scope(|| assert_eq!(span_half(), 0));
    });
    // Without ids, spans of one name and fields share one set.
    with_layer(labels.with_fields(["tenant"]), || {
        let first = info_span!("request", tenant = "acme").in_scope(span_half);
        let second = info_span!("request", tenant = "acme").in_scope(span_half);
        assert_ne!(first, 0);
        assert_eq!(first, second);
    });
}

#[cfg(feature = "opentelemetry")]
mod with_opentelemetry {
    use std::sync::Mutex;

    use ::opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        TracerProvider as _,
    };
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
    use tracing::Subscriber;
    use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt as _, SetParentError};

    use super::*;

    /// The spans the tracer ended, as an exporter receives them.
    #[derive(Clone, Debug, Default)]
    struct Ended(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Ended {
        fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            self.0.lock().unwrap().extend(batch);
            std::future::ready(Ok(()))
        }
    }

    const REMOTE_TRACE: u128 = 0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c;
    const REMOTE_SPAN: u64 = 0xb7ad_6b71_6920_3331;

    /// A parent from another process, as an HTTP server extracts it from `traceparent`.
    fn remote(flags: TraceFlags) -> ::opentelemetry::Context {
        ::opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(REMOTE_TRACE),
            SpanId::from(REMOTE_SPAN),
            flags,
            true,
            TraceState::default(),
        ))
    }

    struct Seen {
        parented: Result<(), SetParentError>,
        root_otel_span_id: String,
        labels: Arc<LabelSet>,
        child_labels: Arc<LabelSet>,
    }

    /// A request's root span given its remote parent after creation (as a server does),
    /// then entered, with a child inside.
    fn request(subscriber: impl Subscriber + Send + Sync + 'static, flags: TraceFlags) -> Seen {
        tracing::subscriber::with_default(subscriber, || {
            let root = info_span!("request", otel.name = "GET /users");
            let parented = root.set_parent(remote(flags));
            root.in_scope(|| {
                let labels = span_set();
                let child_labels = info_span!("db").in_scope(span_set);
                Seen {
                    parented,
                    root_otel_span_id: root.context().span().span_context().span_id().to_string(),
                    labels,
                    child_labels,
                }
            })
        })
    }

    fn provider() -> (SdkTracerProvider, Ended) {
        let ended = Ended::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(ended.clone())
            .build();
        (provider, ended)
    }

    /// tracing-opentelemetry's layer over the SDK's tracer, as an application sets it up.
    fn otel<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer().with_tracer(provider.tracer("test"))
    }

    #[test]
    fn a_sampled_root_labels_samples_with_its_opentelemetry_ids_in_either_layer_order() {
        for otel_first in [true, false] {
            let (provider, ended) = provider();
            let seen = if otel_first {
                request(
                    tracing_subscriber::registry()
                        .with(otel(&provider))
                        .with(layer()),
                    TraceFlags::SAMPLED,
                )
            } else {
                request(
                    tracing_subscriber::registry()
                        .with(layer())
                        .with(otel(&provider)),
                    TraceFlags::SAMPLED,
                )
            };
            seen.parented
                .expect("set_parent after creation: the layer started no OpenTelemetry span");
            let trace_id = format!("{REMOTE_TRACE:032x}");
            assert_eq!(
                seen.labels.get("trace_id"),
                Some(trace_id.as_str()),
                "the propagated trace"
            );
            assert_eq!(
                seen.labels.get("span_id"),
                Some(seen.root_otel_span_id.as_str())
            );
            assert_eq!(seen.labels.get("span_name"), Some("GET /users"));
            assert_eq!(
                seen.child_labels.get("span_id"),
                seen.labels.get("span_id"),
                "the local root's"
            );
            assert_eq!(
                seen.child_labels.get("trace_id"),
                seen.labels.get("trace_id")
            );
            let ended = ended.0.lock().unwrap();
            let root = ended
                .iter()
                .find(|s| s.name == "GET /users")
                .expect("the root ended");
            assert_eq!(root.parent_span_id, SpanId::from(REMOTE_SPAN));
            let profile_id = root
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "pyroscope.profile.id");
            assert_eq!(
                profile_id.map(|kv| kv.value.to_string()),
                Some(seen.root_otel_span_id.clone()),
                "the trace links to the profile (otel layer first: {otel_first})"
            );
        }
    }

    #[test]
    fn an_unsampled_root_or_no_opentelemetry_layer_falls_back_to_our_own_id() {
        let (provider, ended) = provider();
        let seen = request(
            tracing_subscriber::registry()
                .with(otel(&provider))
                .with(layer()),
            TraceFlags::default(),
        );
        seen.parented.expect("set_parent");
        let ours = seen.labels.get("span_id").expect("a span_id");
        assert!(is_hex(ours, 16), "{ours:?}");
        assert_ne!(
            ours, seen.root_otel_span_id,
            "not sampled: not the OpenTelemetry id"
        );
        assert_eq!(seen.labels.get("trace_id"), None);
        assert!(
            ended.0.lock().unwrap().is_empty(),
            "an unsampled span is not exported"
        );

        let seen = request(
            tracing_subscriber::registry().with(layer()),
            TraceFlags::SAMPLED,
        );
        assert!(matches!(seen.parented, Err(SetParentError::LayerNotFound)));
        assert!(is_hex(seen.labels.get("span_id").unwrap(), 16));
        assert_eq!(seen.labels.get("trace_id"), None);
    }

    #[test]
    fn with_trace_id_false_keeps_the_opentelemetry_span_id_only() {
        let (provider, _ended) = provider();
        let seen = request(
            tracing_subscriber::registry()
                .with(otel(&provider))
                .with(layer().with_trace_id(false)),
            TraceFlags::SAMPLED,
        );
        seen.parented.expect("set_parent");
        assert_eq!(
            seen.labels.get("span_id"),
            Some(seen.root_otel_span_id.as_str())
        );
        assert_eq!(seen.labels.get("trace_id"), None);
    }
}
