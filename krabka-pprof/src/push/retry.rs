//! What a destination's answer means for the window sent, and how long to wait before
//! trying again: the OTLP exporter specification's retry rules (429, 502, 503, 504 and
//! failed connections are retried, honouring `Retry-After`; nothing else is, nor a
//! partial success), with Pyroscope's Connect codes that Grafana Alloy retries too
//! (`internal`, `unknown` as 500), and Alloy's backoff: 0.5 s doubling up to 5 min,
//! jittered. Pure, so each class is unit-tested.

use std::time::Duration;

use super::env::Protocol;
use super::proto::{ExportProfilesServiceResponse, Message};

/// The first wait after a failure.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two tries, and the longest `Retry-After` honoured.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What became of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Taken; `rejected` is what the destination said it kept back (an OTLP partial
    /// success), never sent again.
    Accepted { rejected: Option<String> },
    /// Not taken for now: the window is sent again after `after` (the server's
    /// `Retry-After`) or a backoff.
    Retry {
        after: Option<Duration>,
        why: String,
    },
    /// Refused: sending it again would be refused again. The window is dropped.
    Refused { why: String },
}

/// The outcome of an answer with `status`, its `Retry-After` header and (the start of)
/// its body.
pub(crate) fn judge(
    protocol: Protocol,
    status: u16,
    retry_after: Option<&str>,
    body: &[u8],
) -> Outcome {
    if (200..300).contains(&status) {
        let rejected = match protocol {
            Protocol::Otlp => ExportProfilesServiceResponse::decode(body)
                .ok()
                .and_then(|response| response.partial_success)
                .filter(|partial| {
                    partial.rejected_profiles > 0 || !partial.error_message.is_empty()
                })
                .map(|partial| {
                    format!(
                        "{} profile(s) rejected: {}",
                        partial.rejected_profiles, partial.error_message
                    )
                }),
            Protocol::Pyroscope => None,
        };
        return Outcome::Accepted { rejected };
    }
    let said = sentence(body);
    let why = if said.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {said}")
    };
    let retried = matches!(status, 429 | 502 | 503 | 504)
        || (protocol == Protocol::Pyroscope && status == 500);
    if retried {
        Outcome::Retry {
            after: retry_after.and_then(seconds),
            why,
        }
    } else {
        Outcome::Refused { why }
    }
}

/// What a body says, as one line of at most 300 characters: a Connect error's `message`
/// where the body is one, else its text.
fn sentence(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let message = text
        .split_once("\"message\":\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or(text, |(message, _)| message);
    let line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect();
    line
}

/// `Retry-After` in seconds (the form Collectors and Pyroscope send), at most
/// [`MAX_BACKOFF`]; an HTTP date is not read (the backoff applies).
fn seconds(value: &str) -> Option<Duration> {
    let seconds: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_BACKOFF))
}

/// The wait before try `failures + 1`: [`FIRST_BACKOFF`] doubling per failure up to
/// [`MAX_BACKOFF`], of which the upper half is drawn by `jitter` (0 ..= 1), so that
/// instances that failed together do not come back together.
pub(crate) fn backoff(failures: u32, jitter: f64) -> Duration {
    let ceiling = FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(20))
        .min(MAX_BACKOFF);
    ceiling / 2 + ceiling.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::proto::ExportProfilesPartialSuccess;

    #[test]
    fn success_is_accepted_and_a_partial_success_says_what_was_rejected() {
        assert_eq!(
            judge(Protocol::Pyroscope, 200, None, b"{}"),
            Outcome::Accepted { rejected: None }
        );
        assert_eq!(
            judge(Protocol::Otlp, 200, None, b""),
            Outcome::Accepted { rejected: None }
        );
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 1,
                error_message: "too old".into(),
            }),
        }
        .encode_to_vec();
        assert_eq!(
            judge(Protocol::Otlp, 200, None, &partial),
            Outcome::Accepted {
                rejected: Some("1 profile(s) rejected: too old".into())
            }
        );
    }

    #[test]
    fn overload_and_unavailable_are_retried_honouring_retry_after() {
        for status in [429, 502, 503, 504] {
            for protocol in [Protocol::Otlp, Protocol::Pyroscope] {
                assert!(
                    matches!(
                        judge(protocol, status, None, b""),
                        Outcome::Retry { after: None, .. }
                    ),
                    "{status}"
                );
            }
        }
        assert_eq!(
            judge(Protocol::Otlp, 503, Some("2"), b"busy"),
            Outcome::Retry {
                after: Some(Duration::from_secs(2)),
                why: "HTTP 503: busy".into()
            }
        );
        assert!(matches!(
            judge(Protocol::Otlp, 503, Some("99999"), b""),
            Outcome::Retry {
                after: Some(MAX_BACKOFF),
                ..
            }
        ));
        assert!(matches!(
            judge(
                Protocol::Otlp,
                503,
                Some("Wed, 21 Oct 2026 07:28:00 GMT"),
                b""
            ),
            Outcome::Retry { after: None, .. }
        ));
        // Connect's `internal` and `unknown` from Pyroscope, not from a Collector.
        assert!(matches!(
            judge(Protocol::Pyroscope, 500, None, b""),
            Outcome::Retry { .. }
        ));
        assert!(matches!(
            judge(Protocol::Otlp, 500, None, b""),
            Outcome::Refused { .. }
        ));
    }

    #[test]
    fn other_client_errors_are_refused_with_the_servers_sentence() {
        for status in [400, 401, 403, 404, 413, 415, 422] {
            assert!(
                matches!(
                    judge(Protocol::Otlp, status, Some("1"), b""),
                    Outcome::Refused { .. }
                ),
                "{status}"
            );
        }
        assert_eq!(
            judge(
                Protocol::Pyroscope,
                400,
                None,
                br#"{"code":"invalid_argument","message":"service_name is missing"}"#
            ),
            Outcome::Refused {
                why: "HTTP 400: service_name is missing".into()
            }
        );
        assert_eq!(
            judge(Protocol::Otlp, 400, None, b"bad\nbody\n"),
            Outcome::Refused {
                why: "HTTP 400: bad body".into()
            }
        );
    }

    #[test]
    fn backoff_doubles_from_half_a_second_to_five_minutes_jittered_in_its_upper_half() {
        assert_eq!(backoff(1, 1.0), Duration::from_millis(500));
        assert_eq!(backoff(1, 0.0), Duration::from_millis(250));
        assert_eq!(backoff(2, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(4, 1.0), Duration::from_secs(4));
        assert_eq!(backoff(30, 1.0), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX, 0.0), MAX_BACKOFF / 2);
    }
}
