//! The exact reading held to a model: JSON values as a tree whose numbers are their text and
//! whose strings are their decoded text, each written many ways (white space, member order,
//! escapes). Two texts have one canonical text, and one id under every id source, exactly when
//! they are one value of the model.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::canonical::{Canonical, Strings};
use super::Document;
use crate::identity::{message_key, IdSource, LedgerKey, RecordView, Unkeyed};

/// A JSON value as the exact reading sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum J {
    Null,
    Bool(bool),
    /// A number's text: `1` and `1.0` are two numbers.
    Num(&'static str),
    /// A string's decoded text.
    Str(String),
    Arr(Vec<J>),
    Obj(BTreeMap<String, J>),
}

/// Numbers that a double (or a careless reading) takes for one another.
const NUMBERS: [&str; 12] = [
    "0",
    "-0",
    "1",
    "1.0",
    "1e0",
    "1E+0",
    "100",
    "1e2",
    "12345678901234567890123",
    "12345678901234567890124",
    "0.1",
    "0.1000000000000000055511151231257827",
];

fn text() -> impl Strategy<Value = String> {
    // Few characters, so that two strings are often equal; each can be written several ways.
    proptest::collection::vec(
        prop::sample::select(vec![
            'a', '1', 'é', '"', '\\', '/', '\n', '\u{1}', '😀', ' ',
        ]),
        0..3,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn scalar() -> impl Strategy<Value = J> {
    prop_oneof![
        1 => Just(J::Null),
        1 => any::<bool>().prop_map(J::Bool),
        4 => prop::sample::select(NUMBERS.to_vec()).prop_map(J::Num),
        4 => text().prop_map(J::Str),
        // A string with a number's text.
        2 => prop::sample::select(NUMBERS.to_vec()).prop_map(|n| J::Str(n.to_string())),
    ]
}

fn value() -> impl Strategy<Value = J> {
    scalar().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(J::Arr),
            proptest::collection::btree_map(
                prop::sample::select(vec!["a", "b", "é", "a b", "\"", "", "id"])
                    .prop_map(str::to_string),
                inner,
                0..4
            )
            .prop_map(J::Obj),
        ]
    })
}

/// How a value is written: a stream of choices (white space, escapes, member order).
#[derive(Debug, Clone)]
struct Style(Vec<u8>, usize);

impl Style {
    fn next(&mut self) -> u8 {
        let b = self
            .0
            .get(self.1 % self.0.len().max(1))
            .copied()
            .unwrap_or(0);
        self.1 += 1;
        b.wrapping_add(self.1 as u8)
    }

    fn space(&mut self, out: &mut String) {
        match self.next() % 6 {
            0 => out.push(' '),
            1 => out.push_str("\n\t "),
            2 => out.push('\r'),
            _ => {}
        }
    }
}

fn style() -> impl Strategy<Value = Style> {
    proptest::collection::vec(any::<u8>(), 1..32).prop_map(|b| Style(b, 0))
}

fn write_str(s: &str, style: &mut Style, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let escaped = style.next().is_multiple_of(2);
        match c {
            '"' if escaped => out.push_str("\\u0022"),
            '"' => out.push_str("\\\""),
            '\\' if escaped => out.push_str("\\u005C"),
            '\\' => out.push_str("\\\\"),
            '\n' if escaped => out.push_str("\\u000a"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            '/' if escaped => out.push_str("\\/"),
            c if escaped => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write(j: &J, style: &mut Style, out: &mut String) {
    style.space(out);
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num(n) => out.push_str(n),
        J::Str(s) => write_str(s, style, out),
        J::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, style, out);
            }
            style.space(out);
            out.push(']');
        }
        J::Obj(members) => {
            // The members in an order of the style's choosing.
            let mut members: Vec<_> = members.iter().collect();
            if !members.is_empty() {
                let turn = style.next() as usize % members.len();
                members.rotate_left(turn);
                if style.next().is_multiple_of(2) {
                    members.reverse();
                }
            }
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                style.space(out);
                write_str(k, style, out);
                style.space(out);
                out.push(':');
                write(v, style, out);
            }
            style.space(out);
            out.push('}');
        }
    }
    style.space(out);
}

