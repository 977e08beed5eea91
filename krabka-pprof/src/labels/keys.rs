//! What a user's labels become in a set: keys `go tool pprof -tagfocus key=value` can
//! name, none of the profiler's own keys, values of bounded size, a bounded number of
//! pairs. A key that had to change is reported once, at `warn`, naming what it became.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use super::table::LabelSet;

/// The keys the profiler writes itself: a user's key of that name gets `user.` before it.
pub(crate) const RESERVED: [&str; 5] = ["thread", "thread_id", "span_name", "span_id", "trace_id"];

/// The longest value kept, in bytes; longer ones are cut at a character boundary and end
/// with `…`.
pub(crate) const MAX_VALUE: usize = 1024;

/// The most pairs one set keeps (the first ones given).
pub(crate) const MAX_PAIRS: usize = 64;

/// The set of the user's `labels`, each key and value made what a set holds.
pub(crate) fn set_of(labels: &[(&str, &str)]) -> LabelSet {
    if labels.len() > MAX_PAIRS {
        warn_once(format!(
            "krabka_pprof::labels: a label set of {} pairs keeps its first {MAX_PAIRS}",
            labels.len()
        ));
    }
    LabelSet::of(
        labels
            .iter()
            .take(MAX_PAIRS)
            .map(|&(key, value)| (Arc::from(&*key_of(key)), Arc::from(&*value_of(value)))),
    )
}

/// `key`, made one `-tagfocus` can name: `[A-Za-z_][A-Za-z0-9_.]*`, not one of
/// [`RESERVED`].
pub(crate) fn key_of(key: &str) -> std::borrow::Cow<'_, str> {
    let valid = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    if valid && !RESERVED.contains(&key) {
        return key.into();
    }
    let mut fixed: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if fixed.is_empty() || fixed.starts_with(|c: char| c.is_ascii_digit()) {
        fixed.insert(0, '_');
    }
    if RESERVED.contains(&fixed.as_str()) {
        fixed.insert_str(0, "user.");
    }
    warn_once(format!(
        "krabka_pprof::labels: the label key {key:?} is written as {fixed:?} (keys are ASCII \
         letters, digits, `_` and `.`, not starting with a digit, and not one of the \
         profiler's own: {RESERVED:?})"
    ));
    fixed.into()
}

/// `value`, at most [`MAX_VALUE`] bytes.
pub(crate) fn value_of(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= MAX_VALUE {
        return value.into();
    }
    let mut end = MAX_VALUE - '…'.len_utf8();
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &value[..end]).into()
}

/// The warnings logged so far; at most [`MAX_WARNINGS`], so that a stream of odd keys
/// neither floods the log nor grows this set.
static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// The most distinct warnings logged.
const MAX_WARNINGS: usize = 64;

/// Logs `message` the first time it is seen (at most [`MAX_WARNINGS`] distinct ones).
fn warn_once(message: String) {
    let mut seen = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
    let seen = seen.get_or_insert_with(HashSet::new);
    if seen.len() < MAX_WARNINGS && seen.insert(message.clone()) {
        tracing::warn!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_what_tagfocus_can_name() {
        assert_eq!(key_of("tenant"), "tenant");
        assert_eq!(key_of("http.route"), "http.route");
        assert_eq!(key_of("a b=c"), "a_b_c");
        assert_eq!(
            key_of("a b.c_d"),
            "a_b.c_d",
            "`.` and `_` are kept in a key fixed"
        );
        assert_eq!(key_of("9lives"), "_9lives");
        assert_eq!(key_of(""), "_");
        assert_eq!(key_of("ключ"), "____");
        assert_eq!(key_of("thread"), "user.thread");
        assert_eq!(key_of("span_id"), "user.span_id");
    }

    #[test]
    fn values_are_kept_whole_up_to_the_limit_and_cut_at_a_character_after() {
        let quoted = "say \"hi\" = ok, ü";
        assert_eq!(value_of(quoted), quoted);
        let exact = "x".repeat(MAX_VALUE);
        assert_eq!(value_of(&exact), exact);
        let long = "é".repeat(MAX_VALUE);
        let cut = value_of(&long);
        assert!(cut.len() <= MAX_VALUE, "{}", cut.len());
        assert!(
            cut.len() > MAX_VALUE - 2 - '…'.len_utf8(),
            "cut at the last whole character that fits: {}",
            cut.len()
        );
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    /// Whether a warning containing `text` was logged.
    fn warned(text: &str) -> bool {
        let seen = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
        seen.as_ref()
            .is_some_and(|seen| seen.iter().any(|m| m.contains(text)))
    }

    #[test]
    fn a_key_that_changes_and_a_set_cut_short_are_each_warned_of_once() {
        assert_eq!(key_of("odd key!"), "odd_key_");
        assert!(warned(
            "the label key \"odd key!\" is written as \"odd_key_\""
        ));
        assert_eq!(key_of("fine_key"), "fine_key");
        assert!(!warned("\"fine_key\""), "a valid key is not warned of");
        let pairs: Vec<(String, String)> = (0..MAX_PAIRS)
            .map(|i| (format!("w{i:03}"), String::new()))
            .collect();
        let exactly: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
        set_of(&exactly);
        assert!(
            !warned(&format!("a label set of {MAX_PAIRS} pairs")),
            "a full set is whole"
        );
        let mut more = exactly.clone();
        more.push(("w999", ""));
        set_of(&more);
        assert!(warned(&format!(
            "a label set of {} pairs keeps its first {MAX_PAIRS}",
            MAX_PAIRS + 1
        )));
        // The log is bounded: past the cap, nothing more is kept.
        for i in 0..2 * MAX_WARNINGS {
            key_of(&format!("flood {i}"));
        }
        let kept = WARNED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, HashSet::len);
        assert_eq!(kept, MAX_WARNINGS);
    }

    #[test]
    fn a_set_keeps_its_first_pairs() {
        let many: Vec<(String, String)> = (0..MAX_PAIRS + 5)
            .map(|i| (format!("k{i:03}"), i.to_string()))
            .collect();
        let pairs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (&**k, &**v)).collect();
        let set = set_of(&pairs);
        assert_eq!(set.pairs().len(), MAX_PAIRS);
        assert_eq!(set.get("k000"), Some("0"));
        assert_eq!(set.get(&format!("k{:03}", MAX_PAIRS)), None);
    }
}
