//! Character classes for the config's `const fn` rules: UTF-8 decoding and the
//! whitespace and control classes of `char`, which are not `const` on every Rust version
//! this crate supports. The macro's rules use the `char` methods; a test pins these to
//! them over every code point, so the two sides judge text alike.

/// The code point starting at byte `i` of `bytes` (valid UTF-8, from a `&str`), and its
/// length in bytes: `str::chars` for a `const fn`.
pub(super) const fn char_at(bytes: &[u8], i: usize) -> (u32, usize) {
    let first = bytes[i] as u32;
    let (mut c, len) = if first < 0x80 {
        (first, 1)
    } else if first < 0xe0 {
        (first & 0x1f, 2)
    } else if first < 0xf0 {
        (first & 0x0f, 3)
    } else {
        (first & 0x07, 4)
    };
    let mut k = 1;
    while k < len {
        c = (c << 6) | (bytes[i + k] as u32 & 0x3f);
        k += 1;
    }
    (c, len)
}

/// `char::is_whitespace` (Unicode's `White_Space`), for a `const fn` on every supported
/// Rust version: the macro's rules use the `char` method, and both must agree.
pub(super) const fn is_whitespace(c: u32) -> bool {
    matches!(
        c,
        0x09..=0x0d
            | 0x20
            | 0x85
            | 0xa0
            | 0x1680
            | 0x2000..=0x200a
            | 0x2028
            | 0x2029
            | 0x202f
            | 0x205f
            | 0x3000
    )
}

/// `char::is_control` (Unicode's `Cc`), for a `const fn`.
pub(super) const fn is_control(c: u32) -> bool {
    matches!(c, 0x00..=0x1f | 0x7f..=0x9f)
}

#[cfg(test)]
mod tests {
    use super::{char_at, is_control, is_whitespace};

    #[test]
    fn the_const_character_classes_are_the_char_methods() {
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let mut utf8 = [0u8; 4];
            let encoded = c.encode_utf8(&mut utf8).as_bytes();
            assert_eq!(char_at(encoded, 0), (u32::from(c), encoded.len()), "{c:?}");
            assert_eq!(is_whitespace(u32::from(c)), c.is_whitespace(), "{c:?}");
            assert_eq!(is_control(u32::from(c)), c.is_control(), "{c:?}");
        }
    }
}
