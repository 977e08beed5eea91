//! The index page and the views: valid HTML5 whose every link works, a flamegraph that an
//! XML parser accepts, a text table with Go's columns.

use std::time::Duration;

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{Burner, TestServer, assert_valid_xml, client, decode, serial};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "1s", frequency = 250, cmdline = true)]
fn app() -> Router {
    Router::new()
}

/// Parses `html` as an HTML5 browser would and returns the parse errors and the links.
fn parse_html(html: &str) -> (Vec<String>, Vec<String>) {
    use html5ever::tendril::TendrilSink as _;
    use markup5ever_rcdom::{Handle, NodeData, RcDom};
    let dom = html5ever::parse_document(RcDom::default(), Default::default())
        .from_utf8()
        .read_from(&mut html.as_bytes())
        .unwrap();
    fn links(node: &Handle, out: &mut Vec<String>) {
        if let NodeData::Element { name, attrs, .. } = &node.data
            && &*name.local == "a"
        {
            for attr in attrs.borrow().iter() {
                if &*attr.name.local == "href" {
                    out.push(attr.value.to_string());
                }
            }
        }
        for child in node.children.borrow().iter() {
            links(child, out);
        }
    }
    let mut found = Vec::new();
    links(&dom.document, &mut found);
    let errors = dom.errors.borrow().iter().map(|e| e.to_string()).collect();
    (errors, found)
}

/// What a browser would fetch from elsewhere when showing `html`: `src`, `srcset`,
/// `poster` and `data` of any element, `<link href>`, and `url(…)` in styles, that name
/// another host (`scheme://` or `//host`). Links the reader may follow are not assets.
fn external_assets(html: &str) -> Vec<String> {
    use html5ever::tendril::TendrilSink as _;
    use markup5ever_rcdom::{Handle, NodeData, RcDom};
    fn external(value: &str) -> bool {
        let value = value.trim();
        value.contains("://") || value.starts_with("//")
    }
    fn walk(node: &Handle, out: &mut Vec<String>) {
        match &node.data {
            NodeData::Element { name, attrs, .. } => {
                for attr in attrs.borrow().iter() {
                    let key = &*attr.name.local;
                    let fetched = matches!(key, "src" | "srcset" | "poster" | "data")
                        || (key == "href" && &*name.local == "link")
                        || (key == "style" && attr.value.contains("url("));
                    if fetched && external(&attr.value) {
                        out.push(format!("<{} {key}={:?}>", &*name.local, &*attr.value));
                    }
                }
            }
            NodeData::Text { contents } => {
                let text = contents.borrow();
                if text.contains("url(") && text.split("url(").skip(1).any(external) {
                    out.push(format!("style text {:?}", &**text));
                }
            }
            _ => {}
        }
        for child in node.children.borrow().iter() {
            walk(child, out);
        }
    }
    let dom = html5ever::parse_document(RcDom::default(), Default::default())
        .from_utf8()
        .read_from(&mut html.as_bytes())
        .unwrap();
    let mut found = Vec::new();
    walk(&dom.document, &mut found);
    found
}

#[test]
fn the_external_asset_check_sees_assets() {
    for page in [
        "<img src=\"http://cdn.example/x.png\">",
        "<link rel=stylesheet href=\"https://cdn.example/x.css\">",
        "<script src=\"//cdn.example/x.js\"></script>",
        "<style>body { background: url(https://cdn.example/x.png) }</style>",
    ] {
        assert_eq!(external_assets(page).len(), 1, "{page}");
    }
    assert!(external_assets("<a href=\"https://docs.rs/\">docs</a><img src=\"x.png\">").is_empty());
}

