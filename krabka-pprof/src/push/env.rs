//! Where profiles go, read from the standard environment variables so that one binary
//! runs anywhere: OpenTelemetry's (`OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, as the OTLP exporter specification defines them) and
//! Pyroscope's agents' (`PYROSCOPE_SERVER_ADDRESS`, `PYROSCOPE_BASIC_AUTH_USER`,
//! `PYROSCOPE_BASIC_AUTH_PASSWORD`, `PYROSCOPE_TENANT_ID`, `PYROSCOPE_APPLICATION_NAME`,
//! `PYROSCOPE_LABELS`). Pure: the variables come through a lookup, so every rule is
//! unit-tested without touching the process's environment.

/// The path OTLP profiles are posted to under `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub(crate) const OTLP_PATH: &str = "v1development/profiles";
/// The path of Pyroscope's push API under `PYROSCOPE_SERVER_ADDRESS`.
pub(crate) const PYROSCOPE_PATH: &str = "push.v1.PusherService/Push";

/// Which protocol a destination speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// OTLP profiles over HTTP (`application/x-protobuf`).
    Otlp,
    /// Pyroscope's `push.v1.PusherService/Push` (Connect, `application/proto`).
    Pyroscope,
}

impl Protocol {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Protocol::Otlp => "otlp",
            Protocol::Pyroscope => "pyroscope",
        }
    }
}

/// One destination, ready to be posted to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Destination {
    pub(crate) protocol: Protocol,
    /// The whole URL requests are posted to.
    pub(crate) url: String,
    /// Extra headers (authorization, tenant), sent with every request; never logged.
    pub(crate) headers: Vec<(String, String)>,
    /// Basic authentication's user and password; never logged.
    pub(crate) basic_auth: Option<(String, String)>,
    /// Pyroscope's series labels beyond `__name__` and `service_name`.
    pub(crate) labels: Vec<(String, String)>,
    /// `service_name` (Pyroscope) or `service.name` (OTLP).
    pub(crate) service_name: String,
    /// OTLP's resource attributes from `OTEL_RESOURCE_ATTRIBUTES`, without
    /// `service.name`.
    pub(crate) resource: Vec<(String, String)>,
}

/// What the environment says: the destinations it names, and a sentence for each
/// variable that names one wrongly (that destination is left out).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Destinations {
    pub(crate) ready: Vec<Destination>,
    pub(crate) refused: Vec<String>,
}

/// The destinations `var` (an environment lookup) names; `executable` names the service
/// when no variable does.
pub(crate) fn destinations(var: &dyn Fn(&str) -> Option<String>, executable: &str) -> Destinations {
    let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
    let mut found = Destinations::default();
    let resource_all = set("OTEL_RESOURCE_ATTRIBUTES")
        .map(|text| pairs(&text, true))
        .unwrap_or_default();
    let resource_name = resource_all
        .iter()
        .find(|(key, _)| key == "service.name")
        .map(|(_, value)| value.clone());
    let resource: Vec<(String, String)> = resource_all
        .into_iter()
        .filter(|(key, _)| key != "service.name")
        .collect();
    let otel_name = set("OTEL_SERVICE_NAME")
        .or(resource_name)
        .unwrap_or_else(|| format!("unknown_service:{executable}"));

    let otlp = match (
        set("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"),
        set("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        // The signal's own variable is the whole URL, used as it is (the specification).
        (Some(url), _) => Some(("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", url)),
        (None, Some(base)) => Some(("OTEL_EXPORTER_OTLP_ENDPOINT", joined(&base, OTLP_PATH))),
        (None, None) => None,
    };
    if let Some((variable, url)) = otlp {
        match check_url(&url) {
            Ok(url) => found.ready.push(Destination {
                protocol: Protocol::Otlp,
                url,
                headers: set("OTEL_EXPORTER_OTLP_PROFILES_HEADERS")
                    .or_else(|| set("OTEL_EXPORTER_OTLP_HEADERS"))
                    .map(|text| pairs(&text, true))
                    .unwrap_or_default(),
                basic_auth: None,
                labels: Vec::new(),
                service_name: otel_name.clone(),
                resource: resource.clone(),
            }),
            Err(why) => found.refused.push(format!("{variable}: {why}")),
        }
    }

    if let Some(base) = set("PYROSCOPE_SERVER_ADDRESS") {
        match check_url(&joined(&base, PYROSCOPE_PATH)) {
            Ok(url) => {
                let mut headers = Vec::new();
                if let Some(tenant) = set("PYROSCOPE_TENANT_ID") {
                    headers.push(("x-scope-orgid".to_owned(), tenant));
                }
                found.ready.push(Destination {
                    protocol: Protocol::Pyroscope,
                    url,
                    headers,
                    basic_auth: set("PYROSCOPE_BASIC_AUTH_USER").map(|user| {
                        (
                            user,
                            var("PYROSCOPE_BASIC_AUTH_PASSWORD").unwrap_or_default(),
                        )
                    }),
                    labels: set("PYROSCOPE_LABELS")
                        .map(|text| pairs(&text, false))
                        .unwrap_or_default(),
                    service_name: set("PYROSCOPE_APPLICATION_NAME").unwrap_or(otel_name),
                    resource: Vec::new(),
                });
            }
            Err(why) => found
                .refused
                .push(format!("PYROSCOPE_SERVER_ADDRESS: {why}")),
        }
    }
    found
}

/// `base` with `path` after it, one `/` between.
fn joined(base: &str, path: &str) -> String {
    format!("{}/{path}", base.trim().trim_end_matches('/'))
}

/// `url` if it is one this pusher can post to (`http://host[:port]/path`), else why not.
fn check_url(url: &str) -> Result<String, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{url:?} is not a URL: write it as http://host:port (for a Collector, \
             http://localhost:4318)"
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "http" => {}
        "https" => {
            return Err(format!(
                "{url:?} needs TLS, which this build of krabka-pprof does not have: push over \
                 http to a Collector or Grafana Alloy beside the service, which forwards over \
                 https"
            ));
        }
        other => {
            return Err(format!(
                "{url:?} has the scheme {other:?}: only http:// is pushed to"
            ));
        }
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return Err(format!(
            "{url:?} names no host: write it as http://host:port"
        ));
    }
    if authority.contains('@') {
        return Err(format!(
            "{url:?} carries credentials in the URL: give them in the headers' variable \
             instead"
        ));
    }
    Ok(url.trim().to_owned())
}

