//! The canonical text of a JSON value: the one form two texts are compared in, so that what does
//! not change a value's meaning (white space, the order of an object's members) never tells two
//! copies apart, and what does (a number's digits, a string from a number) always does.
//!
//! The canonical text of a value that passed the strict [`reader`](super::reader):
//! - no white space outside strings;
//! - every object's members in the order of their keys (byte order; [`Strings::AsSent`] compares
//!   the keys' text as sent, [`Strings::Decoded`] their decoded text);
//! - every number, `true`, `false` and `null` as its exact text: `1.0` is not `1`, `1e2` is not
//!   `100`, `-0` is not `0`, and an integer of any length stays exact. Nothing is read as a double;
//! - every string as sent ([`Strings::AsSent`]), or decoded and written again one way
//!   ([`Strings::Decoded`]): escaped only where JSON requires it (`"`, `\`, control characters
//!   as `\b \f \n \r \t` or `\u00XX`), so `"\u00e9"` and `"é"` are one string. This is serde_json's
//!   own way of writing strings, so a value of strings, integers and literals has the canonical
//!   text serde_json wrote for it.
//!
//! Arrays keep their order. Strings stay quoted and numbers do not, so a string is never a number.

use super::reader;

/// Deepest nesting the canonical writer follows; the strict reader refuses deeper text first.
const MAX_DEPTH: usize = 128;

/// How strings (values and keys) are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strings {
    /// Exactly as sent: `"\u00e9"` and `"é"` are two strings (the front door's same event).
    #[default]
    AsSent,
    /// Decoded and written again one way: `"\u00e9"` and `"é"` are one string (the worker's ids
    /// and digests).
    Decoded,
}

/// The canonical writer, with its buffers reused from one value to the next: the members of every
/// object open, a copy of an object's members while they are put in order, and (for
/// [`Strings::Decoded`]) the decoded keys they are ordered by.
#[derive(Debug, Default)]
pub struct Canonical {
    strings: Strings,
    members: Vec<Member>,
    copy: Vec<u8>,
    keys: Vec<u8>,
}

/// One member of an object written: where it is in the output (`start..end`), and where the text
/// it is ordered by is (in the output for [`Strings::AsSent`], else in the decoded keys).
#[derive(Debug, Clone, Copy)]
struct Member {
    start: usize,
    end: usize,
    key_from: usize,
    key_to: usize,
}

impl Canonical {
    /// A writer of strings as `strings` says.
    pub fn new(strings: Strings) -> Self {
        Self {
            strings,
            ..Self::default()
        }
    }

    /// `text`'s canonical text appended to `out`. `None` for text that is not one JSON value
    /// (text that passed the strict reader always is).
    pub fn write(&mut self, text: &str, out: &mut Vec<u8>) -> Option<()> {
        self.write_without(text, &[], out)
    }

    /// Like [`Canonical::write`], leaving out every object member and array element whose value
    /// starts at one of the byte offsets `removed` (sorted) of `text`: removals named by places in
    /// the original text, so no removal moves another.
    pub fn write_without(
        &mut self,
        text: &str,
        removed: &[usize],
        out: &mut Vec<u8>,
    ) -> Option<()> {
        self.members.clear();
        self.keys.clear();
        let mut writer = Writer {
            text: text.as_bytes(),
            at: 0,
            removed,
            buffers: self,
        };
        writer.value(out, 0)?;
        writer.skip_space();
        (writer.at == writer.text.len()).then_some(())
    }
}

/// `raw`'s canonical text (strings as sent) into `out`. `None` for text that is not one JSON value.
pub fn canonical(raw: &str, out: &mut Vec<u8>) -> Option<()> {
    Canonical::default().write(raw, out)
}

/// Writes the string `s` quoted and escaped only where JSON requires it, as serde_json does.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let b = s.as_bytes();
    let mut from = 0;
    for (i, &c) in b.iter().enumerate() {
        let short = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1f => b'u',
            _ => continue,
        };
        out.extend_from_slice(&b[from..i]);
        out.push(b'\\');
        out.push(short);
        if short == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[b'0', b'0', HEX[(c >> 4) as usize], HEX[(c & 0xf) as usize]]);
        }
        from = i + 1;
    }
    out.extend_from_slice(&b[from..]);
    out.push(b'"');
}

/// A cursor over JSON text that passed the strict check.
struct Writer<'a, 'b> {
    text: &'a [u8],
    at: usize,
    removed: &'b [usize],
    buffers: &'b mut Canonical,
}

