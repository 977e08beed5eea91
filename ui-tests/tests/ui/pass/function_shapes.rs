use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use krabka_pprof::pprof_routes;

#[derive(Clone, Default)]
struct AppState(Arc<str>);

/// Documented, stateful, fully qualified return type.
#[pprof_routes]
#[allow(dead_code)]
pub fn stateful() -> axum::Router<AppState> {
    axum::Router::new().route("/", get(|State(s): State<AppState>| async move { s.0.to_string() }))
}

#[pprof_routes(cpu_max = "30s")]
pub(crate) async fn built_async(name: String) -> axum::Router {
    let name: &'static str = Box::leak(name.into_boxed_str());
    axum::Router::new().route("/", get(move || async move { name }))
}

#[pprof_routes]
fn early(flag: bool) -> axum::Router {
    if flag {
        return axum::Router::new();
    }
    axum::Router::new().route("/", get(|| async { "late" }))
}

#[pprof_routes]
fn generic<S>() -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    axum::Router::new()
}

struct Service {
    greeting: &'static str,
}

impl Service {
    #[pprof_routes(frequency = 250)]
    fn router(&self) -> axum::Router {
        let greeting = self.greeting;
        axum::Router::new().route("/", get(move || async move { greeting }))
    }

    #[pprof_routes]
    async fn into_router(self) -> axum::Router {
        self.router()
    }
}

trait Routes {
    #[pprof_routes]
    fn routes(&self) -> axum::Router {
        axum::Router::new()
    }
}

impl Routes for Service {}

mod reexport {
    pub use krabka_pprof as pp;
}

#[pprof_routes(crate = "crate::reexport::pp")]
fn through_a_reexport() -> axum::Router {
    axum::Router::new()
}

fn main() {
    let _: axum::Router = stateful().with_state(AppState::default());
    let _ = built_async("x".into());
    let _ = (early(true), early(false), generic::<()>(), through_a_reexport());
    let service = Service { greeting: "hi" };
    let _ = (service.router(), service.routes());
    let _ = service.into_router();
    let _ = (Admin(1u8).router(), from_macro());
}

/// A guard that is a method, named through `Self`, in a generic impl.
struct Admin<T>(T);

impl<T: Send + Sync + 'static> Admin<T> {
    fn allow(parts: &axum::http::request::Parts) -> bool {
        parts.headers.contains_key("x-admin")
    }

    #[pprof_routes(guard = Self::allow)]
    fn router(&self) -> axum::Router {
        axum::Router::new()
    }
}

/// The return type written by a `macro_rules!` (an invisible group around `$ret`).
macro_rules! app_returning {
    ($name:ident, $ret:ty) => {
        #[pprof_routes]
        fn $name() -> $ret {
            axum::Router::new()
        }
    };
}
app_returning!(from_macro, axum::Router);
