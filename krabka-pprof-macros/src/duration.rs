//! Duration literals (`"30s"`, `"1m 30s"`, `"500ms"`) to [`Duration`], with messages that
//! say how to write a valid one. Pure functions, no spans: `values.rs` attaches the span.

use std::time::Duration;

/// Parses a humantime duration literal.
///
/// The error is a sentence fragment that completes "`cpu_max` ..." in the caller's message.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("is an empty string; write a duration such as \"30s\" or \"1m 30s\"".into());
    }
    humantime::parse_duration(trimmed).map_err(|err| match err {
        humantime::DurationError::UnknownUnit { unit, value, .. } if unit.is_empty() => {
            format!("needs a unit: write \"{value}s\" for {value} seconds")
        }
        humantime::DurationError::UnknownUnit { unit, .. } => format!(
            "has an unknown unit {unit:?}; use ms, s, m or h, as in \"500ms\", \"90s\", \"1m 30s\", \"2h\""
        ),
        humantime::DurationError::NumberOverflow => {
            "is too large to be a duration; the longest allowed is \"1h\"".into()
        }
        other => format!(
            "is not a duration ({other}); write it as \"500ms\", \"90s\", \"1m 30s\" or \"2h\""
        ),
    })
}

/// Formats a duration the way it is written in the attribute (`1m 30s`, `500ms`).
pub(crate) fn format(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse(" 30s "), Ok(Duration::from_secs(30)));
    }

    #[test]
    fn a_bare_number_asks_for_a_unit() {
        let err = parse("60").unwrap_err();
        assert!(err.contains("needs a unit"), "{err}");
        assert!(err.contains("\"60s\""), "{err}");
    }

    #[test]
    fn an_unknown_unit_lists_the_usual_ones() {
        let err = parse("3 fortnights").unwrap_err();
        assert!(err.contains("unknown unit \"fortnights\""), "{err}");
        assert!(err.contains("\"90s\""), "{err}");
    }

    #[test]
    fn empty_and_garbage_are_rejected() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("   ").unwrap_err().contains("empty"));
        assert!(parse("ten seconds").unwrap_err().contains("not a duration"));
        assert!(parse("-5s").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn overflow_is_rejected() {
        let err = parse("99999999999999999999999s").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn format_round_trips() {
        for text in ["500ms", "1s", "1m 30s", "1h", "30s"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
