//! The attribute's `key = value` list: parsing with `syn::meta`, one set-once rule for
//! repeated keys, and every value checked with the value's span against the rules in
//! `rules.rs`. All value errors of one attribute are collected and reported together.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned as _;
use syn::{Expr, ExprLit, Lit, LitStr};

use crate::duration;
use crate::rules;

/// Every key the attribute accepts, in the order the docs list them.
pub(crate) const KEYS: &[&str] = &[
    "cpu_default",
    "cpu_max",
    "frequency",
    "max_windows",
    "blocklist",
    "heap",
    "heap_default",
    "heap_max",
    "threads",
    "prefix",
    "guard",
    "token_env",
    "crate",
];

/// A value together with the span of the tokens it came from.
#[derive(Clone, Debug)]
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// The parsed attribute. `None` means "not written": the runtime default applies.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) cpu_default: Option<Spanned<Duration>>,
    pub(crate) cpu_max: Option<Spanned<Duration>>,
    pub(crate) frequency: Option<Spanned<u32>>,
    pub(crate) max_windows: Option<Spanned<u32>>,
    pub(crate) blocklist: Option<Spanned<Vec<String>>>,
    pub(crate) heap: Option<Spanned<bool>>,
    pub(crate) heap_default: Option<Spanned<Duration>>,
    pub(crate) heap_max: Option<Spanned<Duration>>,
    pub(crate) threads: Option<Spanned<bool>>,
    pub(crate) prefix: Option<Spanned<String>>,
    pub(crate) guard: Option<Spanned<syn::Path>>,
    pub(crate) token_env: Option<Spanned<String>>,
    pub(crate) krate: Option<Spanned<syn::Path>>,
}

/// Collects errors so that one attribute reports all of its mistakes at once.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    pub(crate) fn finish(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Parses and checks the attribute's arguments.
pub(crate) fn parse(attr: TokenStream) -> Result<Args, syn::Error> {
    let mut args = Args::default();
    let mut errors = Errors::default();
    // Keys seen so far, to point at the second of a repeated key even when the first
    // one's value was invalid.
    let mut seen: Vec<String> = Vec::new();

    let parser = syn::meta::parser(|meta| {
        let key = path_to_string(&meta.path);
        let key_span = meta.path.span();
        if !meta.input.peek(syn::Token![=]) {
            let message = match key.as_str() {
                _ if !KEYS.contains(&key.as_str()) => unknown_key_message(&key),
                "heap" => "`heap` needs a value: write `heap = true`".to_owned(),
                known => format!(
                    "`{known}` needs a value: write `{known} = {}`",
                    example(known)
                ),
            };
            // `key(...)` cannot be skipped reliably, so this error ends parsing.
            return Err(meta.error(message));
        }
        let value: Expr = meta.value()?.parse()?;
        if !KEYS.contains(&key.as_str()) {
            errors.at(key_span, unknown_key_message(&key));
            return Ok(());
        }
        if seen.contains(&key) {
            errors.at(
                key_span,
                format!("`{key}` is set more than once; keep one of them"),
            );
            return Ok(());
        }
        seen.push(key.clone());
        if let Err(error) = args.set(&key, value) {
            errors.push(error);
        }
        Ok(())
    });
    syn::parse::Parser::parse2(parser, attr)?;

    args.check_relations(&mut errors);
    errors.finish()?;
    Ok(args)
}

impl Args {
    fn set(&mut self, key: &str, value: Expr) -> syn::Result<()> {
        match key {
            "cpu_default" => self.cpu_default = Some(duration_value(key, &value)?),
            "cpu_max" => self.cpu_max = Some(duration_value(key, &value)?),
            "heap_default" => self.heap_default = Some(duration_value(key, &value)?),
            "heap_max" => self.heap_max = Some(duration_value(key, &value)?),
            "frequency" => {
                self.frequency = Some(integer_value(
                    key,
                    " in Hz",
                    99,
                    rules::check_frequency,
                    &value,
                )?);
            }
            "max_windows" => {
                self.max_windows =
                    Some(integer_value(key, "", 8, rules::check_max_windows, &value)?);
            }
            "blocklist" => self.blocklist = Some(blocklist_value(&value)?),
            "heap" => self.heap = Some(bool_value(key, &value)?),
            "threads" => self.threads = Some(bool_value(key, &value)?),
            "prefix" => self.prefix = Some(prefix_value(&value)?),
            "guard" => self.guard = Some(guard_value(&value)?),
            "token_env" => self.token_env = Some(token_env_value(&value)?),
            "crate" => self.krate = Some(crate_value(&value)?),
            other => unreachable!("key `{other}` is listed in KEYS but has no parser"),
        }
        Ok(())
    }

