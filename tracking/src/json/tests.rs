//! The reader held to serde_json's verdicts ([`super::reference`]), and the fields and merges it
//! makes.

use proptest::prelude::*;

use super::reader::{ErrorKind, MAX_DEPTH};
use super::*;

fn merged(own: &str, defaults: &str) -> String {
    let mut out = Vec::new();
    merge_into(
        &mut out,
        &Fields::strict(own).unwrap(),
        &Fields::strict(defaults).unwrap(),
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn fields_keep_their_text_and_order() {
    // Keys in the order sent, their text as sent (escapes included), values untouched.
    let text = r#" { "b" : 98765432109876543210 ,"a\u0041":1e2,  "c":{"x" : [1.50, "\u00e9"]} } "#;
    let f = Fields::strict(text).unwrap();
    let got: Vec<(&str, &str, &str)> = f
        .iter()
        .map(|f| (f.key.as_ref(), f.key_text, f.value))
        .collect();
    assert_eq!(
        got,
        [
            ("b", r#""b""#, "98765432109876543210"),
            ("aA", r#""a\u0041""#, "1e2"),
            ("c", r#""c""#, r#"{"x" : [1.50, "\u00e9"]}"#)
        ]
    );
    assert_eq!(f.get("aA"), Some("1e2"));
    assert!(f.get("a").is_none());
    // A key with a quote and a colon in it is found whole.
    let f = Fields::strict(r#"{"k\":\"":"v","z":0}"#).unwrap();
    assert_eq!(
        f.iter().map(|f| f.key_text).collect::<Vec<_>>(),
        [r#""k\":\"""#, r#""z""#]
    );
    assert_eq!(f.iter().next().unwrap().key, r#"k":""#);
}

#[test]
fn a_repeated_key_is_refused_at_any_depth() {
    // The same key twice, even written with an escape, has no one meaning.
    for text in [r#"{"a":1,"a":2}"#, r#"{"a":1,"\u0061":2}"#] {
        let e = Fields::strict(text).unwrap_err();
        assert!(is_duplicate_key(&e), "{e}");
        // Skimmed, both are kept, and the check finds the second.
        let f = Fields::skim(text).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f.check_unique().unwrap_err().line_column(text), (1, 8));
    }
    // Past the keys compared one by one, sorted: a repeat among 40 keys, and 5,000 distinct ones.
    let nested = format!(
        r#"{{"p":{{{}}}}}"#,
        (0..40)
            .map(|i| format!(r#""k{}":0"#, i % 39))
            .collect::<Vec<_>>()
            .join(",")
    );
    for text in [r#"{"p":{"x":[{"y":1,"y":1}]}}"#, nested.as_str()] {
        let e = check_strict(text).unwrap_err();
        assert!(is_duplicate_key(&e), "{e}");
    }
    let many = format!(
        "{{{}}}",
        (0..5000)
            .map(|i| format!(r#""k{i}":0"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert_eq!(Fields::strict(&many).unwrap().len(), 5000);
    check_strict(r#"{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}"#).unwrap();
}

#[test]
fn strict_refuses_what_a_full_parse_refuses() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    for bad in [
        r#"{"x":1e999}"#,
        r#"[-1E+400]"#,
        r#""\ud800""#,
        r#""\ud800\u0041""#,
        r#""a\udc00""#,
        &deep(MAX_DEPTH + 1),
        &"9".repeat(400),
    ] {
        assert!(check_strict(bad).is_err(), "{bad:.60}");
        assert!(reference::check_strict(bad).is_err(), "{bad:.60}");
    }
    for good in [
        r#"{"x":1e300,"y":-2.5E-400,"z":12345678901234567890123}"#,
        r#""\ud83d\ude00""#,
        &deep(MAX_DEPTH),
        "1e-99999999999999",
    ] {
        check_strict(good).unwrap();
        reference::check_strict(good).unwrap();
    }
    // Skimmed, only the grammar counts: deep nesting is not refused.
    Reader::default().value(&deep(10_000), Mode::Skim).unwrap();
}

#[test]
fn errors_say_what_and_where() {
    let text = "{\"a\":1,\n \"b\" 2}";
    let e = Fields::strict(text).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ExpectedColon);
    assert_eq!(
        e.describe(text),
        "expected `:` after a key at line 2 column 6"
    );
    assert_eq!(
        Fields::strict("[1]").unwrap_err().kind,
        ErrorKind::NotAnObject
    );
    assert_eq!(
        Fields::strict("{\"a\":tru").unwrap_err().kind,
        ErrorKind::Eof
    );
}

#[test]
fn a_batch_s_events_are_found_in_the_body_s_pass() {
    let text = r#"{"writeKey":"k","batch":[ {"a":[1,2]} , [] ,{},"s" ],"context":{"batch":[9]},"x":[[3]]}"#;
    let mut items = Vec::new();
    let f = Fields::read_with_items(
        &mut Reader::default(),
        text,
        Mode::Skim,
        "batch",
        &mut items,
    )
    .unwrap();
    assert_eq!(items, [r#"{"a":[1,2]}"#, "[]", "{}", r#""s""#]);
    assert_eq!(
        f.iter().map(|f| f.key.as_ref()).collect::<Vec<_>>(),
        ["writeKey", "batch", "context", "x"]
    );
    // An empty batch, then other arrays: none of their elements is an event.
    let mut items = Vec::new();
    Fields::read_with_items(
        &mut Reader::default(),
        r#"{"batch":[],"y":{"z":[1]},"w":[2]}"#,
        Mode::Skim,
        "batch",
        &mut items,
    )
    .unwrap();
    assert!(items.is_empty(), "{items:?}");
}

/// Each event's text, and the fields its strict read in the body's pass found (or `None`).
type EventsRead<'a> = Vec<(&'a str, Option<Vec<Field<'a>>>)>;

/// Reads `body`'s batch with each event read in the body's pass (at most `most` of them, none
/// longer than `largest`): the events' text and what the pass kept.
fn read_events(
    body: &str,
    most: usize,
    largest: usize,
) -> Result<(Vec<&str>, ItemFields<'_>), JsonError> {
    let mut items = Vec::new();
    let mut events = ItemFields::new(4, most, largest);
    Fields::read_with_events(
        &mut Reader::default(),
        body,
        Mode::Skim,
        "batch",
        &mut items,
        &mut events,
    )?;
    Ok((items, events))
}

fn events_read(body: &str) -> Result<EventsRead<'_>, JsonError> {
    let (items, events) = read_events(body, usize::MAX, usize::MAX)?;
    assert_eq!(items.len(), events.len(), "one entry per event");
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let mut fields = Vec::new();
            (item, events.fields_into(i, &mut fields).then_some(fields))
        })
        .collect())
}

/// The body's verdict without the events' strict read: the skim that found its fields and
/// events before.
fn skimmed(body: &str) -> Result<(), JsonError> {
    Fields::read_with_items(
        &mut Reader::default(),
        body,
        Mode::Skim,
        "batch",
        &mut Vec::new(),
    )
    .map(|_| ())
}

/// What reading `item` strictly on its own finds, as [`ItemFields::fields_into`] gives it.
fn read_alone(item: &str) -> Option<Vec<Field<'_>>> {
    if !item.starts_with('{') {
        return None;
    }
    Fields::strict(item)
        .ok()
        .map(|f| f.iter().cloned().collect())
}

#[test]
fn a_batch_s_events_are_read_strictly_in_the_body_s_pass() {
    let body = concat!(
        r#"{"batch":[ {"type":"track","p":{"x":[1,{"y":2}]}} , {"a":{"b":1,"b":2}},"s",[],"#,
        r#"{"\u0061" : "\ud800x"},{ "k" : 1e400 },{},{"w":1} ],"batch2":[{"a":1,"a":2}]}"#
    );
    let read = events_read(body).unwrap();
    let items: Vec<&str> = read.iter().map(|(item, _)| *item).collect();
    assert_eq!(
        items,
        [
            r#"{"type":"track","p":{"x":[1,{"y":2}]}}"#,
            r#"{"a":{"b":1,"b":2}}"#,
            r#""s""#,
            "[]",
            r#"{"\u0061" : "\ud800x"}"#,
            r#"{ "k" : 1e400 }"#,
            "{}",
            r#"{"w":1}"#,
        ]
    );
    // Read in the pass: the well-formed objects, with the fields a read of each alone finds.
    // Not read: the repeated key at depth 2, the string, the array, the lone surrogate, the
    // number no double holds; each is skimmed as before and read again by whoever makes it.
    let kept: Vec<bool> = read.iter().map(|(_, fields)| fields.is_some()).collect();
    assert_eq!(kept, [true, false, false, false, false, false, true, true]);
    for (item, fields) in &read {
        assert_eq!(fields, &read_alone(item), "{item}");
    }
    // The body's own grammar is still the skim's: an error anywhere refuses the body, at the
    // same place.
    let broken = r#"{"batch":[{"a":1},{"b":]}"#;
    assert_eq!(events_read(broken).map(|_| ()), skimmed(broken));
    assert!(skimmed(broken).is_err());
    // The body's own keys are checked as strictly as before (a lone surrogate in one).
    let bad_key = r#"{"batch":[],"\ud800\"":1}"#;
    assert_eq!(events_read(bad_key).map(|_| ()), skimmed(bad_key));
    assert_eq!(skimmed(bad_key).unwrap_err().kind, ErrorKind::LoneSurrogate);
}

#[test]
fn what_a_body_s_pass_holds_is_bounded() {
    let mut fields = Vec::new();
    // Past `most` events (a batch refused for its length) none is read, only skimmed.
    let (items, events) = read_events(
        r#"{"batch":[{"a":1},{"b":2,"c":3},{"d":4},{}]}"#,
        2,
        usize::MAX,
    )
    .unwrap();
    assert_eq!((items.len(), events.len()), (4, 2));
    assert!(events.fields_into(1, &mut fields));
    let values: Vec<&str> = fields.iter().map(|f| f.value).collect();
    assert_eq!(values, ["2", "3"]);
    assert!(!events.fields_into(2, &mut fields));
    // Past the fields a pass keeps, the events are skimmed and read alone later.
    let many = format!(r#"{{"batch":[{}]}}"#, [r#"{"a":1,"b":2}"#; 3000].join(","));
    let (items, events) = read_events(&many, usize::MAX, usize::MAX).unwrap();
    assert_eq!(items.len(), 3000);
    assert_eq!(events.len(), 2048, "4,096 fields kept, two per event");
    assert!(events.fields_into(2047, &mut fields) && !events.fields_into(2048, &mut fields));
    // An element longer than `largest` is not read here (whoever makes it refuses it for its
    // size); one of exactly `largest` bytes is.
    let body = r#"{"batch":[{"a":"123"},{"a":"1234"},{"a":"123"}]}"#;
    let (_, events) = read_events(body, usize::MAX, r#"{"a":"123"}"#.len()).unwrap();
    let read: Vec<bool> = (0..3).map(|i| events.fields_into(i, &mut fields)).collect();
    assert_eq!(read, [true, false, true]);
}

#[test]
fn a_deep_merge_writes_both_sides_as_sent() {
    // The message's own fields first, in its order; the defaults' missing ones after.
    assert_eq!(
        merged(
            r#"{"b":1.0,"a":{"x":1e2}}"#,
            r#"{"a":{"y":2,"x":3},"c":"\u00e9"}"#
        ),
        r#"{"b":1.0,"a":{"x":1e2,"y":2},"c":"\u00e9"}"#
    );
    // The message's own non-object value wins, null included.
    assert_eq!(
        merged(r#"{"a":null,"b":"s"}"#, r#"{"a":{"y":2},"b":{"z":1}}"#),
        r#"{"a":null,"b":"s"}"#
    );
    assert_eq!(merged("{}", r#"{"a" : 1}"#), r#"{"a":1}"#);
    assert_eq!(merged(r#"{"a":1}"#, "{}"), r#"{"a":1}"#);
}

/// Text near JSON: valid values, and valid values with one byte changed, removed or added, so
/// that every rule's edge is met (a number's grammar and range, escapes and surrogates, keys,
/// commas and colons, nesting).
fn near_json() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,4})?",
        "-?[1-9][0-9]{290,320}",
        "-?(0|1)\\.[0-9]{0,3}[eE][+-]?30[0-9]",
    ];
    let escape = prop_oneof![
        Just("\\\"".to_string()),
        Just("\\\\".to_string()),
        Just("\\/".to_string()),
        Just("\\n".to_string()),
        "\\\\u[0-9a-fA-F]{4}",
        "\\\\u[dD][89abAB][0-9a-f]{2}(\\\\u[dD][c-fC-F][0-9a-f]{2})?",
        "\\\\u[dD][c-fC-F][0-9a-f]{2}",
    ];
    let string = proptest::collection::vec(prop_oneof!["[a-zé\u{2028} ]{0,3}", escape], 0..4)
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
    let key = prop_oneof![
        Just("\"a\"".to_string()),
        Just("\"\\u0061\"".to_string()),
        Just("\"b\"".to_string()),
        string.clone()
    ];
    let leaf = prop_oneof![
        number,
        string,
        Just("true".to_string()),
        Just("null".to_string()),
        Just("false".to_string())
    ];
    let value = leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec((key.clone(), inner, " {0,1}"), 0..5).prop_map(|v| format!(
                "{{{}}}",
                v.iter()
                    .map(|(k, v, s)| format!("{k}{s}:{s}{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        ]
    });
    let edit = prop_oneof![
        Just(None),
        (
            any::<prop::sample::Index>(),
            prop::sample::select(vec![
                "", "\"", "\\", ",", ":", "{", "}", "[", "]", "0", "-", ".", "e", " ", "\u{1}",
                "x", "\\u", "\\ud800",
            ]),
            any::<bool>()
        )
            .prop_map(Some),
    ];
    (value, edit).prop_map(|(text, edit)| match edit {
        None => text,
        Some((at, insert, replace)) => {
            let mut at = at.index(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = at;
            if replace && at < text.len() {
                end = at + text[at..].chars().next().map_or(0, char::len_utf8);
            }
            format!("{}{insert}{}", &text[..at], &text[end..])
        }
    })
}

/// Deep nesting around a value, near the strict limit.
fn nested() -> impl Strategy<Value = String> {
    (MAX_DEPTH - 3..MAX_DEPTH + 3, any::<bool>()).prop_map(|(depth, objects)| {
        if objects {
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        } else {
            format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// Strict reading refuses exactly what serde_json's full parse (with repeated keys refused)
    /// refuses, and skimming exactly what its skim refuses.
    #[test]
    fn the_reader_agrees_with_serde_json(text in prop_oneof![4 => near_json(), 1 => nested()]) {
        let strict = check_strict(&text);
        let reference = reference::check_strict(&text);
        prop_assert_eq!(strict.is_ok(), reference.is_ok(), "strict {:?}, serde_json {:?}", strict, reference.map_err(|e| e.to_string()));
        if let (Err(e), Err(r)) = (&strict, &reference) {
            prop_assert_eq!(is_duplicate_key(e), r.to_string().starts_with(reference::DUPLICATE_KEY));
        }
        let skim = Reader::default().value(&text, Mode::Skim);
        let reference = serde_json::from_str::<&serde_json::value::RawValue>(&text);
        prop_assert_eq!(skim.is_ok(), reference.is_ok(), "skim {:?}, serde_json {:?}", skim, reference.map_err(|e| e.to_string()));
    }

    /// A batch's events read in the body's pass are read as each would be alone: the same
    /// verdict and the same fields; the body is refused exactly where its skim refuses it.
    #[test]
    fn events_read_in_the_body_s_pass_are_read_as_alone(
        events in proptest::collection::vec(prop_oneof![3 => near_json(), 1 => nested()], 0..6),
        spaces in " {0,1}",
    ) {
        let body = format!("{{\"batch\":[{spaces}{}{spaces}],\"x\":1}}", events.join(","));
        let skim = skimmed(&body);
        match events_read(&body) {
            Err(e) => prop_assert_eq!(Err(e), skim),
            Ok(read) => {
                prop_assert!(skim.is_ok());
                for (item, fields) in &read {
                    prop_assert_eq!(fields, &read_alone(item), "{}", item);
                }
            }
        }
    }

    /// An object's fields are the ones serde_json finds: the same keys, decoded alike, and the
    /// same values' text.
    #[test]
    fn fields_are_the_ones_serde_json_finds(text in near_json().prop_filter("an object", |t| t.starts_with('{'))) {
        let ours = Fields::skim(&text);
        let theirs = reference::fields(&text);
        prop_assert_eq!(ours.is_ok(), theirs.is_ok(), "ours {:?}, serde_json {:?}", ours.as_ref().err(), theirs.as_ref().err().map(|e| e.to_string()));
        if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
            let ours: Vec<(&str, &str)> = ours.iter().map(|f| (f.key.as_ref(), f.value)).collect();
            let theirs: Vec<(&str, &str)> = theirs.iter().map(|(k, v)| (k.as_ref(), v.get())).collect();
            prop_assert_eq!(ours, theirs);
        }
    }

    /// The worker reads a record value as the front door reads an event: the same verdict on the
    /// same bytes (serde_json's, a repeated key refused as such), and the same canonical text.
    #[test]
    fn the_worker_reads_a_value_as_the_front_door_does(text in prop_oneof![4 => near_json(), 1 => nested()]) {
        let door = check_strict(&text);
        let worker = dedupe::json::Document::read(text.as_bytes());
        prop_assert_eq!(door.is_ok(), worker.is_ok(), "front door {:?}, worker {:?}", door, worker);
        if let Err(e) = &door {
            prop_assert_eq!(
                is_duplicate_key(e),
                worker.err() == Some(dedupe::json::Unreadable::RepeatedKey)
            );
        }
        if let Ok(doc) = worker {
            let mut theirs = Vec::new();
            crate::same_event::canonical(text.trim_matches([' ', '\t', '\n', '\r']), &mut theirs).unwrap();
            let mut ours = Vec::new();
            dedupe::json::Canonical::default().write(doc.text(), &mut ours).unwrap();
            prop_assert_eq!(ours, theirs);
        }
    }
}
