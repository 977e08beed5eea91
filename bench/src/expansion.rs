//! Times the attribute's expansion outside rustc: the macro crate's own modules are
//! compiled into this binary (see `main.rs`) and run on proc-macro2's fallback tokens.

use std::str::FromStr as _;
use std::time::{Duration, Instant};

use proc_macro2::TokenStream;

const ATTR: &str = r#"cpu_default = "30s", cpu_max = "60s", frequency = 99, blocklist = ["libc", "libgcc", "pthread", "vdso"], prefix = "/debug/pprof""#;

/// A realistic annotated function: a stateful router with a dozen routes and layers.
const ITEM: &str = r#"
/// The service's routes.
#[allow(clippy::too_many_lines)]
pub async fn app(state: AppState, config: &Config) -> Router<()> {
    let api = Router::new()
        .route("/users", get(list_users).post(create_user))
        .route("/users/{id}", get(get_user).put(update_user).delete(delete_user))
        .route("/orders", get(list_orders).post(create_order))
        .route("/orders/{id}", get(get_order))
        .route("/health", get(|| async { "ok" }))
        .layer(TraceLayer::new_for_http())
        .layer(TimeoutLayer::new(config.timeout));
    if config.read_only {
        return Router::new().nest("/api", api.with_state(state.clone()));
    }
    let admin = Router::new()
        .route("/admin/reload", post(reload))
        .route("/admin/flags", get(flags).put(set_flags));
    Router::new()
        .nest("/api", api)
        .merge(admin)
        .fallback(not_found)
        .with_state(state)
}
"#;

/// Median time of one expansion over `rounds` batches.
pub fn median_expansion_time(rounds: usize, per_round: usize) -> Duration {
    let attr = TokenStream::from_str(ATTR).expect("attribute tokens");
    let item = TokenStream::from_str(ITEM).expect("item tokens");
    // Warm up, and check that the expansion is the successful one.
    let out = crate::expand::expand(attr.clone(), item.clone()).to_string();
    assert!(
        !out.contains("compile_error"),
        "the benchmark input must expand cleanly: {out}"
    );
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..per_round {
                std::hint::black_box(crate::expand::expand(attr.clone(), item.clone()));
            }
            started.elapsed() / per_round as u32
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}