    /// Rules between keys: defaults within their maximum, heap settings only with `heap`.
    fn check_relations(&self, errors: &mut Errors) {
        if let Err(error) = rules::check_default_within_max(
            ("cpu_default", self.cpu_default.as_ref()),
            ("cpu_max", self.cpu_max.as_ref(), rules::DEFAULT_CPU_MAX),
        ) {
            errors.push(error);
        }

        let heap_on = self.heap.as_ref().is_some_and(|heap| heap.value);
        for (key, value) in [
            ("heap_default", self.heap_default.as_ref()),
            ("heap_max", self.heap_max.as_ref()),
        ] {
            if let (Some(value), false) = (value, heap_on) {
                errors.at(
                    value.span,
                    format!("`{key}` only applies with `heap = true`; add `heap = true` or remove `{key}`"),
                );
            }
        }
        if heap_on
            && let Err(error) = rules::check_default_within_max(
                ("heap_default", self.heap_default.as_ref()),
                ("heap_max", self.heap_max.as_ref(), rules::DEFAULT_HEAP_MAX),
            )
        {
            errors.push(error);
        }
    }
}

fn path_to_string(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

fn example(key: &str) -> &'static str {
    match key {
        "cpu_default" => "\"30s\"",
        "cpu_max" => "\"60s\"",
        "heap_default" => "\"10s\"",
        "heap_max" => "\"30s\"",
        "frequency" => "99",
        "max_windows" => "8",
        "threads" => "true",
        "blocklist" => "[\"libc\", \"libgcc\", \"pthread\", \"vdso\"]",
        "prefix" => "\"/debug/pprof\"",
        "guard" => "crate::auth::is_admin",
        "token_env" => "\"PPROF_TOKEN\"",
        "crate" => "\"::krabka_pprof\"",
        _ => "...",
    }
}

fn unknown_key_message(key: &str) -> String {
    let mut message = format!("unknown key `{key}`");
    if let Some(close) = closest_key(key) {
        message.push_str(&format!("; did you mean `{close}`?"));
    }
    message.push_str(&format!(" The keys are: {}", KEYS.join(", ")));
    message
}

/// The valid key within two edits of `key`, if any: catches `cpu_maxx`, `frequncy`.
fn closest_key(key: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

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
                example(key),
                describe(other)
            ),
        )),
    }
}

fn duration_value(key: &str, expr: &Expr) -> syn::Result<Spanned<Duration>> {
    let lit = string_lit(key, expr, "duration")?;
    let value = duration::parse(&lit.value())
        .map_err(|reason| syn::Error::new(lit.span(), format!("`{key}` {reason}")))?;
    rules::check_duration(key, value).map_err(|message| syn::Error::new(lit.span(), message))?;
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

/// An integer key (`frequency`, `max_windows`): a plain decimal literal, checked by
/// `check` as written; `unit` and `example` shape the messages for other tokens.
fn integer_value(
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

fn blocklist_value(expr: &Expr) -> syn::Result<Spanned<Vec<String>>> {
    let Expr::Array(array) = expr else {
        return Err(syn::Error::new(
            expr.span(),
            format!(
                "`blocklist` takes an array of library names such as {}, found {}",
                example("blocklist"),
                describe(expr)
            ),
        ));
    };
    let mut names = Vec::with_capacity(array.elems.len());
    let mut errors = Errors::default();
    for element in &array.elems {
        match element {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) if rules::is_blank(&lit.value()) => errors.at(
                lit.span(),
                "`blocklist` entries must be non-empty library names such as \"libc\"",
            ),
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => names.push(lit.value()),
            other => errors.at(
                other.span(),
                format!(
                    "`blocklist` entries must be strings such as \"libc\", found {}",
                    describe(other)
                ),
            ),
        }
    }
    errors.finish()?;
    Ok(Spanned {
        value: names,
        span: array.span(),
    })
}

fn bool_value(key: &str, expr: &Expr) -> syn::Result<Spanned<bool>> {
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

fn prefix_value(expr: &Expr) -> syn::Result<Spanned<String>> {
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

fn guard_value(expr: &Expr) -> syn::Result<Spanned<syn::Path>> {
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
                example("guard"),
                describe(other)
            ),
        )),
    }
}