#[tokio::test]
async fn index_is_valid_html_and_every_link_works() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let http = client();

    let redirect = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(server.url("/debug/pprof"))
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(redirect.headers()["location"], "/debug/pprof/");

    let response = http.get(server.url("/debug/pprof/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
    let html = response.text().await.unwrap();
    let (errors, links) = parse_html(&html);
    assert!(errors.is_empty(), "HTML5 parse errors: {errors:?}");
    let (broken, _) = parse_html("<html><p>no doctype <b>misnested</p></b>");
    assert!(!broken.is_empty(), "the parser does report errors");
    assert_eq!(
        external_assets(&html),
        Vec::<String>::new(),
        "no external assets"
    );
    assert!(!html.contains("<script"), "readable without JavaScript");
    assert!(
        html.contains("250 Hz") && html.contains("at most 1s"),
        "settings in force"
    );
    assert!(html.contains("off (enable with <code>heap = true</code>)"));

    let expected = [
        "profile?seconds=5",
        #[cfg(feature = "flamegraph")]
        "profile?seconds=5&format=svg",
        "profile?seconds=5&format=text",
        "profile?seconds=5&format=text&group=thread",
        "wall?seconds=5",
        #[cfg(feature = "flamegraph")]
        "wall?seconds=5&format=svg",
        "wall?seconds=5&format=text",
        "wall?seconds=5&format=text&group=thread_state",
        "blocking?seconds=5",
        #[cfg(feature = "flamegraph")]
        "blocking?seconds=5&format=svg",
        "blocking?seconds=5&format=text",
        "blocking?seconds=5&format=text&group=syscall",
        "threads",
        #[cfg(feature = "flamegraph")]
        "threads?format=svg",
        "threads?format=text",
        "threads?debug=1",
        "threads?debug=2",
        "goroutine",
        "goroutine?debug=2",
        "tasks",
        "cmdline",
    ];
    assert_eq!(links, expected, "the page links every view of every route");
    for link in links {
        let response = http
            .get(server.url(&format!("/debug/pprof/{link}")))
            .send()
            .await
            .unwrap();
        if krabka_pprof_tests::pprof_rs_sampler()
            && (link.starts_with("wall") || link.starts_with("blocking"))
        {
            // The wall routes need this crate's own sampler, and say so.
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{link}");
            assert!(response.text().await.unwrap().contains("own CPU sampler"));
            continue;
        }
        if link == "tasks" {
            // This build has no task dumps: the link answers with the sentence that says
            // how to turn them on.
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{link}");
            assert!(response.text().await.unwrap().contains("task-dump"));
            continue;
        }
        assert_eq!(response.status(), StatusCode::OK, "{link}");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = response.bytes().await.unwrap();
        let text = String::from_utf8_lossy(&body);
        match content_type.as_str() {
            "application/octet-stream" => drop(decode(&body)),
            "image/svg+xml" => assert_valid_xml(&text),
            "text/plain; charset=utf-8" if link.contains("format=text") => {
                assert!(text.contains("flat%"), "{link}: {text}");
                if link.contains("group=thread") {
                    assert!(text.contains("Grouped by label thread"), "{link}: {text}");
                }
            }
            "text/plain; charset=utf-8" if link.contains("debug=") => {
                assert!(text.starts_with("threads"), "{link}: {text}");
            }
            "text/plain; charset=utf-8" if link == "cmdline" => {
                assert!(!text.is_empty(), "{link}");
            }
            other => panic!("{link}: unexpected {other}"),
        }
    }
}

#[tokio::test]
async fn cpu_flamegraph_and_text_name_the_hot_function() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(20));
    let http = client();
    #[cfg(feature = "flamegraph")]
    {
        let svg = http
            .get(server.url("/debug/pprof/profile?seconds=1&format=svg"))
            .send()
            .await
            .unwrap();
        assert_eq!(svg.headers()["content-type"], "image/svg+xml");
        let svg = svg.text().await.unwrap();
        assert_valid_xml(&svg);
        assert!(
            svg.contains("krabka_hot_spin"),
            "the flamegraph names the hot function"
        );
    }

    let text = http
        .get(server.url("/debug/pprof/profile?seconds=1&format=text"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    drop(burner);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("Type: cpu"));
    let header = text
        .lines()
        .find(|l| l.contains("flat%"))
        .expect("a header row");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["flat", "flat%", "sum%", "cum", "cum%"]
    );
    let hot = text
        .lines()
        .find(|l| l.contains("krabka_hot_spin"))
        .expect("the hot row");
    // cum%: in a debug build the loop's iterator calls are functions of their own, so the
    // hot function's flat share is only part of the time spent under it.
    let cum_percent: f64 = hot
        .split_whitespace()
        .nth(4)
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap();
    assert!(cum_percent > 80.0, "{text}");
}

/// A build without `flamegraph` refuses `format=svg` with a 400 naming the feature, and
/// its index page offers no flamegraph.
#[cfg(not(feature = "flamegraph"))]
#[tokio::test]
async fn without_the_flamegraph_feature_svg_is_a_400_naming_it() {
    let server = TestServer::start(app);
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=1&format=svg"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let text = response.text().await.unwrap();
    assert!(
        text.contains("svg needs krabka-pprof's `flamegraph` feature"),
        "{text}"
    );
    let index = server.text("/debug/pprof/").await;
    assert!(!index.contains("format=svg"), "{index}");
}
