//! Reading each kind of value the attribute takes: duration strings, size strings, integers, bools,
//! the blocklist array, the prefix, the guard path, `token_env` and the `crate` path. Each
//! reader names the token it found when it is of the wrong kind, and puts the span of the
//! literal on the message of the rule it breaks (`rules.rs`, which knows no spans).
//!
//! Readers know one value each, not the list around it: the key list and its examples are
//! `keys.rs`'s, the set-once rule and the rules between keys are `args.rs`'s.

use std::time::Duration;

use proc_macro2::Span;
use syn::spanned::Spanned as _;
use syn::{Expr, ExprLit, Lit, LitStr};

use crate::duration;
use crate::keys;
use crate::rules;
use crate::size;

/// A value together with the span of the tokens it came from, so that the expansion and
/// the rules between keys can point at what the user wrote.
#[derive(Clone, Debug)]
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// What kind of token the user wrote, for "found ..." in a wrong-kind message.
fn describe(expr: &Expr) -> &'static str {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => match lit {
            Lit::Str(_) => "a string",
            Lit::Int(_) => "an integer",
            Lit::Float(_) => "a float",
            Lit::Bool(_) => "a bool",
            _ => "a literal",
        },
        Expr::Array(_) => "an array",
        Expr::Path(_) => "a path",
        _ => "an expression",
    }
}

fn string_lit<'a>(key: &str, expr: &'a Expr, what: &str) -> syn::Result<&'a LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) if what == "duration" => Err(syn::Error::new(
            expr.span(),
            format!(
                "`{key}` takes a duration string, found an integer; write `{key} = \"{}s\"`",
                int.base10_digits()
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!(
                "`{key}` takes a {what} string such as {}, found {}",
                keys::example(key),
                describe(other)
            ),
        )),
    }
}

/// A `*_default`/`*_max` duration, within the bounds all of them share.
pub(crate) fn duration_value(key: &str, expr: &Expr) -> syn::Result<Spanned<Duration>> {
    checked_duration(key, expr, |value| rules::check_duration(key, value))
}

/// `recent`: a duration within the recorder's own bounds.
pub(crate) fn recent_value(expr: &Expr) -> syn::Result<Spanned<Duration>> {
    checked_duration("recent", expr, rules::check_recent)
}

/// `push_interval`: whole seconds that divide a minute, within the pusher's bounds.
pub(crate) fn push_interval_value(expr: &Expr) -> syn::Result<Spanned<Duration>> {
    checked_duration("push_interval", expr, rules::check_push_interval)
}

/// A duration string, parsed, then judged by `check`; every message on the literal.
fn checked_duration(
    key: &str,
    expr: &Expr,
    check: impl FnOnce(Duration) -> Result<(), String>,
) -> syn::Result<Spanned<Duration>> {
    let lit = string_lit(key, expr, "duration")?;
    let value = duration::parse(&lit.value())
        .map_err(|reason| syn::Error::new(lit.span(), format!("`{key}` {reason}")))?;
    check(value).map_err(|message| syn::Error::new(lit.span(), message))?;
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

/// `recent_memory`: a size string such as `"8MiB"`, within the recorder's bounds.
pub(crate) fn recent_memory_value(expr: &Expr) -> syn::Result<Spanned<u64>> {
    const KEY: &str = "recent_memory";
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = expr
    {
        return Err(syn::Error::new(
            int.span(),
            format!(
                "`{KEY}` takes a size string, found an integer; write `{KEY} = \"{}B\"` \
                 (or in KiB, MiB, GiB)",
                int.base10_digits()
            ),
        ));
    }
    let lit = string_lit(KEY, expr, "size")?;
    let value = size::parse(&lit.value())
        .map_err(|reason| syn::Error::new(lit.span(), format!("`{KEY}` {reason}")))?;
    rules::check_recent_memory(value).map_err(|message| syn::Error::new(lit.span(), message))?;
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

/// An integer key (`frequency`, `max_windows`): a plain decimal literal, checked by
/// `check` as written; `unit` and `example` shape the messages for other tokens.
pub(crate) fn integer_value(
    key: &str,
    unit: &str,
    example: u32,
    check: fn(&str) -> Result<u32, String>,
    expr: &Expr,
) -> syn::Result<Spanned<u32>> {
    let in_range =
        |found: &str| check(found).map_err(|message| syn::Error::new(expr.span(), message));
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            if !int.suffix().is_empty() {
                return Err(syn::Error::new(
                    int.span(),
                    format!(
                        "`{key}` takes a plain integer{unit}; drop the `{}` suffix",
                        int.suffix()
                    ),
                ));
            }
            Ok(Spanned {
                value: in_range(int.base10_digits())?,
                span: int.span(),
            })
        }
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr: inner,
            ..
        }) if matches!(
            &**inner,
            Expr::Lit(ExprLit {
                lit: Lit::Int(_),
                ..
            })
        ) =>
        {
            let Expr::Lit(ExprLit {
                lit: Lit::Int(int), ..
            }) = &**inner
            else {
                unreachable!()
            };
            // Checked as written, so the message shows the sign; it never passes.
            Ok(Spanned {
                value: in_range(&format!("-{}", int.base10_digits()))?,
                span: expr.span(),
            })
        }
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) => Err(syn::Error::new(
            text.span(),
            format!(
                "`{key}` takes an integer{unit}, found a string; write `{key} = {}`",
                text.value()
                    .trim_end_matches("Hz")
                    .trim_end_matches("hz")
                    .trim()
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!(
                "`{key}` takes an integer{unit} such as {example}, found {}",
                describe(other)
            ),
        )),
    }
}