impl<'a> Writer<'a, '_> {
    fn skip_space(&mut self) {
        while matches!(self.text.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn next_byte(&mut self) -> Option<u8> {
        self.skip_space();
        let b = *self.text.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// Whether the value starting here is left out.
    fn is_removed(&mut self) -> bool {
        if self.removed.is_empty() {
            return false;
        }
        self.skip_space();
        self.removed.binary_search(&self.at).is_ok()
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        self.skip_space();
        match *self.text.get(self.at)? {
            b'{' if depth < MAX_DEPTH => self.object(out, depth + 1),
            b'[' if depth < MAX_DEPTH => self.array(out, depth + 1),
            b'{' | b'[' => None,
            b'"' => {
                let s = self.string()?;
                self.put_string(s, out)
            }
            _ => {
                // A number, `true`, `false` or `null`: its text up to the next delimiter.
                let start = self.at;
                while self.text.get(self.at).is_some_and(|b| {
                    !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b',' | b']' | b'}' | b':')
                }) {
                    self.at += 1;
                }
                (self.at > start).then(|| out.extend_from_slice(&self.text[start..self.at]))
            }
        }
    }

    /// A string as the writer's [`Strings`] says, given its text as sent (quotes included).
    fn put_string(&self, sent: &[u8], out: &mut Vec<u8>) -> Option<()> {
        if self.buffers.strings == Strings::AsSent || !sent.contains(&b'\\') {
            // Strict text has no raw control character or quote inside a string: without an
            // escape, the text as sent is the string written one way.
            out.extend_from_slice(sent);
        } else {
            let inner = std::str::from_utf8(&sent[1..sent.len() - 1]).ok()?;
            write_string(&reader::unescape(inner), out);
        }
        Some(())
    }

    /// A string's text as sent, quotes included.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        if self.text.get(start) != Some(&b'"') {
            return None;
        }
        let mut i = start + 1;
        loop {
            i = reader::plain_run(self.text, i);
            match *self.text.get(i)? {
                b'"' => break,
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        self.at = i + 1;
        Some(&self.text[start..self.at])
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        self.at += 1;
        out.push(b'[');
        let body = out.len();
        self.skip_space();
        if self.text.get(self.at) == Some(&b']') {
            self.at += 1;
            out.push(b']');
            return Some(());
        }
        loop {
            let before = out.len();
            if out.len() > body {
                out.push(b',');
            }
            let removed = self.is_removed();
            self.value(out, depth)?;
            if removed {
                out.truncate(before);
            }
            match self.next_byte()? {
                b',' => {}
                b']' => break,
                _ => return None,
            }
        }
        out.push(b']');
        Some(())
    }

    /// Members are written to `out` as they come (`"key":value`, commas between), then, unless
    /// they came in order already, rewritten from a copy in their keys' order.
    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        self.at += 1;
        out.push(b'{');
        let body = out.len();
        let from = self.buffers.members.len();
        let keys_from = self.buffers.keys.len();
        self.skip_space();
        if self.text.get(self.at) == Some(&b'}') {
            self.at += 1;
        } else {
            while self.member(out, body, depth)? {}
        }
        self.order_members(out, body, from);
        self.buffers.members.truncate(from);
        self.buffers.keys.truncate(keys_from);
        out.push(b'}');
        Some(())
    }

    /// Writes the member here (after a comma unless it is the object's first, written from
    /// `body`) and keeps where it is, unless it is left out; whether another member follows.
    fn member(&mut self, out: &mut Vec<u8>, body: usize, depth: usize) -> Option<bool> {
        self.skip_space();
        let before = out.len();
        if out.len() > body {
            out.push(b',');
        }
        let start = out.len();
        let sent = self.string()?;
        self.put_string(sent, out)?;
        let (key_from, key_to) = self.sort_key(sent, start, out.len())?;
        if self.next_byte()? != b':' {
            return None;
        }
        out.push(b':');
        let removed = self.is_removed();
        self.value(out, depth)?;
        if removed {
            out.truncate(before);
        } else {
            self.buffers.members.push(Member {
                start,
                end: out.len(),
                key_from,
                key_to,
            });
        }
        match self.next_byte()? {
            b',' => Some(true),
            b'}' => Some(false),
            _ => None,
        }
    }

    /// What a member's key (`sent`, its text as sent, written to the output at `start..end`) is
    /// ordered by: with decoded strings its decoded text, kept aside in the key buffer; else the
    /// text written. Where that is, in the one or the other.
    fn sort_key(&mut self, sent: &[u8], start: usize, end: usize) -> Option<(usize, usize)> {
        if self.buffers.strings != Strings::Decoded {
            return Some((start, end));
        }
        let keys = &mut self.buffers.keys;
        let key_from = keys.len();
        let inner = std::str::from_utf8(&sent[1..sent.len() - 1]).ok()?;
        if inner.contains('\\') {
            keys.extend_from_slice(reader::unescape(inner).as_bytes());
        } else {
            keys.extend_from_slice(inner.as_bytes());
        }
        Some((key_from, keys.len()))
    }

    /// Rewrites the members written from `body` (kept from `from` on) in their keys' order,
    /// unless they came in that order.
    fn order_members(&mut self, out: &mut Vec<u8>, body: usize, from: usize) {
        let decoded = self.buffers.strings == Strings::Decoded;
        let buffers = &mut *self.buffers;
        let members = &mut buffers.members[from..];
        let keys = &buffers.keys;
        let in_order = if decoded {
            members
                .windows(2)
                .all(|w| keys[w[0].key_from..w[0].key_to] <= keys[w[1].key_from..w[1].key_to])
        } else {
            members
                .windows(2)
                .all(|w| out[w[0].key_from..w[0].key_to] <= out[w[1].key_from..w[1].key_to])
        };
        if in_order {
            return;
        }
        let copy = &mut buffers.copy;
        copy.clear();
        copy.extend_from_slice(&out[body..]);
        if decoded {
            members.sort_by(|a, b| keys[a.key_from..a.key_to].cmp(&keys[b.key_from..b.key_to]));
        } else {
            members.sort_by(|a, b| {
                copy[a.key_from - body..a.key_to - body]
                    .cmp(&copy[b.key_from - body..b.key_to - body])
            });
        }
        out.truncate(body);
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&copy[m.start - body..m.end - body]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let mut out = Vec::new();
        canonical(text.trim(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn decoded(text: &str) -> String {
        let mut out = Vec::new();
        Canonical::new(Strings::Decoded)
            .write(text, &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn white_space_and_member_order_go_and_every_scalar_stays_as_sent() {
        // Members sorted by their keys' text, nested too; arrays keep their order.
        assert_eq!(
            canon(r#" { "b" : [ 2 , 1 ] , "a" : { "y" : null , "x" : true } } "#),
            r#"{"a":{"x":true,"y":null},"b":[2,1]}"#
        );
        // Numbers and strings keep their text: no double, no decoding of escapes.
        assert_eq!(
            canon(
                r#"{"n":12345678901234567890123,"d":0.10000000000000000001,"e":1E+2,"z":-0.0,"s":"\u00e9\/ \" x"}"#
            ),
            r#"{"d":0.10000000000000000001,"e":1E+2,"n":12345678901234567890123,"s":"\u00e9\/ \" x","z":-0.0}"#
        );
        assert_eq!(canon("[]"), "[]");
        assert_eq!(canon("{ }"), "{}");
        assert_eq!(canon(r#""a\\""#), r#""a\\""#);
    }

    #[test]
    fn values_that_differ_as_sent_stay_apart() {
        // Each pair is equal as a double or once escapes are decoded, and differs as sent.
        for (a, b) in [
            ("12345678901234567890123", "12345678901234567890124"),
            ("0.10000000000000000001", "0.1"),
            ("1e2", "100"),
            ("1.0", "1"),
            (r#""\u00e9""#, r#""é""#),
            (r#""\u0041""#, r#""A""#),
        ] {
            assert_ne!(canon(a), canon(b), "{a} and {b}");
        }
    }

    #[test]
    fn text_that_is_not_one_value_has_no_canonical_form() {
        let mut out = Vec::new();
        for bad in [
            r#"{"a" 1}"#,
            "[1 2]",
            r#"{"a":1"#,
            "",
            "1 2",
            r#""open"#,
            r#"{"a":}"#,
        ] {
            assert!(canonical(bad, &mut out).is_none(), "{bad}");
        }
    }

    #[test]
    fn decoded_strings_are_written_one_way_and_numbers_stay_exact() {
        // Escapes decoded and written again as serde_json writes them; keys too, and ordered by
        // their decoded text.
        assert_eq!(
            decoded(r#"{"\u0062":"\u00e9\/\u0041\n\u001f","a":"é"}"#),
            "{\"a\":\"é\",\"b\":\"é/A\\n\\u001f\"}"
        );
        assert_eq!(
            decoded(r#"["\"", "\\", "\u0008\u000c"]"#),
            r#"["\"","\\","\b\f"]"#
        );
        // A key that is a prefix of another comes first, as in serde_json's map.
        assert_eq!(decoded(r#"{"a!":1,"a":2}"#), r#"{"a":2,"a!":1}"#);
        // Numbers as written.
        assert_eq!(decoded("[1.0,1e0,-0,0,1E+2]"), "[1.0,1e0,-0,0,1E+2]");
        // The same as serde_json's text for strings, integers and literals.
        let text = r#"{"z":[1,-2,true,null,"x\ty\u0001"],"é":{"k":"\u00e9"},"a b":"q\"r"}"#;
        let via_serde =
            serde_json::to_string(&serde_json::from_str::<serde_json::Value>(text).unwrap())
                .unwrap();
        assert_eq!(decoded(text), via_serde);
    }

    #[test]
    fn removals_are_by_place_in_the_original_text() {
        // The elements at 0 and 1 of the original array go, not 0 and 2.
        let text = r#"{"a":[10,11,12],"b":1}"#;
        let at = |needle: &str| text.find(needle).unwrap();
        let mut out = Vec::new();
        Canonical::new(Strings::Decoded)
            .write_without(text, &[at("10"), at("11")], &mut out)
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a":[12],"b":1}"#);
        // A removed member and the comma before it go.
        let mut out = Vec::new();
        let mut removed = vec![at("[10"), at("1}")];
        removed.sort_unstable();
        Canonical::new(Strings::Decoded)
            .write_without(text, &removed, &mut out)
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "{}");
    }
}
