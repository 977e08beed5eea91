//! The function shapes the attribute accepts all get the routes, with their settings,
//! and keep their own behaviour.

use std::sync::Arc;

use axum::extract::State;
use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{TestServer, client};
use reqwest::StatusCode;

#[derive(Clone)]
struct AppState {
    greeting: Arc<str>,
}

/// A stateful router: the profiling routes need no state of their own.
#[pprof_routes(cpu_max = "7s")]
pub(crate) fn stateful() -> Router<AppState> {
    Router::new().route(
        "/",
        get(|State(s): State<AppState>| async move { s.greeting.to_string() }),
    )
}

#[pprof_routes(prefix = "/internal/pprof", cpu_max = "3s")]
async fn built_async(greeting: &'static str) -> Router {
    tokio::task::yield_now().await;
    Router::new().route("/", get(move || async move { greeting }))
}

#[pprof_routes(cpu_max = "4s")]
fn with_early_return(early: bool) -> Router {
    if early {
        return Router::new().route("/", get(|| async { "early" }));
    }
    Router::new().route("/", get(|| async { "late" }))
}

#[pprof_routes(cpu_max = "6s")]
fn generic<S>() -> Router<S>
where
    S: Clone + Default + Send + Sync + 'static,
{
    Router::new().route("/", get(|| async { "generic" }))
}

struct Service {
    name: String,
}

impl Service {
    #[pprof_routes(cpu_max = "8s", crate = "::krabka_pprof")]
    fn router(&self) -> Router<()> {
        let name = self.name.clone();
        Router::new().route("/", get(move || async move { name }))
    }
}

/// The app route answers `body`, and the profiling route exists with the given `cpu_max`
/// (its 400 message states it), without taking a profile.
async fn check(server: &TestServer, prefix: &str, body: &str, cpu_max: u64) {
    let http = client();
    let response = http.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), body);
    let response = http
        .get(server.url(&format!("{prefix}/profile?seconds=x")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let text = response.text().await.unwrap();
    assert!(
        text.contains(&format!("above {cpu_max} means {cpu_max}")),
        "{prefix}: {text}"
    );
}

#[tokio::test]
async fn stateful_router() {
    let server = TestServer::start(|| {
        stateful().with_state(AppState {
            greeting: "hello".into(),
        })
    });
    check(&server, "/debug/pprof", "hello", 7).await;
}

#[tokio::test]
async fn async_fn_with_prefix() {
    let router = built_async("async").await;
    let server = TestServer::start(move || router);
    check(&server, "/internal/pprof", "async", 3).await;
    let default_prefix = client()
        .get(server.url("/debug/pprof/profile?seconds=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(default_prefix.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn early_return_is_merged_too() {
    let server = TestServer::start(|| with_early_return(true));
    check(&server, "/debug/pprof", "early", 4).await;
    let server = TestServer::start(|| with_early_return(false));
    check(&server, "/debug/pprof", "late", 4).await;
}

#[tokio::test]
async fn generic_function() {
    let server = TestServer::start(generic::<()>);
    check(&server, "/debug/pprof", "generic", 6).await;
}

#[tokio::test]
async fn method_with_self() {
    let service = Service {
        name: "method".to_owned(),
    };
    let server = TestServer::start(move || service.router());
    check(&server, "/debug/pprof", "method", 8).await;
}

#[tokio::test]
async fn router_builders_without_the_attribute() {
    let config = krabka_pprof::ProfilingConfig::new()
        .with_cpu_max(std::time::Duration::from_secs(9))
        .with_prefix("/pp");
    let server = TestServer::start(move || {
        Router::new()
            .route("/", get(|| async { "built" }))
            .merge(krabka_pprof::pprof_router_with_config(config).unwrap())
    });
    check(&server, "/pp", "built", 9).await;

    let invalid = krabka_pprof::ProfilingConfig::new().with_frequency(0);
    let err = krabka_pprof::pprof_router_with_config::<()>(invalid).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`frequency` must be between 1 and 1000 Hz, found 0"
    );

    let server = TestServer::start(krabka_pprof::pprof_router);
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=x"))
        .send()
        .await
        .unwrap();
    assert!(response.text().await.unwrap().contains("above 60 means 60"));
}

#[pprof_routes]
fn inner_annotated() -> Router {
    Router::new().route("/", get(|| async { "inner" }))
}

/// A router that already has the profiling routes gets them a second time.
#[pprof_routes]
fn outer_annotated() -> Router {
    inner_annotated()
}

/// The app's own route where the profiling routes go.
#[pprof_routes]
fn own_route_under_the_prefix() -> Router {
    Router::new().route("/debug/pprof/profile", get(|| async { "mine" }))
}

/// The panic's message, from a function that must panic.
fn panic_message(build: fn() -> Router) -> String {
    let panic = std::panic::catch_unwind(build).expect_err("building the router must panic");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .expect("a text message")
}

#[test]
fn routes_already_under_the_prefix_panic_at_startup_naming_both_fixes() {
    for build in [
        outer_annotated as fn() -> Router,
        own_route_under_the_prefix,
    ] {
        let message = panic_message(build);
        for part in [
            "#[pprof_routes]",
            "already has a route where the profiling routes go, under `/debug/pprof`",
            // axum's own words, kept.
            "Overlapping method route",
            "annotate only the outermost one",
            "give the attribute another `prefix = \"...\"`",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
    }
    // The inner router alone is fine, and so is the prefix moved away.
    drop(inner_annotated());
}

/// What a team puts inside its builder: a session check on the whole router.
async fn require_session(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let has_session = request
        .headers()
        .get(axum::http::header::COOKIE)
        .is_some_and(|cookie| cookie == "session=ok");
    if has_session {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "log in first").into_response()
    }
}

/// The layer in the returned chain.
#[pprof_routes(cpu_max = "5s")]
fn session_layer_in_the_chain() -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(axum::middleware::from_fn(require_session))
}

/// The layer on a variable the body returns, as a route layer (which covers only the
/// routes the router has when it is called, and answers 404 for the rest).
#[pprof_routes(cpu_max = "5s")]
fn session_layer_on_a_variable() -> Router {
    let app = Router::new().route("/", get(|| async { "hello" }));
    let app = app.route_layer(axum::middleware::from_fn(require_session));
    app
}

/// Every profiling route of an app whose own layer demands a session answers 401
/// without one, as the app's own route does; with one, they answer.
#[tokio::test]
async fn a_layer_inside_the_builder_covers_the_profiling_routes() {
    let http = client();
    for (name, server) in [
        (
            "in the chain",
            TestServer::start(session_layer_in_the_chain),
        ),
        (
            "on a variable",
            TestServer::start(session_layer_on_a_variable),
        ),
    ] {
        for path in [
            "/",
            "/debug/pprof/",
            "/debug/pprof/profile?seconds=1",
            "/debug/pprof/threads?debug=1",
            "/debug/pprof/goroutine?debug=2",
            "/debug/pprof/recent",
        ] {
            let response = http.get(server.url(path)).send().await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{name}: {path} without a session"
            );
            assert_eq!(
                response.text().await.unwrap(),
                "log in first",
                "{name}: {path}"
            );
        }
        let index = http
            .get(server.url("/debug/pprof/"))
            .header("cookie", "session=ok")
            .send()
            .await
            .unwrap();
        assert_eq!(index.status(), StatusCode::OK, "{name}: with a session");
    }
}
