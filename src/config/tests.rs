//! Unit tests of loading, overriding, validating and printing a configuration.

use super::*;

fn load_str(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    Config::load(Some(&path), env, &Overrides::default())
}

#[test]
fn shipped_config_files_load() {
    for file in ["config/dedupe.toml", "config/local.toml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        Config::load(Some(&path), std::iter::empty(), &Overrides::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn documented_defaults_match_code_defaults() {
    // config/dedupe.toml spells out every default; it must not drift from the code.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/dedupe.toml");
    let from_file = Config::load(Some(&path), std::iter::empty(), &Overrides::default()).unwrap();
    assert_eq!(from_file, Config::default());
}

#[test]
fn unknown_key_is_named() {
    let err = load_str("[ledger]\nbudget_bytez = 5\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("budget_bytez"), "{err}");
    assert!(!err.contains('\n'));
}

#[test]
fn bad_value_is_named() {
    let err = load_str("[ledger]\nbudget_bytes = \"12 parsecs\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("ledger.budget_bytes:"), "{err}");
    let err = load_str("[ledger]\nbudget_bytes = \"1MiB\"\n", &[])
        .unwrap_err()
        .to_string();
    assert_eq!(err, "ledger.budget_bytes: must be at least 64MiB");
}

#[test]
fn env_overrides_file_and_flags_override_env() {
    let c = load_str(
        "[worker]\ninput_topic = \"a\"\n",
        &[
            ("DEDUPE_WORKER_INPUT_TOPIC", "b"),
            ("DEDUPE_LEDGER_GENERATIONS", "4"),
        ],
    )
    .unwrap();
    assert_eq!(c.worker.input_topic, "b");
    assert_eq!(c.ledger.generations, 4);
    let o = Overrides {
        input_topic: Some("c".into()),
        ..Default::default()
    };
    let c = Config::load(
        None,
        [("DEDUPE_WORKER_INPUT_TOPIC".to_string(), "b".to_string())],
        &o,
    )
    .unwrap();
    assert_eq!(c.worker.input_topic, "c");
}

#[test]
fn unknown_env_key_in_a_section_is_an_error_but_other_vars_are_ignored() {
    let err = load_str("", &[("DEDUPE_WORKER_INPUT_TOPICS", "x")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("input_topics"), "{err}");
    load_str(
        "",
        &[("DEDUPE_WRITE_KEYS", "k=s"), ("DEDUPE_CACHE", "/tmp")],
    )
    .unwrap();
}

#[test]
fn password_only_from_env_and_redacted() {
    let err = load_str("[kafka]\nsasl_password = \"hunter2\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("kafka.sasl_password"), "{err}");
    assert!(!err.contains("hunter2"));
    let c = load_str("", &[(ENV_SASL_PASSWORD, "hunter2")]).unwrap();
    assert_eq!(c.kafka.sasl_password.as_ref().unwrap().expose(), "hunter2");
    assert!(!c.to_toml().contains("hunter2"));
    assert!(!format!("{c:?}").contains("hunter2"));
}

#[test]
fn an_admin_token_from_a_file_is_trimmed_and_a_bad_one_refused_without_being_echoed() {
    let token = |value: &str| load_str("", &[(ENV_ADMIN_TOKEN, value)]);
    // A Kubernetes Secret made from a file ends in a newline; surrounding white space goes.
    for value in ["s3cret-token\n", "  s3cret-token\r\n", "\ts3cret-token "] {
        let c = token(value).unwrap();
        assert_eq!(
            c.metrics.admin_token.as_ref().map(Secret::expose),
            Some("s3cret-token"),
            "{value:?}"
        );
    }
    // Empty: no token (loopback clients only), as before.
    assert!(token("").unwrap().metrics.admin_token.is_none());
    // Blank once trimmed, or holding what a header cannot carry: refused, naming the variable,
    // never quoting the value.
    for value in [
        "\n",
        "   ",
        "s3cret tok3n",
        "s3cret\u{7f}tok3n",
        "s3cr\u{e9}t-tok3n",
        "a\nb",
    ] {
        let err = token(value).unwrap_err().to_string();
        assert!(err.starts_with(ENV_ADMIN_TOKEN), "{value:?}: {err}");
        for part in ["s3cret", "tok3n"] {
            assert!(!err.contains(part), "{value:?}: {err}");
        }
    }
}

#[test]
fn a_sasl_password_loses_a_trailing_line_ending_only() {
    let password = |value: &str| {
        load_str("", &[(ENV_SASL_PASSWORD, value)])
            .unwrap()
            .kafka
            .sasl_password
            .unwrap()
            .expose()
            .to_string()
    };
    assert_eq!(password("hunter2\n"), "hunter2");
    assert_eq!(password("hunter2\r\n"), "hunter2");
    // Spaces are a password's own.
    assert_eq!(password(" hunter 2 "), " hunter 2 ");
    assert_eq!(password("hunter2 \n"), "hunter2 ");
}

#[test]
fn secret_kafka_properties_never_print() {
    let text = "[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"ssl.key.password\" = \"k3y-pass\"\n\"sasl.oauthbearer.client.secret\" = \"oauth-s3cret\"\n\"ssl.ca.location\" = \"/etc/ca.pem\"\n";
    let c = load_str(text, &[]).unwrap();
    let shown = c.to_toml();
    for secret in ["hunter2", "k3y-pass", "oauth-s3cret"] {
        assert!(!shown.contains(secret), "{secret} printed:\n{shown}");
        assert!(!format!("{c:?}").contains(secret));
    }
    // Not secrets: shown as given, and the secrets still reach librdkafka.
    assert!(shown.contains("/etc/ca.pem"), "{shown}");
    assert_eq!(c.kafka.properties["sasl.password"], "hunter2");
    assert!(is_secret_property("ssl.keystore.password") && is_secret_property("ssl.key.pem"));
    assert!(!is_secret_property("ssl.ca.location") && !is_secret_property("bootstrap.servers"));
}

#[test]
fn a_syntax_error_names_the_place_but_never_quotes_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[kafka.properties]\n\"sasl.password\" = \"hunter2\n").unwrap();
    let err = Config::load(Some(&path), Vec::new(), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("bad.toml"), "{err}");
}

#[test]
fn partitions_parse_and_print() {
    let p = PartitionSet::parse("7, 0-3,2").unwrap();
    assert_eq!(p.0, vec![0, 1, 2, 3, 7]);
    assert_eq!(p.to_string(), "0-3,7");
    assert!(PartitionSet::parse("3-1").is_err());
    assert!(PartitionSet::parse("x").is_err());
    assert!(PartitionSet::parse("").is_err());
}

#[test]
fn worker_index_rules() {
    let err = load_str("[worker]\nworker_index = 3\nworker_count = 3\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.worker_index:"), "{err}");
    let err = load_str("[worker]\nworker_index = 0\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.worker_count:"), "{err}");
}

#[test]
fn dead_letter_needs_a_topic() {
    let err = load_str("[worker]\nunkeyed_policy = \"dead-letter\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.dead_letter_topic:"), "{err}");
    let c = load_str(
        "[worker]\nunkeyed_policy = \"dead-letter\"\ndead_letter_topic = \"dlq\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.worker.unkeyed_policy, UnkeyedPolicy::DeadLetter);
    // Reused ids sent aside need it too; the message names the setting that asks for it.
    let err = load_str("[worker]\non_reused_id = \"dead-letter\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("worker.dead_letter_topic:") && err.contains("on_reused_id"),
        "{err}"
    );
    let c = load_str(
        "[worker]\non_reused_id = \"publish\"\ncontent_digest = \"header\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(
        (c.worker.on_reused_id, c.worker.content_digest),
        (
            crate::config::ReusedIdPolicy::Publish,
            crate::config::DigestSource::Header
        )
    );
    let err = load_str("[worker]\ncontent_digest = \"body\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("content_digest"), "{err}");
}

#[test]
fn id_source_forms() {
    let c = load_str("[worker]\nid_source = \"json:/messageId\"\n", &[]).unwrap();
    assert_eq!(
        c.worker.id_source,
        IdSource::JsonPointer("/messageId".into())
    );
    let err = load_str("[worker]\nid_source = \"body\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.id_source:"), "{err}");
}

#[test]
fn byte_sizes() {
    assert_eq!(ByteSize::parse("64MiB").unwrap().0, 64 << 20);
    assert_eq!(ByteSize::parse("1_000").unwrap().0, 1000);
    assert_eq!(ByteSize(16 << 30).to_string(), "16GiB");
    assert!(ByteSize::parse("5 parsecs").is_err());
}

#[test]
fn group_assignment_settings_are_checked_naming_the_key() {
    let err = load_str("[worker]\nassignment = \"elastic\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.assignment:"), "{err}");
    let err = load_str("", &[("DEDUPE_WORKER_ASSIGNMENT", "elastic")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("worker.assignment"), "{err}");
    let o = Overrides {
        assignment: Some("elastic".into()),
        ..Default::default()
    };
    let err = Config::load(None, std::iter::empty(), &o)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("--assignment:"), "{err}");

    let err = load_str(
        "[worker]\nassignment = \"group\"\npartitions = \"0-3\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("worker.partitions:"), "{err}");
    let err = load_str(
        "[worker]\nassignment = \"group\"\nworker_index = 0\nworker_count = 2\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("worker.worker_index:"), "{err}");
    let err = load_str("[worker]\nchangelog_retention_secs = 3600\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("worker.changelog_retention_secs:") && err.contains("promised_window_secs"),
        "{err}"
    );
    let err = load_str("[worker]\nchangelog_topic = \"events.out\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.changelog_topic:"), "{err}");
    let err = load_str("[worker]\nmember_id = \" \"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.member_id:"), "{err}");

    let c = load_str(
        "[worker]\nassignment = \"group\"\nmember_id = \"w-1\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.worker.assignment, Assignment::Group);
    assert_eq!(c.worker.member_id().as_deref(), Some("w-1"));
    assert_eq!(
        c.worker.changelog_topic(),
        "events.out.ids",
        "the default follows the output topic"
    );
}

#[test]
fn one_partition_may_be_given_as_a_number() {
    let c = load_str("", &[("DEDUPE_WORKER_PARTITIONS", "3")]).unwrap();
    assert_eq!(
        c.worker.partitions,
        Some(PartitionSet(vec![3])),
        "the environment's 3 reads as a number"
    );
    let c = load_str("[worker]\npartitions = 0\n", &[]).unwrap();
    assert_eq!(c.worker.partitions, Some(PartitionSet(vec![0])));
    let err = load_str("[worker]\npartitions = -1\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.partitions:"), "{err}");
}

