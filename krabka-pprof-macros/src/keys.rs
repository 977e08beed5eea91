//! The keys the attribute knows: their list in the docs' order, an example value for each
//! (shown when a key has no value or one of the wrong kind), and the message for a key it
//! does not know, with the closest known key when a typo is likely. Pure text, no syntax:
//! `args.rs` and `values.rs` put these messages on the user's tokens.

/// Every key the attribute accepts, in the order the docs list them.
pub(crate) const KEYS: &[&str] = &[
    "cpu_default",
    "cpu_max",
    "frequency",
    "frequency_max",
    "max_windows",
    "blocklist",
    "heap",
    "heap_default",
    "heap_max",
    "alloc_stacks",
    "threads",
    "cmdline",
    "recent",
    "recent_memory",
    "push",
    "push_interval",
    "prefix",
    "guard",
    "token_env",
    "crate",
];

/// A value `key` takes, written as the user would write it.
pub(crate) fn example(key: &str) -> &'static str {
    match key {
        "cpu_default" => "\"30s\"",
        "cpu_max" => "\"60s\"",
        "heap_default" => "\"10s\"",
        "heap_max" => "\"30s\"",
        "frequency" => "99",
        "frequency_max" => "250",
        "max_windows" => "8",
        "alloc_stacks" => "4096",
        "threads" => "true",
        "cmdline" => "true",
        "recent" => "\"10m\"",
        "recent_memory" => "\"8MiB\"",
        "push" => "true",
        "push_interval" => "\"15s\"",
        "blocklist" => "[\"libc\", \"libgcc\", \"pthread\", \"vdso\"]",
        "prefix" => "\"/debug/pprof\"",
        "guard" => "crate::auth::is_admin",
        "token_env" => "\"PPROF_TOKEN\"",
        "crate" => "\"::krabka_pprof\"",
        _ => "...",
    }
}

/// The error for a key not in [`KEYS`]: the closest one if any, then the whole list.
pub(crate) fn unknown_key_message(key: &str) -> String {
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

/// Levenshtein distance: insertions, deletions and substitutions of one char each.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_is_levenshtein() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
