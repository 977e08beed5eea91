//! M6: the attribute's build cost. Release builds of a small app with the attribute and of
//! the same app registering the routes by hand (`bench/apps/`), and the expansion timed
//! outside rustc: the macro crate's own modules are compiled into this binary (see
//! `main.rs`) and run on proc-macro2's fallback tokens.

use std::process::Command;
use std::str::FromStr as _;
use std::time::{Duration, Instant, SystemTime};

use proc_macro2::TokenStream;

use crate::Options;
use crate::figures::{Row, Verdict};
use crate::stats::median;

/// M6: build cost of the attribute.
pub fn build_cost(options: &Options) -> Vec<Row> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let build = |package: &str, target_dir: Option<&std::path::Path>| -> f64 {
        let mut command = Command::new(&cargo);
        command
            .current_dir(&root)
            .args(["build", "--quiet", "-p", package, "--profile"])
            .arg(crate::harness::own_profile());
        if let Some(dir) = target_dir {
            command.arg("--target-dir").arg(dir);
        }
        let started = Instant::now();
        let status = command.status().expect("run cargo");
        assert!(status.success(), "cargo build -p {package} failed");
        started.elapsed().as_secs_f64()
    };
    let touch = |package: &str| {
        let dir = if package.ends_with("attr") {
            "with-attr"
        } else {
            "by-hand"
        };
        let path = root.join("bench/apps").join(dir).join("src/main.rs");
        let file = std::fs::File::options().append(true).open(&path).unwrap();
        file.set_modified(SystemTime::now()).unwrap();
    };
    let packages = ["bench-app-with-attr", "bench-app-by-hand"];
    for package in packages {
        build(package, None);
    }
    let (mut with, mut by_hand) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(3) {
        let order = if round % 2 == 0 {
            packages
        } else {
            [packages[1], packages[0]]
        };
        for package in order {
            touch(package);
            let seconds = build(package, None);
            eprintln!("M6 round {round}: rebuilt {package} in {seconds:.2} s");
            if package.ends_with("attr") {
                with.push(seconds)
            } else {
                by_hand.push(seconds)
            }
        }
    }
    let (w, h) = (median(with), median(by_hand));
    let expansion = median_expansion_time(options.rounds(9), 200);
    let mut rows = vec![
        Row {
            id: "M6",
            figure: format!(
                "release build of the app crate, attribute ÷ by hand ({w:.2} s / {h:.2} s)"
            ),
            target: "≤ 1.05",
            measured: format!("{:.3}", w / h),
            verdict: Verdict::at_most(w / h, 1.05),
        },
        Row {
            id: "M6",
            figure: "expansion of one attribute (proc-macro2 fallback, outside rustc)".into(),
            target: "≤ 5 ms",
            measured: format!("{:.3} ms", expansion.as_secs_f64() * 1e3),
            verdict: Verdict::at_most(expansion.as_secs_f64() * 1e3, 5.0),
        },
    ];
    if options.clean_build {
        let mut clean = [0.0f64; 2];
        for (i, package) in packages.iter().enumerate() {
            let dir = std::env::temp_dir().join(format!("krabka-bench-clean-{package}"));
            let _ = std::fs::remove_dir_all(&dir);
            clean[i] = build(package, Some(&dir));
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("M6 clean: {package} in {:.1} s", clean[i]);
        }
        rows.push(Row {
            id: "M6",
            figure: format!(
                "clean release build, attribute ÷ by hand ({:.1} s / {:.1} s)",
                clean[0], clean[1]
            ),
            target: "≤ 1.05",
            measured: format!("{:.3}", clean[0] / clean[1]),
            verdict: Verdict::at_most(clean[0] / clean[1], 1.05),
        });
    }
    rows
}

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