/// `k=v,k2=v2` as the OpenTelemetry variables write it (W3C Baggage's format, values
/// percent-encoded where `decode`), entries without `=` or with an empty key left out.
fn pairs(text: &str, decode: bool) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|entry| {
            let (key, value) = entry.split_once('=')?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return None;
            }
            let value = if decode {
                form_urlencoded::parse(format!("v={}", value.replace('+', "%2B")).as_bytes())
                    .next()
                    .map_or_else(String::new, |(_, v)| v.into_owned())
            } else {
                value.to_owned()
            };
            Some((key.to_owned(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Destinations {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        destinations(
            &move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            "app",
        )
    }

    #[test]
    fn nothing_set_names_no_destination() {
        assert_eq!(with(&[]), Destinations::default());
        assert_eq!(
            with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]),
            Destinations::default()
        );
    }

    #[test]
    fn the_otlp_endpoint_gets_the_profiles_path_and_the_signals_own_is_used_as_it_is() {
        let base = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]);
        assert_eq!(
            base.ready[0].url,
            "http://collector:4318/v1development/profiles"
        );
        assert_eq!(base.ready[0].protocol, Protocol::Otlp);
        let own = with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                "http://c:4318/custom",
            ),
        ]);
        assert_eq!(own.ready[0].url, "http://c:4318/custom");
    }

    #[test]
    fn service_name_resource_attributes_and_headers_come_from_the_otel_variables() {
        let found = with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=from-attrs,env=prod%2Ceu, region = eu-1",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%3Dcret,x=1"),
        ]);
        let otlp = &found.ready[0];
        assert_eq!(otlp.service_name, "from-attrs");
        assert_eq!(
            otlp.resource,
            [
                ("env".into(), "prod,eu".into()),
                ("region".into(), "eu-1".into())
            ]
        );
        assert_eq!(
            otlp.headers,
            [
                ("api-key".into(), "s=cret".into()),
                ("x".into(), "1".into())
            ]
        );
        let named = with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SERVICE_NAME", "checkout"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs"),
        ]);
        assert_eq!(named.ready[0].service_name, "checkout", "the variable wins");
        let unnamed = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]);
        assert_eq!(unnamed.ready[0].service_name, "unknown_service:app");
    }

    #[test]
    fn pyroscope_gets_its_path_auth_tenant_and_labels() {
        let found = with(&[
            ("PYROSCOPE_SERVER_ADDRESS", "http://pyroscope:4040/prefix"),
            ("PYROSCOPE_BASIC_AUTH_USER", "user"),
            ("PYROSCOPE_BASIC_AUTH_PASSWORD", "pass"),
            ("PYROSCOPE_TENANT_ID", "team-a"),
            ("PYROSCOPE_LABELS", "env=prod,zone=b"),
            ("OTEL_SERVICE_NAME", "checkout"),
        ]);
        let pyroscope = &found.ready[0];
        assert_eq!(pyroscope.protocol, Protocol::Pyroscope);
        assert_eq!(
            pyroscope.url,
            "http://pyroscope:4040/prefix/push.v1.PusherService/Push"
        );
        assert_eq!(
            pyroscope.headers,
            [("x-scope-orgid".into(), "team-a".into())]
        );
        assert_eq!(pyroscope.basic_auth, Some(("user".into(), "pass".into())));
        assert_eq!(
            pyroscope.labels,
            [("env".into(), "prod".into()), ("zone".into(), "b".into())]
        );
        assert_eq!(pyroscope.service_name, "checkout");
        let named = with(&[
            ("PYROSCOPE_SERVER_ADDRESS", "http://p:4040"),
            ("PYROSCOPE_APPLICATION_NAME", "own"),
            ("OTEL_SERVICE_NAME", "checkout"),
        ]);
        assert_eq!(named.ready[0].service_name, "own");
    }

    #[test]
    fn a_bad_url_is_refused_with_a_sentence_and_the_other_destination_stays() {
        let found = with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
            ("PYROSCOPE_SERVER_ADDRESS", "http://p:4040"),
        ]);
        assert_eq!(found.ready.len(), 1);
        assert_eq!(found.ready[0].protocol, Protocol::Pyroscope);
        assert!(
            found.refused[0].starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: \"collector:4318/"),
            "{:?}",
            found.refused
        );
        assert!(found.refused[0].contains("http://host:port"));
        for (url, says) in [
            ("https://c:4318", "needs TLS"),
            ("ftp://c", "only http://"),
            ("http:///path", "names no host"),
            ("http://user:pw@c:4318", "credentials"),
        ] {
            let found = with(&[("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", url)]);
            assert!(found.ready.is_empty(), "{url}");
            assert!(
                found.refused[0].contains(says),
                "{url}: {:?}",
                found.refused
            );
        }
    }
}