pub(crate) fn blocklist_value(expr: &Expr) -> syn::Result<Spanned<Vec<String>>> {
    let Expr::Array(array) = expr else {
        return Err(syn::Error::new(
            expr.span(),
            format!(
                "`blocklist` takes an array of library names such as {}, found {}",
                keys::example("blocklist"),
                describe(expr)
            ),
        ));
    };
    let mut names = Vec::with_capacity(array.elems.len());
    // Every bad entry is reported, not only the first, as the attribute does for its keys;
    // combined here rather than in `args::Errors` so that this file imports nothing above it.
    let mut errors: Option<syn::Error> = None;
    for element in &array.elems {
        let error = match element {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) if rules::is_blank(&lit.value()) => syn::Error::new(
                lit.span(),
                "`blocklist` entries must be non-empty library names such as \"libc\"",
            ),
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => {
                names.push(lit.value());
                continue;
            }
            other => syn::Error::new(
                other.span(),
                format!(
                    "`blocklist` entries must be strings such as \"libc\", found {}",
                    describe(other)
                ),
            ),
        };
        match &mut errors {
            Some(first) => first.combine(error),
            None => errors = Some(error),
        }
    }
    if let Some(errors) = errors {
        return Err(errors);
    }
    Ok(Spanned {
        value: names,
        span: array.span(),
    })
}

pub(crate) fn bool_value(key: &str, expr: &Expr) -> syn::Result<Spanned<bool>> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => Ok(Spanned {
            value: lit.value,
            span: lit.span(),
        }),
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) if matches!(text.value().as_str(), "true" | "false") => Err(syn::Error::new(
            text.span(),
            format!(
                "`{key}` takes a bool, found a string; write `{key} = {}` without quotes",
                text.value()
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{key}` takes `true` or `false`, found {}", describe(other)),
        )),
    }
}

pub(crate) fn prefix_value(expr: &Expr) -> syn::Result<Spanned<String>> {
    let lit = string_lit("prefix", expr, "path")?;
    let value = lit.value();
    if let Some(problem) = rules::prefix_problem(&value) {
        return Err(syn::Error::new(lit.span(), problem));
    }
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

pub(crate) fn guard_value(expr: &Expr) -> syn::Result<Spanned<syn::Path>> {
    match expr {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => Ok(Spanned {
            value: path.path.clone(),
            span: path.span(),
        }),
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) => Err(syn::Error::new(
            text.span(),
            format!(
                "`guard` takes a path to a function, not a string; write `guard = {}`",
                text.value()
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!(
                "`guard` takes a path to a `fn(&axum::http::request::Parts) -> bool` such as {}, found {}",
                keys::example("guard"),
                describe(other)
            ),
        )),
    }
}

pub(crate) fn token_env_value(expr: &Expr) -> syn::Result<Spanned<String>> {
    let lit = string_lit("token_env", expr, "variable name")?;
    let value = lit.value();
    if !rules::is_env_name(&value) {
        let message = if value.is_empty() {
            "`token_env` must name an environment variable, found \"\"".to_owned()
        } else {
            format!(
                "`token_env` must be an environment variable name (letters, digits, `_`, not starting with a digit), found {value:?}"
            )
        };
        return Err(syn::Error::new(lit.span(), message));
    }
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

pub(crate) fn crate_value(expr: &Expr) -> syn::Result<Spanned<syn::Path>> {
    let lit = string_lit("crate", expr, "path")?;
    let path = lit.parse_with(syn::Path::parse_mod_style).map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!(
                "`crate` must be a path to krabka_pprof such as \"::krabka_pprof\" or \"my_dep::pprof\", found {:?}",
                lit.value()
            ),
        )
    })?;
    Ok(Spanned {
        value: path,
        span: lit.span(),
    })
}