fn token_env_value(expr: &Expr) -> syn::Result<Spanned<String>> {
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

fn crate_value(expr: &Expr) -> syn::Result<Spanned<syn::Path>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(tokens: TokenStream) -> Args {
        parse(tokens).unwrap_or_else(|err| panic!("unexpected error: {err}"))
    }

    fn messages(tokens: TokenStream) -> Vec<String> {
        match parse(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn empty_means_defaults() {
        let args = parse_ok(quote!());
        assert!(args.cpu_max.is_none() && args.frequency.is_none() && args.heap.is_none());
    }

    #[test]
    fn all_keys_parse() {
        let args = parse_ok(quote!(
            cpu_default = "10s",
            cpu_max = "2m",
            frequency = 250,
            blocklist = ["libc", "vdso"],
            heap = true,
            heap_default = "5s",
            heap_max = "1m",
            threads = false,
            prefix = "/internal/pprof",
            guard = crate::admin::allow,
            token_env = "PPROF_TOKEN",
            crate = "::other::krabka_pprof",
        ));
        assert_eq!(args.cpu_default.unwrap().value, Duration::from_secs(10));
        assert_eq!(args.cpu_max.unwrap().value, Duration::from_secs(120));
        assert_eq!(args.frequency.unwrap().value, 250);
        assert_eq!(args.blocklist.unwrap().value, ["libc", "vdso"]);
        assert!(args.heap.unwrap().value);
        assert_eq!(args.heap_default.unwrap().value, Duration::from_secs(5));
        assert_eq!(args.heap_max.unwrap().value, Duration::from_secs(60));
        assert!(!args.threads.unwrap().value);
        assert_eq!(args.prefix.unwrap().value, "/internal/pprof");
        assert_eq!(args.token_env.unwrap().value, "PPROF_TOKEN");
        let krate = args.krate.unwrap().value;
        assert_eq!(quote!(#krate).to_string(), ":: other :: krabka_pprof");
    }

    #[test]
    fn duration_bounds_on_both_sides() {
        parse_ok(quote!(cpu_max = "1s", cpu_default = "1s"));
        parse_ok(quote!(cpu_max = "1h"));
        let low = messages(quote!(cpu_max = "999ms"));
        assert_eq!(
            low,
            ["`cpu_max` must be between 1s and 1h, found 999ms"],
            "below the floor"
        );
        let high = messages(quote!(cpu_max = "1h 1s"));
        assert_eq!(high, ["`cpu_max` must be between 1s and 1h, found 1h 1s"]);
        assert!(messages(quote!(cpu_default = "500ms"))[0].contains("between 1s and 1h"));
        assert!(messages(quote!(heap = true, heap_max = "2h"))[0].contains("between 1s and 1h"));
    }

    #[test]
    fn default_must_not_exceed_max() {
        parse_ok(quote!(cpu_default = "60s", cpu_max = "60s"));
        let found = messages(quote!(cpu_default = "61s", cpu_max = "60s"));
        assert_eq!(
            found,
            ["`cpu_default` must not exceed `cpu_max` (1m), found 1m 1s"]
        );
        // Unset, the default follows a lower maximum.
        parse_ok(quote!(cpu_max = "10s"));
        let above_builtin = messages(quote!(cpu_default = "2m"));
        assert!(
            above_builtin[0].contains("raise `cpu_max` too"),
            "{above_builtin:?}"
        );
        parse_ok(quote!(heap = true, heap_default = "30s"));
        assert!(
            messages(quote!(heap = true, heap_default = "31s"))[0].contains("raise `heap_max`")
        );
        parse_ok(quote!(heap = true, heap_max = "5s"));
    }

    #[test]
    fn frequency_bounds_and_types() {
        parse_ok(quote!(frequency = 1));
        parse_ok(quote!(frequency = 1000));
        assert_eq!(
            messages(quote!(frequency = 0)),
            ["`frequency` must be between 1 and 1000 Hz, found 0"]
        );
        assert_eq!(
            messages(quote!(frequency = 1001)),
            ["`frequency` must be between 1 and 1000 Hz, found 1001"]
        );
        assert!(messages(quote!(frequency = -5))[0].contains("found -5"));
        assert!(
            messages(quote!(frequency = 99999999999999999999))[0].contains("between 1 and 1000")
        );
        assert!(messages(quote!(frequency = "99Hz"))[0].contains("write `frequency = 99`"));
        assert!(messages(quote!(frequency = 99u8))[0].contains("drop the `u8` suffix"));
    }

    #[test]
    fn max_windows_bounds_and_types() {
        assert_eq!(
            parse_ok(quote!(max_windows = 1)).max_windows.unwrap().value,
            1
        );
        assert_eq!(
            parse_ok(quote!(max_windows = 64))
                .max_windows
                .unwrap()
                .value,
            64
        );
        assert_eq!(
            messages(quote!(max_windows = 0)),
            ["`max_windows` must be between 1 and 64, found 0"]
        );
        assert_eq!(
            messages(quote!(max_windows = 65)),
            ["`max_windows` must be between 1 and 64, found 65"]
        );
        assert_eq!(
            messages(quote!(max_windows = "8")),
            ["`max_windows` takes an integer, found a string; write `max_windows = 8`"]
        );
        assert_eq!(
            messages(quote!(max_windows = 8usize)),
            ["`max_windows` takes a plain integer; drop the `usize` suffix"]
        );
        assert_eq!(
            messages(quote!(max_windows = true)),
            ["`max_windows` takes an integer such as 8, found a bool"]
        );
    }

    #[test]
    fn all_value_errors_are_reported_together() {
        let found = messages(quote!(cpu_max = "2h", frequency = 0, prefix = "pprof"));
        assert_eq!(found.len(), 3, "{found:?}");
    }

    #[test]
    fn unknown_key_suggests_and_lists() {
        let found = messages(quote!(cpu_maxx = "60s"));
        assert!(found[0].starts_with("unknown key `cpu_maxx`; did you mean `cpu_max`?"));
        assert!(found[0].contains("cpu_default, cpu_max, frequency"));
        let far = messages(quote!(verbose = true));
        assert!(!far[0].contains("did you mean"), "{far:?}");
    }

    #[test]
    fn repeated_key_is_an_error() {
        let found = messages(quote!(frequency = 99, frequency = 100));
        assert_eq!(
            found,
            ["`frequency` is set more than once; keep one of them"]
        );
    }

    #[test]
    fn key_without_value() {
        assert_eq!(
            messages(quote!(heap)),
            ["`heap` needs a value: write `heap = true`"]
        );
        // Every other key's message shows a value it takes.
        for (key, value) in [
            ("cpu_default", "\"30s\""),
            ("cpu_max", "\"60s\""),
            ("frequency", "99"),
            ("max_windows", "8"),
            ("blocklist", "[\"libc\", \"libgcc\", \"pthread\", \"vdso\"]"),
            ("heap_default", "\"10s\""),
            ("heap_max", "\"30s\""),
            ("threads", "true"),
            ("prefix", "\"/debug/pprof\""),
            ("guard", "crate::auth::is_admin"),
            ("token_env", "\"PPROF_TOKEN\""),
            ("crate", "\"::krabka_pprof\""),
        ] {
            let attr: TokenStream = key.parse().unwrap();
            assert_eq!(
                messages(attr),
                [format!("`{key}` needs a value: write `{key} = {value}`")]
            );
        }
        assert_eq!(KEYS.len(), 13, "a new key needs its example above");
        // An unknown key without a value is unknown first.
        assert!(
            messages(quote!(cpu_maxx))[0]
                .starts_with("unknown key `cpu_maxx`; did you mean `cpu_max`?")
        );
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_named() {
        // Each kind of token, named in the message.
        for (attr, found) in [
            (quote!(cpu_max = ["60s"]), "found an array"),
            (quote!(cpu_max = some::path), "found a path"),
            (quote!(cpu_max = -x), "found an expression"),
            (quote!(cpu_max = 1.5), "found a float"),
            (quote!(cpu_max = true), "found a bool"),
            (quote!(token_env = 5), "found an integer"),
            (quote!(heap = "yes"), "found a string"),
        ] {
            let found_in = messages(attr.clone());
            assert!(found_in[0].ends_with(found), "{attr}: {found_in:?}");
        }
        // An integer is read as seconds only where a duration is asked for.
        assert_eq!(
            messages(quote!(cpu_max = 60)),
            ["`cpu_max` takes a duration string, found an integer; write `cpu_max = \"60s\"`"]
        );
        assert_eq!(
            messages(quote!(prefix = 5)),
            ["`prefix` takes a path string such as \"/debug/pprof\", found an integer"]
        );
        // A negated non-literal is an expression, not a negative number.
        assert_eq!(
            messages(quote!(frequency = -x)),
            ["`frequency` takes an integer in Hz such as 99, found an expression"]
        );
        // Only "true" and "false" in quotes are taken for a quoted bool.
        assert_eq!(
            messages(quote!(heap = "true")),
            ["`heap` takes a bool, found a string; write `heap = true` without quotes"]
        );
        assert_eq!(
            messages(quote!(heap = "yes")),
            ["`heap` takes `true` or `false`, found a string"]
        );
        // A qualified path (`<T as Trait>::f`) is not a plain function path.
        assert!(
            messages(quote!(guard = <T as Trait>::admit))[0]
                .starts_with("`guard` takes a path to a `fn(&axum::http::request::Parts) -> bool`")
        );
    }

    #[test]
    fn suggestions_are_within_two_edits() {
        assert!(
            messages(quote!(cpu_maxxx = "1s"))[0].contains("did you mean `cpu_max`?"),
            "two extra letters"
        );
        assert!(
            !messages(quote!(cpu_maxxxx = "1s"))[0].contains("did you mean"),
            "three are too many"
        );
    }

    #[test]
    fn the_root_is_not_a_prefix() {
        assert_eq!(
            messages(quote!(prefix = "/")),
            ["`prefix` must name a path below the root such as \"/debug/pprof\", found \"/\""]
        );
    }

    #[test]
    fn threads_is_a_bool_like_heap() {
        assert!(parse_ok(quote!(threads = true)).threads.unwrap().value);
        assert!(!parse_ok(quote!(threads = false)).threads.unwrap().value);
        assert!(
            parse_ok(quote!()).threads.is_none(),
            "unset: the runtime's default"
        );
        // No feature needed and no keys tied to it: it parses with and without `heap`.
        parse_ok(quote!(heap = true, threads = false));
        assert_eq!(
            messages(quote!(threads = "false")),
            ["`threads` takes a bool, found a string; write `threads = false` without quotes"]
        );
        assert_eq!(
            messages(quote!(threads = 0)),
            ["`threads` takes `true` or `false`, found an integer"]
        );
        assert_eq!(
            messages(quote!(thread = false)),
            [format!(
                "unknown key `thread`; did you mean `threads`? The keys are: {}",
                KEYS.join(", ")
            )]
        );
    }

    #[test]
    fn heap_keys_need_heap() {
        let found = messages(quote!(heap_max = "20s"));
        assert!(found[0].contains("only applies with `heap = true`"));
        let off = messages(quote!(heap = false, heap_default = "5s"));
        assert!(off[0].contains("only applies with `heap = true`"));
    }

    #[test]
    fn blocklist_rules() {
        parse_ok(quote!(blocklist = []));
        assert!(messages(quote!(blocklist = ["libc", ""]))[0].contains("non-empty"));
        assert!(messages(quote!(blocklist = [libc]))[0].contains("must be strings"));
        assert!(messages(quote!(blocklist = "libc"))[0].contains("array"));
    }

    #[test]
    fn wrong_types_say_what_to_write() {
        assert!(messages(quote!(cpu_max = 60))[0].contains("write `cpu_max = \"60s\"`"));
        assert!(messages(quote!(heap = "true"))[0].contains("without quotes"));
        assert!(messages(quote!(guard = "auth::check"))[0].contains("not a string"));
        assert!(messages(quote!(crate = "not a path"))[0].contains("must be a path"));
    }

    #[test]
    fn edit_distance_is_levenshtein() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
