//! Reading Rust sources as the workspace's own checks do (`tests/layout.rs`, the module graph;
//! `tests/instrumentation.rs`, where metrics and warnings are emitted): comments and literals
//! blanked, tokens with their lines, and test code left out. Deliberately small: enough for the
//! workspace's own code, not a Rust parser.

/// `code` with every comment and string, byte-string and character literal blanked, line breaks
/// kept (so that line numbers stay true): what is left is code only.
pub fn strip_comments_and_literals(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < c.len() {
        let end = if c[i..].starts_with(&['/', '/']) {
            c[i..]
                .iter()
                .position(|&ch| ch == '\n')
                .map_or(c.len(), |n| i + n)
        } else if c[i..].starts_with(&['/', '*']) {
            block_comment_end(&c, i)
        } else {
            literal_end(&c, i).unwrap_or(i)
        };
        if end == i {
            out.push(c[i]);
            i += 1;
        } else {
            out.extend(
                c[i..end]
                    .iter()
                    .map(|&ch| if ch == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        }
    }
    out
}

/// Where the block comment at `start` ends; block comments nest.
fn block_comment_end(c: &[char], start: usize) -> usize {
    let (mut depth, mut i) = (0, start);
    while i < c.len() {
        if c[i..].starts_with(&['/', '*']) {
            depth += 1;
            i += 2;
        } else if c[i..].starts_with(&['*', '/']) {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    c.len()
}

/// Where the string or character literal at `start` ends, if one starts there (a `'` that starts
/// a lifetime or a label is no literal).
fn literal_end(c: &[char], start: usize) -> Option<usize> {
    if start > 0 && (c[start - 1].is_alphanumeric() || c[start - 1] == '_') {
        return None;
    }
    let mut i = start;
    if matches!(c[i], 'b' | 'c') {
        i += 1;
    }
    let raw = c.get(i) == Some(&'r');
    if raw {
        i += 1;
    }
    let hashes = c[i..].iter().take_while(|&&ch| ch == '#').count();
    i += hashes;
    match c.get(i) {
        Some('"') if raw => {
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = i + 1;
            Some(
                c[body..]
                    .windows(close.len())
                    .position(|w| w == close)
                    .map_or(c.len(), |n| body + n + close.len()),
            )
        }
        Some('"') if hashes == 0 => {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            Some((i + 1).min(c.len()))
        }
        Some('\'') if !raw && hashes == 0 && c.get(start) != Some(&'c') => {
            if c.get(i + 1) == Some(&'\\') {
                // An escape: `'\n'`, `'\''`, `'\u{…}'`; it ends at the first `'` after its second
                // character.
                let after = i + 3;
                Some(
                    c[after.min(c.len())..]
                        .iter()
                        .position(|&ch| ch == '\'')
                        .map_or(c.len(), |n| after + n + 1),
                )
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// A token of code with its line: an identifier or keyword, `::`, or one other character.
#[derive(Clone, Debug)]
pub struct Token {
    pub text: String,
    pub line: usize,
}

pub fn is_ident(text: &str) -> bool {
    text.starts_with(|ch: char| ch.is_alphabetic() || ch == '_')
}

pub fn tokenize(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        let len = if ch.is_whitespace() {
            line += usize::from(ch == '\n');
            i += 1;
            continue;
        } else if ch.is_alphanumeric() || ch == '_' {
            c[i..]
                .iter()
                .take_while(|ch| ch.is_alphanumeric() || **ch == '_')
                .count()
        } else if c[i..].starts_with(&[':', ':']) {
            2
        } else {
            1
        };
        tokens.push(Token {
            text: c[i..i + len].iter().collect(),
            line,
        });
        i += len;
    }
    tokens
}

/// `tokens` without the items under `#[cfg(test)]`, or none at all in a file under `#![cfg(test)]`.
pub fn without_test_code(tokens: Vec<Token>) -> Vec<Token> {
    let is = |at: usize, texts: &[&str]| {
        tokens
            .get(at..at + texts.len())
            .is_some_and(|ts| ts.iter().zip(texts).all(|(t, s)| t.text == *s))
    };
    let mut kept = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if is(i, &["#", "!", "[", "cfg", "(", "test", ")", "]"]) {
            return Vec::new();
        }
        if !is(i, &["#", "[", "cfg", "(", "test", ")", "]"]) {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        i += 7;
        // The item's other attributes, then the item: up to its `;` or through its `{…}` body,
        // whichever comes first outside brackets (a `}` first closes the block the item is in).
        while is(i, &["#", "["]) {
            i = closing(&tokens, i + 1);
        }
        while i < tokens.len() {
            match tokens[i].text.as_str() {
                ";" => {
                    i += 1;
                    break;
                }
                "{" => {
                    i = closing(&tokens, i);
                    break;
                }
                "(" | "[" => i = closing(&tokens, i),
                "}" => break,
                _ => i += 1,
            }
        }
    }
    kept
}

/// Just past the bracket that closes the one at `open`.
pub fn closing(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}
