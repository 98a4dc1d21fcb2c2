//! Every past release's formats, read by this build: what each release's own worker wrote
//! (`tests/fixtures/formats/<version>/`, made by `deploy/local/fixtures.sh`) is opened here and
//! must give the verdicts that release gave: its ledger and its snapshot, asked about each id by
//! `dedupe explain` as a user asks a stopped worker; its id changelog, each record decoded, holding
//! every id this build finds held under the key this build gives it; its audit records, each read.
//! A format changed without a version bump (a ledger key, a changelog record) fails here; a
//! difference made by design is named with the release note that says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Fixture {
    version: String,
    commit: String,
    id_source: String,
    ids: Vec<FixtureId>,
}

#[derive(Debug, Deserialize)]
struct FixtureId {
    id: String,
    /// `text` (a string id, in the key or a JSON string), `json_number` (a JSON number read by a
    /// `json:` id source) or `key` (a number's text in the key, before `json:` id sources).
    kind: String,
    /// What the release did with the id's next copy: `dropped` or `published`.
    verdict: String,
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.join("fixture.json").exists())
        .collect();
    dirs.sort();
    dirs
}

fn read_fixture(dir: &Path) -> Fixture {
    let text = std::fs::read_to_string(dir.join("fixture.json")).expect("fixture.json");
    serde_json::from_str(&text).expect("fixture.json parses")
}

/// The release's minor version (0.x).
fn minor(version: &str) -> u32 {
    version
        .strip_prefix("0.")
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("a 0.x version: {version}"))
}

/// Copies `from` into `to`, recursively, a gzipped file expanded under its name without `.gz`
/// (a ledger is opened, and may be changed, by a reader).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().to_string();
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &to.join(&name));
        } else if let Some(expanded) = name.strip_suffix(".gz") {
            let file = std::fs::File::open(entry.path()).expect("open");
            let mut out = std::fs::File::create(to.join(expanded)).expect("create");
            std::io::copy(&mut flate2::read::GzDecoder::new(file), &mut out).expect("gunzip");
        } else {
            std::fs::copy(entry.path(), to.join(&name)).expect("copy");
        }
    }
}

/// Writes a worker's configuration beside `data_dir`, naming it and `id_source` (a TOML string
/// or array, as `Debug` writes a string or a list of them), and returns its path. Nothing listens
/// on port 9 of loopback: `dedupe explain` reads the ledger directory.
fn write_config(data_dir: &Path, id_source: &impl std::fmt::Debug) -> PathBuf {
    let config = data_dir.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\ndata_dir = {:?}\nid_source = {id_source:?}\n[metrics]\naddr = \"127.0.0.1:9\"\n",
            data_dir.display().to_string(),
        ),
    )
    .expect("write the config");
    config
}

