//! Access control: who may use the routes, decided before any profiler work and before
//! the query is read. The bearer token (read from its variable once, at startup, failing
//! closed when it is missing) comes first, then the user's guard.

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::response::error;
use crate::config::{Guard, ProfilingConfig};

/// Who may use the routes: decided before any profiler work and before the query is read.
pub(super) struct Access {
    guard: Option<Guard>,
    token: Token,
}

enum Token {
    /// No `token_env`.
    NotRequired,
    /// `token_env` names a variable that was unset or empty at startup: fail closed.
    Locked(&'static str),
    Required {
        variable: &'static str,
        value: Box<[u8]>,
    },
}

impl Access {
    /// Reads the token variable now, when the router is built (at startup).
    pub(super) fn from_config(config: &ProfilingConfig) -> Access {
        let token = match config.token_env() {
            None => Token::NotRequired,
            Some(variable) => match std::env::var_os(variable) {
                Some(value) if !value.is_empty() => Token::Required {
                    variable,
                    value: value.into_encoded_bytes().into_boxed_slice(),
                },
                _ => {
                    tracing::warn!(
                        variable,
                        "the profiling routes are locked: their token variable is unset or empty"
                    );
                    Token::Locked(variable)
                }
            },
        };
        Access {
            guard: config.guard(),
            token,
        }
    }

    /// The refusal to send, if any, logged without the token. A token set at run time
    /// (`krabka_pprof::set_profiling_token`) replaces the variable's value.
    pub(super) fn refusal(&self, parts: &Parts) -> Option<Response> {
        let rotated = match &self.token {
            Token::NotRequired => None,
            Token::Locked(variable) | Token::Required { variable, .. } => {
                crate::switch::token().map(|value| (*variable, value))
            }
        };
        let rotated = rotated.as_ref().map(|(variable, value)| {
            if value.is_empty() {
                Token::Locked(variable)
            } else {
                Token::Required {
                    variable,
                    value: Box::from(&value[..]),
                }
            }
        });
        match rotated.as_ref().unwrap_or(&self.token) {
            Token::NotRequired => {}
            Token::Locked(variable) => {
                tracing::warn!(outcome = "locked", "refused: the token variable is unset");
                return Some(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "profiling is locked: {variable} was unset or empty when the service \
                         started (or the token set since, with set_profiling_token, is \
                         empty); set it to a secret token and restart the service, or set one \
                         with krabka_pprof::set_profiling_token"
                    ),
                ));
            }
            Token::Required { variable, value } => {
                if !bearer_matches(&parts.headers, value) {
                    tracing::warn!(
                        outcome = "unauthorized",
                        "refused: missing or wrong bearer token"
                    );
                    let mut response = error(
                        StatusCode::UNAUTHORIZED,
                        &format!(
                            "send `Authorization: Bearer <token>` with the token from the \
                             service's {variable} environment variable"
                        ),
                    );
                    response.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Bearer realm=\"pprof\""),
                    );
                    return Some(response);
                }
            }
        }
        if let Some(guard) = self.guard
            && !guard(parts)
        {
            tracing::warn!(outcome = "forbidden", "refused by the guard");
            return Some(error(
                StatusCode::FORBIDDEN,
                "the service's guard refused this request; ask its operators for access",
            ));
        }
        None
    }
}

/// `Authorization: Bearer <token>`, compared in constant time.
fn bearer_matches(headers: &HeaderMap, expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(scheme) = value.get(..7) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return false;
    }
    let presented = value[7..].trim_ascii();
    // Different lengths are unequal at once; equal lengths take the same time whatever
    // the bytes.
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            headers
        };
        assert!(bearer_matches(&with("Bearer s3cret"), b"s3cret"));
        assert!(bearer_matches(&with("bearer s3cret"), b"s3cret"));
        assert!(bearer_matches(&with("Bearer  s3cret "), b"s3cret"));
        assert!(!bearer_matches(&with("Bearer s3cre"), b"s3cret"));
        assert!(!bearer_matches(&with("Bearer s3cretX"), b"s3cret"));
        assert!(!bearer_matches(&with("Basic s3cret"), b"s3cret"));
        assert!(!bearer_matches(&with("Bearer"), b"s3cret"));
        assert!(!bearer_matches(&HeaderMap::new(), b"s3cret"));
    }
}
