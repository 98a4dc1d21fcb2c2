//! The values that hold no other: strings (and their escapes), numbers and the three literals,
//! each read where it starts and checked as the mode asks; and the white space between values.

use super::{ErrorKind, JsonError};

/// A number whose decimal magnitude may reach this power of ten is given to serde_json to decide
/// whether it overflows a double; every smaller one is a finite double.
const SURE_FINITE_DIGITS: i64 = 300;

pub(super) fn skip_space(b: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(at) {
        at += 1;
    }
    at
}

/// The value at `at` that is not a container (its first byte is `first`): where it ends.
pub(super) fn scalar(text: &str, at: usize, first: u8, strict: bool) -> Result<usize, JsonError> {
    let b = text.as_bytes();
    match first {
        b'"' => Ok(string(b, at, strict)?.0),
        b'-' | b'0'..=b'9' => number(text, at, strict),
        b't' => literal(b, at, b"true"),
        b'f' => literal(b, at, b"false"),
        b'n' => literal(b, at, b"null"),
        _ => Err(JsonError::new(ErrorKind::ExpectedValue, at)),
    }
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Result<usize, JsonError> {
    let end = at + word.len();
    match b.get(at..end) {
        Some(got) if got == word => Ok(end),
        _ => {
            let kind = if b.len() < end && b[at..].iter().zip(word).all(|(x, y)| x == y) {
                ErrorKind::Eof
            } else {
                ErrorKind::ExpectedValue
            };
            Err(JsonError::new(kind, at))
        }
    }
}

/// The string at `at` (its opening quote): where it ends (past the closing quote) and whether it
/// holds an escape. Strict refuses a `\u` escape that is half of a surrogate pair.
pub(super) fn string(b: &[u8], at: usize, strict: bool) -> Result<(usize, bool), JsonError> {
    let mut i = at + 1;
    let mut escaped = false;
    loop {
        i = plain_run(b, i);
        match b.get(i) {
            None => return Err(JsonError::new(ErrorKind::Eof, i)),
            Some(b'"') => return Ok((i + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                i = escape(b, i, strict)?;
            }
            Some(_) => return Err(JsonError::new(ErrorKind::ControlCharacter, i)),
        }
    }
}

/// Where the run of plain string bytes from `at` ends: at the first quote, backslash or control
/// character (or the text's end). Eight bytes are tested at a time.
pub(crate) fn plain_run(b: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        // A byte's high bit is set where it is a quote, a backslash or under 0x20; a borrow can
        // mark bytes after the first such byte, never one before it.
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let special = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | w.wrapping_sub(ONES * 0x20) & !w)
            & HIGH;
        if special != 0 {
            return at + (special.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&c) = b.get(at) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        at += 1;
    }
    at
}

/// The escape at `at` (its backslash): where it ends.
fn escape(b: &[u8], at: usize, strict: bool) -> Result<usize, JsonError> {
    match b.get(at + 1) {
        None => Err(JsonError::new(ErrorKind::Eof, at + 1)),
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 2),
        Some(b'u') => {
            let unit = hex4(b, at + 2)?;
            if !strict {
                return Ok(at + 6);
            }
            match unit {
                0xD800..=0xDBFF => {
                    // A leading half: the trailing half must follow as the next escape.
                    if b.get(at + 6) == Some(&b'\\') && b.get(at + 7) == Some(&b'u') {
                        match hex4(b, at + 8)? {
                            0xDC00..=0xDFFF => Ok(at + 12),
                            _ => Err(JsonError::new(ErrorKind::LoneSurrogate, at)),
                        }
                    } else if b.len() <= at + 7 {
                        Err(JsonError::new(ErrorKind::Eof, at + 6))
                    } else {
                        Err(JsonError::new(ErrorKind::LoneSurrogate, at))
                    }
                }
                0xDC00..=0xDFFF => Err(JsonError::new(ErrorKind::LoneSurrogate, at)),
                _ => Ok(at + 6),
            }
        }
        Some(_) => Err(JsonError::new(ErrorKind::InvalidEscape, at + 1)),
    }
}

fn hex4(b: &[u8], at: usize) -> Result<u16, JsonError> {
    let mut unit = 0u16;
    for i in at..at + 4 {
        let digit = match b.get(i) {
            None => return Err(JsonError::new(ErrorKind::Eof, i)),
            Some(&c) => (c as char)
                .to_digit(16)
                .ok_or(JsonError::new(ErrorKind::InvalidEscape, i))?,
        };
        unit = unit * 16 + digit as u16;
    }
    Ok(unit)
}

/// The number at `at`: where it ends. Strict refuses one a double cannot hold.
fn number(text: &str, at: usize, strict: bool) -> Result<usize, JsonError> {
    let b = text.as_bytes();
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = at + usize::from(b[at] == b'-');
    let int_start = i;
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i + 1),
        None => return Err(JsonError::new(ErrorKind::Eof, i)),
        Some(_) => return Err(JsonError::new(ErrorKind::InvalidNumber, i)),
    }
    // Digits before the point, leading zero aside: how large the number may be.
    let int_digits = if b[int_start] == b'0' {
        0
    } else {
        (i - int_start) as i64
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err(JsonError::new(
                if end >= b.len() {
                    ErrorKind::Eof
                } else {
                    ErrorKind::InvalidNumber
                },
                end,
            ));
        }
        i = end;
    }
    let mut exponent: Option<i64> = Some(0);
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        let negative = b.get(i) == Some(&b'-');
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err(JsonError::new(
                if end >= b.len() {
                    ErrorKind::Eof
                } else {
                    ErrorKind::InvalidNumber
                },
                end,
            ));
        }
        // Five digits or more: serde_json decides.
        exponent = text[i..end]
            .parse::<i64>()
            .ok()
            .filter(|e| *e < 10_000)
            .map(|e| if negative { -e } else { e });
        i = end;
    }
    let sure = exponent.is_some_and(|e| int_digits + e < SURE_FINITE_DIGITS);
    if strict && !sure && serde_json::from_str::<f64>(&text[at..i]).is_err() {
        return Err(JsonError::new(ErrorKind::NumberOutOfRange, at));
    }
    Ok(i)
}
