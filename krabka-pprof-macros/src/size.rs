//! Size literals (`"8MiB"`, `"512KiB"`, `"1GiB"`) to bytes, with messages that say how to
//! write a valid one; the twin of `duration.rs` for `recent_memory`. Pure functions, no
//! spans: `values.rs` attaches the span.
//!
//! The grammar: a whole number, an optional space, then one of `B`, `KiB`, `MiB`, `GiB`
//! (binary units, case as written here). Decimal units (`KB`, `MB`) are refused rather
//! than guessed at: `8MB` would be 7.6 MiB or 8 MiB depending on who reads it.

/// Each unit and its bytes.
const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
];

/// Parses a size literal into bytes.
///
/// The error is a sentence fragment that completes "`recent_memory` ..." in the caller's
/// message.
pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("is an empty string; write a size such as \"8MiB\" or \"512KiB\"".into());
    }
    let digits = trimmed.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = trimmed.split_at(digits);
    let unit = unit.strip_prefix(' ').unwrap_or(unit);
    if number.is_empty() || unit.starts_with(['.', ',']) {
        return Err(format!(
            "is not a size: write a whole number and a unit (B, KiB, MiB or GiB), such as \
             \"8MiB\" or \"1536KiB\", found {text:?}"
        ));
    }
    if unit.is_empty() {
        return Err(format!(
            "needs a unit: write \"{number}MiB\" for {number} MiB, or \"{number}B\" for bytes"
        ));
    }
    let Some((_, size)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!(
            "has an unknown unit {unit:?}; use B, KiB, MiB or GiB (binary units), as in \
             \"8MiB\" or \"512KiB\""
        ));
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(*size))
        .ok_or_else(|| "is too large to be a size; the largest allowed is \"1GiB\"".into())
}

/// Formats a size the way it is written in the attribute: the largest unit that divides
/// it exactly (`8MiB`, `1536KiB`, `1000B`).
pub(crate) fn format(bytes: u64) -> String {
    UNITS
        .iter()
        .rev()
        .find(|(_, size)| bytes >= *size && bytes.is_multiple_of(*size))
        .map_or_else(
            || format!("{bytes}B"),
            |(unit, size)| format!("{}{unit}", bytes / size),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("8MiB"), Ok(8 << 20));
        assert_eq!(parse("512KiB"), Ok(512 << 10));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert_eq!(parse("1000B"), Ok(1000));
        assert_eq!(parse(" 8 MiB "), Ok(8 << 20));
        assert_eq!(parse("0B"), Ok(0));
    }

    #[test]
    fn a_bare_number_asks_for_a_unit() {
        let err = parse("8").unwrap_err();
        assert!(err.contains("needs a unit"), "{err}");
        assert!(err.contains("\"8MiB\""), "{err}");
    }

    #[test]
    fn decimal_and_unknown_units_are_refused() {
        for text in ["8MB", "8mib", "8 kB", "8M", "8MiBs"] {
            let err = parse(text).unwrap_err();
            assert!(err.contains("unknown unit"), "{text}: {err}");
            assert!(err.contains("binary units"), "{text}: {err}");
        }
    }

    #[test]
    fn fractions_empty_and_garbage_are_refused() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("  ").unwrap_err().contains("empty"));
        for text in ["1.5MiB", "MiB", "-8MiB", "eight MiB", "8  MiB"] {
            let err = parse(text).unwrap_err();
            assert!(
                err.contains("not a size") || err.contains("unknown unit"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn overflow_is_refused() {
        let err = parse("99999999999999999999GiB").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        assert!(parse("17179869184GiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn format_round_trips() {
        for text in ["1000B", "1KiB", "1536KiB", "8MiB", "1GiB", "1025MiB"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
        assert_eq!(format(0), "0B");
    }
}