/// `dedupe explain` of `id` against a stopped worker whose ledger is `data_dir`.
fn explain(data_dir: &Path, fixture: &Fixture, id: &FixtureId) -> serde_json::Value {
    let config = write_config(data_dir, &fixture.id_source);
    let mut command = Command::new(env!("CARGO_BIN_EXE_dedupe"));
    command.arg("explain").arg("--config").arg(&config);
    if id.kind == "json_number" {
        command.arg("--json-id").arg(&id.id);
    } else {
        command.arg(&id.id);
    }
    let out = command.output().expect("run dedupe explain");
    assert!(
        out.status.success(),
        "{}: dedupe explain {} failed: {}",
        fixture.version,
        id.id,
        String::from_utf8_lossy(&out.stderr)
    );
    // The answer's JSON line, then its sentence.
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().next().unwrap_or_default()).unwrap_or_else(|e| {
        panic!(
            "{}: explain {}: {e}: {}",
            fixture.version,
            id.id,
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Whether this build should find `id` held in `fixture`'s ledger, and why when it differs from
/// the release's own verdict.
fn expected_held(fixture: &Fixture, id: &FixtureId) -> (bool, &'static str) {
    let release = id.verdict == "dropped";
    if id.kind == "json_number" && minor(&fixture.version) < 12 {
        // docs/upgrading.md, 0.12, "Ledger keys of JSON numbers": a JSON number's ledger key is
        // its exact text after a tag byte since 0.12, so a copy of a number first seen before is
        // published once more.
        return (false, "docs/upgrading.md#012: ledger keys of JSON numbers");
    }
    (release, "the release's own verdict")
}

/// The ids of the changelog's id records and its markers, each record decoded.
fn read_changelog(dir: &Path, version: &str) -> (Vec<String>, usize) {
    let bytes = std::fs::read(dir.join("changelog.bin")).expect("changelog.bin");
    let (mut keys, mut marks, mut at) = (Vec::new(), 0, 0);
    while at < bytes.len() {
        let len = i32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        at += 4;
        let record = &bytes[at..at + len as usize];
        at += len as usize;
        if dedupe::changelog::is_mark(record) {
            let mark = dedupe::changelog::decode_mark(record)
                .unwrap_or_else(|e| panic!("{version}: a marker record: {e}"));
            assert!(!mark.keys.is_empty(), "{version}: a marker names its ids");
            marks += 1;
        } else {
            let mut ids = Vec::new();
            dedupe::changelog::decode_into(record, &mut ids)
                .unwrap_or_else(|e| panic!("{version}: an id record: {e}"));
            keys.extend(ids.iter().map(|(k, _)| k.hex()));
        }
    }
    (keys, marks)
}

#[test]
fn every_release_since_0_7_has_its_fixture() {
    let releases =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/releases.md"))
            .expect("docs/releases.md");
    let fixtures: Vec<Fixture> = fixtures().iter().map(|d| read_fixture(d)).collect();
    let mut named = 0;
    for line in releases.lines().filter(|l| l.starts_with("| 0.")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (version, commit) = (cells[1], cells[2]);
        named += 1;
        let fixture = fixtures
            .iter()
            .find(|f| f.version == version)
            .unwrap_or_else(|| {
                panic!("release {version} has no fixture (deploy/local/fixtures.sh {version})")
            });
        assert_eq!(
            fixture.commit, commit,
            "{version}'s fixture is of its commit"
        );
    }
    assert!(named >= 7, "docs/releases.md names the releases since 0.7");
    assert_eq!(
        fixtures.len(),
        named,
        "a fixture for each release, no other"
    );
}

#[test]
fn this_build_reads_every_past_ledger_and_snapshot_as_its_release_did() {
    for dir in fixtures() {
        let fixture = read_fixture(&dir);
        let scratch = tempfile::tempdir().expect("tempdir");
        for part in ["ledger", "snapshot"] {
            let data_dir = scratch.path().join(part);
            copy_dir(&dir.join(part), &data_dir);
            for id in &fixture.ids {
                let answer = explain(&data_dir, &fixture, id);
                let (held, why) = expected_held(&fixture, id);
                assert_eq!(
                    answer["held"], held,
                    "{} {part}: id {} ({}) held {}, expected {held} by {why}: {answer}",
                    fixture.version, id.id, id.kind, answer["held"]
                );
            }
        }
    }
}

#[test]
fn every_past_changelog_holds_each_held_id_under_this_builds_key_and_its_audit_reads() {
    for dir in fixtures() {
        let fixture = read_fixture(&dir);
        let (keys, marks) = read_changelog(&dir, &fixture.version);
        let scratch = tempfile::tempdir().expect("tempdir");
        let data_dir = scratch.path().join("ledger");
        copy_dir(&dir.join("ledger"), &data_dir);
        for id in fixture
            .ids
            .iter()
            .filter(|id| expected_held(&fixture, id).0)
        {
            let key = explain(&data_dir, &fixture, id)["ledger_key"]
                .as_str()
                .expect("a ledger key")
                .to_string();
            assert!(
                keys.contains(&key),
                "{}: the changelog has no id record of {} under this build's key {key}",
                fixture.version,
                id.id
            );
        }
        let forgets = fixture.ids.iter().any(|id| id.id == "forget-me");
        // A forget of two ids, the re-send of one, then the other's copy asking its verdict.
        assert_eq!(marks, if forgets { 3 } else { 0 }, "{}", fixture.version);
        let audit = std::fs::read_to_string(dir.join("audit.jsonl")).expect("audit.jsonl");
        let records: Vec<serde_json::Value> = audit
            .lines()
            .map(|l| serde_json::from_str(l).expect("an audit record is JSON"))
            .collect();
        assert!(
            records.iter().all(|r| r["v"] == 1),
            "{}: every audit record is version 1",
            fixture.version
        );
        let drops = records
            .iter()
            .filter(|r| r.get("verdict").is_some())
            .count();
        assert!(
            drops >= 1,
            "{}: the copy's drop is audited",
            fixture.version
        );
    }
}

#[derive(Debug, Deserialize)]
struct CompositeFixture {
    id_source: Vec<String>,
    refresh_on_duplicate: bool,
    records: Vec<CompositeRecord>,
}

#[derive(Debug, Deserialize)]
struct CompositeRecord {
    key: String,
    /// The record's value, as sent.
    value: String,
    verdict: String,
}

/// Whether any part of a composite id is a JSON number.
fn has_number_part(value: &str) -> bool {
    let parsed: serde_json::Value = serde_json::from_str(value).expect("a JSON value");
    parsed
        .as_object()
        .is_some_and(|o| o.values().any(serde_json::Value::is_number))
}

#[test]
fn every_past_ledger_of_composite_ids_holds_them_under_this_builds_keys() {
    let mut read = 0;
    for dir in fixtures() {
        let fixture = read_fixture(&dir);
        let composite = dir.join("composite");
        if !composite.exists() {
            assert!(
                minor(&fixture.version) < 8,
                "{}: composite ids since 0.8",
                fixture.version
            );
            continue;
        }
        let text = std::fs::read_to_string(composite.join("fixture.json")).expect("fixture.json");
        let c: CompositeFixture = serde_json::from_str(&text).expect("it parses");
        let scratch = tempfile::tempdir().expect("tempdir");
        let data_dir = scratch.path().join("ledger");
        copy_dir(&composite.join("ledger"), &data_dir);
        let config_file = write_config(&data_dir, &c.id_source);
        let config = dedupe::config::Config::load(
            Some(&config_file),
            std::iter::empty(),
            &dedupe::config::Overrides::default(),
        )
        .expect("the config loads");
        // The ledger as the worker opens it, asked about each record's key as the worker reads it.
        let ledger =
            dedupe::ledger::Ledger::open_existing(&data_dir, config.ledger.maintenance_options())
                .unwrap_or_else(|e| panic!("{}: the ledger opens: {e}", fixture.version));
        let mut first_seen = std::collections::BTreeMap::new();
        for r in &c.records {
            let view = dedupe::identity::copied_view(
                Some(r.key.as_bytes()),
                &[],
                Some(r.value.as_bytes()),
            );
            let key = dedupe::identity::message_key(&view, &config.worker.id_source)
                .unwrap_or_else(|e| panic!("{}: {}: {e:?}", fixture.version, r.value));
            let looked = dedupe::store::IdStore::look_up(&ledger, &[key]).expect("a look-up");
            let held = looked.held[0].is_some();
            if let Some(h) = looked.held[0] {
                first_seen.insert(r.key.clone(), h.first_seen_ms);
            }
            // docs/upgrading.md#012, "Ledger keys of JSON numbers": a composite with a number part
            // is keyed anew since 0.12.
            let expected = r.verdict == "dropped"
                && !(minor(&fixture.version) < 12 && has_number_part(&r.value));
            assert_eq!(
                held, expected,
                "{}: composite id {} held {held}, expected {expected} (the release: {})",
                fixture.version, r.value, r.verdict
            );
        }
        // The first id's copy a second and a half after it refreshed it: the time held for it is
        // that copy's, later than the third id's, sent just after the first.
        if c.refresh_on_duplicate {
            assert!(
                first_seen["alice"] > first_seen["carol"],
                "{}: the refreshed id holds its refresh: {first_seen:?}",
                fixture.version
            );
        }
        assert_eq!(
            c.refresh_on_duplicate,
            minor(&fixture.version) >= 12,
            "refresh from 0.12"
        );
        ledger.close().expect("closed");
        read += 1;
    }
    assert!(read >= 6, "composite fixtures from 0.8 on: {read}");
}