#[test]
fn the_duplicate_audit_is_on_by_default_and_its_settings_are_checked() {
    let c = load_str("", &[]).unwrap();
    assert_eq!(
        c.worker.audit_topic().as_deref(),
        Some("events.out.duplicates"),
        "the default follows the output topic"
    );
    let off = load_str("", &[("DEDUPE_WORKER_AUDIT_TOPIC", "")]).unwrap();
    assert_eq!(
        off.worker.audit_topic(),
        None,
        "an empty topic turns the audit off"
    );
    for (text, key) in [
        (
            "[worker]\naudit_topic = \"events.out\"\n",
            "worker.audit_topic:",
        ),
        (
            "[worker]\naudit_topic = \"events.out.ids\"\n",
            "worker.audit_topic:",
        ),
        ("[worker]\naudit_topic = \" \"\n", "worker.audit_topic:"),
        ("[worker]\naudit_sample = 1.5\n", "worker.audit_sample:"),
        ("[worker]\naudit_sample = -0.1\n", "worker.audit_sample:"),
        (
            "[worker]\naudit_retention_secs = 0\n",
            "worker.audit_retention_secs:",
        ),
    ] {
        let err = load_str(text, &[]).unwrap_err().to_string();
        assert!(err.starts_with(key), "{text}: {err}");
    }
}

