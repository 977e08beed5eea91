//! The attribute's `key = value` list: parsing with `syn::meta`, one set-once rule for
//! repeated keys, each value handed to its reader in `values.rs`, then the rules between
//! keys. All errors of one attribute are collected in [`Errors`] and reported together.
//!
//! What each key takes lives in `values.rs`, what keys exist in `keys.rs`, and the bounds
//! in `rules.rs`; this file only knows how a list of keys hangs together.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::Expr;
use syn::spanned::Spanned as _;

use crate::keys::{self, KEYS};
use crate::rules;
use crate::values::{self, Spanned};

/// The parsed attribute. `None` means "not written": the runtime default applies.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) cpu_default: Option<Spanned<Duration>>,
    pub(crate) cpu_max: Option<Spanned<Duration>>,
    pub(crate) frequency: Option<Spanned<u32>>,
    pub(crate) frequency_max: Option<Spanned<u32>>,
    pub(crate) max_windows: Option<Spanned<u32>>,
    pub(crate) blocklist: Option<Spanned<Vec<String>>>,
    pub(crate) heap: Option<Spanned<bool>>,
    pub(crate) heap_default: Option<Spanned<Duration>>,
    pub(crate) heap_max: Option<Spanned<Duration>>,
    pub(crate) alloc_stacks: Option<Spanned<u32>>,
    pub(crate) threads: Option<Spanned<bool>>,
    pub(crate) cmdline: Option<Spanned<bool>>,
    pub(crate) recent: Option<Spanned<Duration>>,
    /// Bytes.
    pub(crate) recent_memory: Option<Spanned<u64>>,
    pub(crate) push: Option<Spanned<bool>>,
    pub(crate) push_interval: Option<Spanned<Duration>>,
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
                _ if !KEYS.contains(&key.as_str()) => keys::unknown_key_message(&key),
                "heap" => "`heap` needs a value: write `heap = true`".to_owned(),
                known => format!(
                    "`{known}` needs a value: write `{known} = {}`",
                    keys::example(known)
                ),
            };
            // `key(...)` cannot be skipped reliably, so this error ends parsing.
            return Err(meta.error(message));
        }
        let value: Expr = meta.value()?.parse()?;
        if !KEYS.contains(&key.as_str()) {
            errors.at(key_span, keys::unknown_key_message(&key));
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
            "cpu_default" => self.cpu_default = Some(values::duration_value(key, &value)?),
            "cpu_max" => self.cpu_max = Some(values::duration_value(key, &value)?),
            "heap_default" => self.heap_default = Some(values::duration_value(key, &value)?),
            "heap_max" => self.heap_max = Some(values::duration_value(key, &value)?),
            "frequency" => {
                self.frequency = Some(values::integer_value(
                    key,
                    " in Hz",
                    99,
                    rules::check_frequency,
                    &value,
                )?);
            }
            "frequency_max" => {
                self.frequency_max = Some(values::integer_value(
                    key,
                    " in Hz",
                    250,
                    rules::check_frequency_max,
                    &value,
                )?);
            }
            "max_windows" => {
                self.max_windows = Some(values::integer_value(
                    key,
                    "",
                    8,
                    rules::check_max_windows,
                    &value,
                )?);
            }
            "alloc_stacks" => {
                self.alloc_stacks = Some(values::integer_value(
                    key,
                    "",
                    4096,
                    rules::check_alloc_stacks,
                    &value,
                )?);
            }
            "blocklist" => self.blocklist = Some(values::blocklist_value(&value)?),
            "heap" => self.heap = Some(values::bool_value(key, &value)?),
            "threads" => self.threads = Some(values::bool_value(key, &value)?),
            "cmdline" => self.cmdline = Some(values::bool_value(key, &value)?),
            "recent" => self.recent = Some(values::recent_value(&value)?),
            "recent_memory" => self.recent_memory = Some(values::recent_memory_value(&value)?),
            "push" => self.push = Some(values::bool_value(key, &value)?),
            "push_interval" => self.push_interval = Some(values::push_interval_value(&value)?),
            "prefix" => self.prefix = Some(values::prefix_value(&value)?),
            "guard" => self.guard = Some(values::guard_value(&value)?),
            "token_env" => self.token_env = Some(values::token_env_value(&value)?),
            "crate" => self.krate = Some(values::crate_value(&value)?),
            other => unreachable!("key `{other}` is listed in KEYS but has no parser"),
        }
        Ok(())
    }

    /// Rules between keys: defaults within their maximum, heap settings only with `heap`,
    /// the recorder's memory only with the recorder, pushing only with the recorder and
    /// its interval only with pushing.
    fn check_relations(&self, errors: &mut Errors) {
        default_within_max(
            errors,
            ("cpu_default", self.cpu_default.as_ref()),
            ("cpu_max", self.cpu_max.as_ref(), rules::DEFAULT_CPU_MAX),
        );

        if let Some(max) = &self.frequency_max {
            let (frequency, which) = match &self.frequency {
                Some(frequency) => (frequency.value, ""),
                None => (rules::DEFAULT_FREQUENCY, "default "),
            };
            if frequency > max.value {
                errors.at(
                    max.span,
                    format!(
                        "`frequency_max` must be at least `frequency` ({which}{frequency} Hz), \
                         found {}",
                        max.value
                    ),
                );
            }
        }

        let heap_on = self.heap.as_ref().is_some_and(|heap| heap.value);
        let alloc_stacks = self.alloc_stacks.as_ref().map(|stacks| stacks.span);
        for (key, span) in [
            ("heap_default", self.heap_default.as_ref().map(|d| d.span)),
            ("heap_max", self.heap_max.as_ref().map(|d| d.span)),
            ("alloc_stacks", alloc_stacks),
        ] {
            if let (Some(span), false) = (span, heap_on) {
                errors.at(
                    span,
                    format!("`{key}` only applies with `heap = true`; add `heap = true` or remove `{key}`"),
                );
            }
        }
        if heap_on {
            default_within_max(
                errors,
                ("heap_default", self.heap_default.as_ref()),
                ("heap_max", self.heap_max.as_ref(), rules::DEFAULT_HEAP_MAX),
            );
        }
        if let (Some(memory), None) = (&self.recent_memory, &self.recent) {
            errors.at(
                memory.span,
                "`recent_memory` bounds the recorder, which only runs with `recent`; add \
                 `recent = \"10m\"` or remove `recent_memory`",
            );
        }
        let push_on = self.push.as_ref().filter(|push| push.value);
        if let (Some(push), None) = (push_on, &self.recent) {
            errors.at(
                push.span,
                "`push` sends the recorder's history, which only runs with `recent`; add \
                 `recent = \"10m\"` or remove `push`",
            );
        }
        if let (Some(_), Some(recent)) = (push_on, &self.recent) {
            let interval = self
                .push_interval
                .as_ref()
                .map_or(rules::DEFAULT_PUSH_INTERVAL, |interval| interval.value);
            if let Err(message) = rules::check_recent_for_push(recent.value, interval) {
                errors.at(recent.span, message);
            }
        }
        if let (Some(interval), None) = (&self.push_interval, push_on) {
            errors.at(
                interval.span,
                "`push_interval` only applies with `push = true`; add `push = true` or remove \
                 `push_interval`",
            );
        }
    }
}

/// `rules::check_default_within_max` on a written default, its message put on the
/// default's literal: the maximum may be the built-in one, with no token to point at. An
/// unset default cannot break the rule.
fn default_within_max(
    errors: &mut Errors,
    (default_key, default): (&str, Option<&Spanned<Duration>>),
    (max_key, max, builtin_max): (&str, Option<&Spanned<Duration>>, Duration),
) {
    let Some(default) = default else {
        return;
    };
    let max = max.map(|max| max.value);
    if let Err(message) =
        rules::check_default_within_max((default_key, default.value), (max_key, max, builtin_max))
    {
        errors.at(default.span, message);
    }
}

fn path_to_string(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

// Named by path: the benchmark compiles this file in with `#[path]`, which would look for
// `tests.rs` beside it instead, and rustfmt follows the declaration even off `cfg(test)`.
#[cfg(test)]
#[path = "args/tests.rs"]
mod tests;