fn written(j: &J, style: &Style) -> String {
    let mut out = String::new();
    write(j, &mut style.clone(), &mut out);
    out
}

fn canonical(text: &str) -> Vec<u8> {
    let doc = Document::read(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e:?}"));
    let mut out = Vec::new();
    doc.canonical(&[], &mut Canonical::new(Strings::Decoded), &mut out);
    out
}

fn key(value: &str, source: &IdSource) -> Result<LedgerKey, Unkeyed> {
    message_key(
        &RecordView {
            key: None,
            header: |_: &str| None,
            value: Some(value.as_bytes()),
        },
        source,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn one_canonical_text_exactly_when_one_value(
        a in value(), b in value(), sa in style(), sb in style(), sc in style()
    ) {
        let (ta, tb) = (written(&a, &sa), written(&b, &sb));
        prop_assert_eq!(canonical(&ta) == canonical(&tb), a == b, "{} | {}", ta, tb);
        // The same value written another way is the same canonical text, which is itself
        // canonical.
        let ca = canonical(&ta);
        prop_assert_eq!(&canonical(&written(&a, &sc)), &ca);
        prop_assert_eq!(&canonical(std::str::from_utf8(&ca).unwrap()), &ca);
    }

    #[test]
    fn one_id_exactly_when_one_value_under_every_source(
        a in scalar(), b in scalar(), ra in value(), rb in value(), sa in style(), sb in style()
    ) {
        // `{"id": a, "r": ra}` and `{"id": b, "r": rb}`.
        let doc = |id: &J, rest: &J| J::Obj(BTreeMap::from([
            ("id".to_string(), id.clone()),
            ("r".to_string(), rest.clone()),
        ]));
        let (da, db) = (doc(&a, &ra), doc(&b, &rb));
        let (ta, tb) = (written(&da, &sa), written(&db, &sb));
        for (source, same) in [
            ("json:/id", a == b),
            ("fingerprint", da == db),
            ("fingerprint:of:/id", a == b),
            ("fingerprint:without:/r", a == b),
        ] {
            let source = id_source(source);
            let (ka, kb) = (key(&ta, &source), key(&tb, &source));
            if matches!(source, IdSource::JsonPointer(_)) && !(is_id(&a) && is_id(&b)) {
                continue;
            }
            prop_assert!(ka.is_ok() && kb.is_ok(), "{}: {} | {}", source, ta, tb);
            prop_assert_eq!(ka == kb, same, "{}: {} | {}", source, ta, tb);
        }
        // A composite: equal parts exactly when equal values.
        if is_id(&a) && is_id(&b) && is_id(&ra) && is_id(&rb) {
            let parts: IdSource = serde_json::from_str(r#"["json:/id", "json:/r"]"#).unwrap();
            prop_assert_eq!(
                key(&ta, &parts) == key(&tb, &parts),
                a == b && ra == rb,
                "{} | {}", ta, tb
            );
        }
    }
}

fn id_source(text: &str) -> IdSource {
    serde_json::from_value(serde_json::Value::String(text.into())).unwrap()
}

/// Whether a value can be an id read by a JSON pointer: a number, or a string that is not empty.
fn is_id(j: &J) -> bool {
    match j {
        J::Num(_) => true,
        J::Str(s) => !s.is_empty(),
        _ => false,
    }
}

#[test]
fn a_value_of_every_kind_is_written_as_the_model_says() {
    // The generator's own check: a written value reads back strictly.
    let j = J::Obj(BTreeMap::from([
        ("é".into(), J::Str("\"\\/\n\u{1}😀".into())),
        (
            "a".into(),
            J::Arr(vec![J::Num("1.0"), J::Null, J::Bool(true)]),
        ),
    ]));
    for seed in 0..50u8 {
        let text = written(&j, &Style(vec![seed, seed.wrapping_mul(7)], 0));
        assert_eq!(
            String::from_utf8(canonical(&text)).unwrap(),
            "{\"a\":[1.0,null,true],\"é\":\"\\\"\\\\/\\n\\u0001😀\"}",
            "{text}"
        );
    }
}