#[test]
fn sasl_needs_its_mechanism_user_and_password_and_a_ca_file_must_be_readable() {
    let sasl = "[kafka]\nsecurity_protocol = \"sasl_ssl\"\n";
    let err = load_str(sasl, &[]).unwrap_err().to_string();
    assert!(err.starts_with("kafka.sasl_mechanism"), "{err}");
    let with_user =
        format!("{sasl}sasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"dedupe\"\n");
    let err = load_str(&with_user, &[]).unwrap_err().to_string();
    assert!(
        err.starts_with("kafka.sasl_password") && err.contains(ENV_SASL_PASSWORD),
        "{err}"
    );
    let c = load_str(&with_user, &[(ENV_SASL_PASSWORD, "hunter2")]).unwrap();
    assert!(c.kafka.ssl_ca_location.is_none());

    let err = load_str(
        &with_user,
        &[
            (ENV_SASL_PASSWORD, "hunter2"),
            ("DEDUPE_KAFKA_SSL_CA_LOCATION", "/no/such/ca.pem"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("kafka.ssl_ca_location") && err.contains("/no/such/ca.pem"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let err = load_str("[kafka]\nssl_ca_location = \"/etc/hostname\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("kafka.ssl_ca_location") && err.contains("no TLS"),
        "{err}"
    );
    let ca = tempfile::NamedTempFile::new().unwrap();
    let c = load_str(
        &with_user,
        &[
            (ENV_SASL_PASSWORD, "hunter2"),
            ("DEDUPE_KAFKA_SSL_CA_LOCATION", ca.path().to_str().unwrap()),
        ],
    )
    .unwrap();
    assert_eq!(c.kafka.ssl_ca_location.as_deref(), Some(ca.path()));
    let client = crate::kafka::client_config(&c.kafka);
    assert_eq!(client.get("ssl.ca.location"), ca.path().to_str());
}

#[test]
fn an_id_less_events_id_is_derived_unless_told_otherwise() {
    assert_eq!(
        load_str("", &[]).unwrap().ingest.missing_message_id,
        MissingMessageId::Derive
    );
    let c = load_str("[ingest]\nmissing_message_id = \"random\"\n", &[]).unwrap();
    assert_eq!(c.ingest.missing_message_id, MissingMessageId::Random);
    let c = load_str("", &[("DEDUPE_INGEST_MISSING_MESSAGE_ID", "random")]).unwrap();
    assert_eq!(c.ingest.missing_message_id, MissingMessageId::Random);
    let e = load_str("[ingest]\nmissing_message_id = \"hash\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ingest.missing_message_id") && e.contains("derive"),
        "{e}"
    );
}

#[test]
fn browser_settings_are_checked_naming_the_key() {
    // Good: origins with and without a port, the wildcard, a rate with its burst, a public URL;
    // and an origin list through the environment, in TOML's array syntax.
    let c = load_str(
        "[ingest]\ncors_origins = [\"https://shop.example.com\", \"http://127.0.0.1:8000\", \"http://[::1]:3000\", \"*\"]\n\
         rate_limit_events_per_sec = 100\nrate_limit_burst_events = 500\npublic_url = \"https://track.example.com\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.ingest.cors_origins.len(), 4);
    let c = load_str(
        "",
        &[("DEDUPE_INGEST_CORS_ORIGINS", r#"["http://localhost:5000"]"#)],
    )
    .unwrap();
    assert_eq!(c.ingest.cors_origins, ["http://localhost:5000"]);

    let cases = [
        (
            "cors_origins = [\"https://shop.example.com/\"]",
            "ingest.cors_origins: `https://shop.example.com/` is not an origin",
        ),
        (
            "cors_origins = [\"shop.example.com\"]",
            "ingest.cors_origins: `shop.example.com` is not an origin",
        ),
        (
            "cors_origins = [\"http://a.com:80x\"]",
            "ingest.cors_origins: `http://a.com:80x` is not an origin",
        ),
        (
            "max_in_flight_requests = 0",
            "ingest.max_in_flight_requests: must be at least 1",
        ),
        (
            "rate_limit_burst_events = 10",
            "ingest.rate_limit_burst_events: needs ingest.rate_limit_events_per_sec",
        ),
        (
            "public_url = \"track.example.com\"",
            "ingest.public_url: `track.example.com` must be an http:// or https:// URL",
        ),
        (
            "public_url = \"https://\"",
            "ingest.public_url: `https://` must be",
        ),
    ];
    for (line, starts) in cases {
        let err = load_str(&format!("[ingest]\n{line}\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(starts), "{line}: {err}");
    }
}

#[test]
fn list_keys_take_a_comma_separated_list_from_the_environment() {
    // The origins as one comma-separated variable: each item trimmed, empty items dropped.
    let c = load_str(
        "",
        &[(
            "DEDUPE_INGEST_CORS_ORIGINS",
            "https://a.example, https://b.example,,",
        )],
    )
    .unwrap();
    assert_eq!(
        c.ingest.cors_origins,
        ["https://a.example", "https://b.example"]
    );
    // A single item is a list of one, and it overrides the file's list.
    let c = load_str(
        "[ingest]\ncors_origins = [\"https://shop.example.com\"]\n",
        &[("DEDUPE_INGEST_CORS_ORIGINS", "https://a.example")],
    )
    .unwrap();
    assert_eq!(c.ingest.cors_origins, ["https://a.example"]);
    // Another section's list, the hook's extra variable names.
    let c = load_str(
        "",
        &[("DEDUPE_SNAPSHOTS_HOOK_ENV", "AWS_PROFILE,AWS_REGION")],
    )
    .unwrap();
    assert_eq!(c.snapshots.hook_env, ["AWS_PROFILE", "AWS_REGION"]);
    // TOML's array literal still works, commas inside its strings included.
    let c = load_str(
        "",
        &[("DEDUPE_SNAPSHOTS_HOOK_ENV", r#"["AWS_PROFILE", "A,B"]"#)],
    )
    .unwrap();
    assert_eq!(c.snapshots.hook_env, ["AWS_PROFILE", "A,B"]);
    // An empty value is an empty list.
    let c = load_str(
        "[snapshots]\nhook_env = [\"AWS_PROFILE\"]\n",
        &[("DEDUPE_SNAPSHOTS_HOOK_ENV", "")],
    )
    .unwrap();
    assert!(
        c.snapshots.hook_env.is_empty(),
        "{:?}",
        c.snapshots.hook_env
    );
    // An item that reads as a number is still a string, as the list's items are.
    let c = load_str("", &[("DEDUPE_SNAPSHOTS_HOOK_ENV", "7")]).unwrap();
    assert_eq!(c.snapshots.hook_env, ["7"]);
}

#[test]
fn keys_that_are_not_lists_keep_their_commas() {
    // A string key keeps its whole value, commas and all.
    let c = load_str("", &[("DEDUPE_KAFKA_BROKERS", "a:9092,b:9092")]).unwrap();
    assert_eq!(c.kafka.brokers, "a:9092,b:9092");
    // The partition set is written with commas but is not a list key (its default is unset):
    // it reaches its own parser as one string.
    let c = load_str("", &[("DEDUPE_WORKER_PARTITIONS", "0-3,7")]).unwrap();
    assert_eq!(c.worker.partitions, Some(PartitionSet(vec![0, 1, 2, 3, 7])));
    // A number is still a number; a comma-separated value for it is refused, naming the key.
    let c = load_str("", &[("DEDUPE_LEDGER_GENERATIONS", "4")]).unwrap();
    assert_eq!(c.ledger.generations, 4);
    let err = load_str("", &[("DEDUPE_LEDGER_GENERATIONS", "4,5")])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("ledger.generations"), "{err}");
}

#[test]
fn the_snapshot_pace_is_checked_naming_the_key() {
    // A schedule as long as the least interval, and a schedule turned off, are both fine.
    let c = load_str(
        "[snapshots]\nmin_interval_secs = 600\ninterval_secs = 600\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.snapshots.min_interval_secs, 600);
    load_str(
        "[snapshots]\nmin_interval_secs = 600\ninterval_secs = 0\n",
        &[],
    )
    .unwrap();
    let cases = [
        (
            "min_interval_secs = 0",
            "snapshots.min_interval_secs: must be at least 1",
        ),
        // The schedule would be skipped every other time.
        (
            "interval_secs = 30",
            "snapshots.interval_secs: must be at least snapshots.min_interval_secs (60), or 0",
        ),
    ];
    for (line, starts) in cases {
        let err = load_str(&format!("[snapshots]\n{line}\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(starts), "{line}: {err}");
    }
}

#[test]
fn a_bad_source_mode_names_its_source_and_the_modes() {
    // In the table form: the key, the source and the allowed values, not serde's untagged
    // enum's "data did not match any variant".
    let err = load_str(
        "[worker.source_modes]\nweb = \"flag\"\nimport = \"flagg\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("worker.source_modes"), "{err}");
    assert!(err.contains("`import`") && err.contains("`flagg`"), "{err}");
    assert!(err.contains("drop, flag or off"), "{err}");
    assert!(!err.contains("variant"), "{err}");
    // A mode that is not text is named too.
    let err = load_str("[worker.source_modes]\nweb = 1\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("worker.source_modes"), "{err}");
    assert!(!err.contains("variant"), "{err}");
    // The text form (the environment's) says the same.
    let err = load_str(
        "",
        &[("DEDUPE_WORKER_SOURCE_MODES", "web=flag,import=flagg")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`flagg` is not a mode: drop, flag or off"),
        "{err}"
    );
    // Good modes in both forms.
    let c = load_str(
        "[worker.source_modes]\nweb = \"flag\"\nimport = \"off\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.worker.source_modes.of(Some(b"web")), SourceMode::Flag);
    assert_eq!(c.worker.source_modes.of(Some(b"import")), SourceMode::Off);
    let c = load_str("", &[("DEDUPE_WORKER_SOURCE_MODES", "web=flag")]).unwrap();
    assert_eq!(c.worker.source_modes.of(Some(b"web")), SourceMode::Flag);
}

#[test]
fn a_retention_limit_is_positive_never_below_the_promise_and_set_from_the_environment() {
    let c = load_str(
        "[worker]\npromised_window_secs = 3600\n",
        &[("DEDUPE_LEDGER_MAX_WINDOW_SECS", "7200")],
    )
    .unwrap();
    assert_eq!(c.ledger.max_window_secs, Some(7200));
    assert_eq!(c.ledger.options().max_window_ms, Some(7_200_000));
    assert_eq!(
        load_str("", &[]).unwrap().ledger.options().max_window_ms,
        None
    );
    let err = load_str("[ledger]\nmax_window_secs = 3600\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "ledger.max_window_secs: 3600 s is shorter than worker.promised_window_secs (86400 s)"
        ),
        "{err}"
    );
    let err = load_str("[ledger]\nmax_window_secs = 0\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("ledger.max_window_secs: must be positive"),
        "{err}"
    );
    let err = load_str("", &[("DEDUPE_LEDGER_MAX_WINDOW_SECS", "-5")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ledger.max_window_secs"), "{err}");
    let err = load_str("[ledger]\nmax_window_secs = 999999999999\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("largest limit"), "{err}");
    let c = load_str("[ledger]\nrefresh_on_duplicate = true\n", &[]).unwrap();
    assert!(c.ledger.options().refresh_on_duplicate);
}
