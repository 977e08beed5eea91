//! A build without tokio's task dump: `/tasks` says which two switches turn it on.

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{TestServer, assert_head_like_get, client};
use reqwest::StatusCode;

#[pprof_routes]
fn app() -> Router {
    Router::new()
}

#[tokio::test]
async fn tasks_is_503_naming_both_switches() {
    let server = TestServer::start(app);
    let url = server.url("/debug/pprof/tasks");
    let response = client().get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(headers["x-go-pprof"], "1");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let text = response.text().await.unwrap();
    assert!(
        text.contains("RUSTFLAGS=\"--cfg tokio_unstable\"")
            && text.contains("krabka-pprof's `task-dump` feature")
            && text.contains("Linux on x86_64, aarch64, x86 or s390x")
            && text.ends_with('\n')
            && text.matches('\n').count() == 1,
        "{text:?}"
    );
    assert_eq!(
        assert_head_like_get(&url).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
}
