//! The `dedupe` binary's command line, run as a user would.

use std::process::Command;

fn dedupe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupe"))
}

#[test]
fn ingest_subcommand_has_its_flags() {
    let out = dedupe().args(["ingest", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--listen",
        "--brokers",
        "--topic",
        "--write-keys-file",
    ] {
        assert!(
            help.contains(flag),
            "`dedupe ingest --help` lacks {flag}:\n{help}"
        );
    }
}

#[test]
fn ingest_refuses_to_start_without_write_keys() {
    let out = dedupe()
        .args(["ingest", "--listen", "127.0.0.1:0"])
        .env_remove("DEDUPE_WRITE_KEYS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no write keys"), "{err}");
}

#[test]
fn config_check_never_prints_secret_kafka_properties() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedupe.toml");
    std::fs::write(
        &path,
        "[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"ssl.key.password\" = \"k3y-pass\"\n\"ssl.ca.location\" = \"/etc/ca.pem\"\n",
    )
    .unwrap();
    let out = dedupe()
        .args(["config", "check", "--config"])
        .arg(&path)
        // As Secrets mounted from files hold them.
        .env("DEDUPE_ADMIN_TOKEN", "adm1n-t0ken\n")
        .env("DEDUPE_KAFKA_SASL_PASSWORD", "env-passw0rd\n")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    for secret in ["hunter2", "k3y-pass", "adm1n-t0ken", "env-passw0rd"] {
        assert!(
            !all.contains(secret),
            "`config check` printed {secret}:\n{all}"
        );
    }
    assert!(
        all.contains("/etc/ca.pem") && all.contains("<redacted>"),
        "{all}"
    );
}

#[test]
fn an_admin_token_a_header_cannot_carry_is_refused_at_start_without_being_echoed() {
    for token in ["  \n", "adm1n t0ken", "adm1n\nt0ken"] {
        let out = dedupe()
            .args(["config", "check"])
            .env("DEDUPE_ADMIN_TOKEN", token)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{token:?}: {err}");
        assert!(err.contains("DEDUPE_ADMIN_TOKEN"), "{token:?}: {err}");
        assert!(!err.contains("adm1n") && !err.contains("t0ken"), "{err}");
    }
}

#[test]
fn a_toml_syntax_error_names_the_line_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedupe.toml");
    std::fs::write(
        &path,
        "[kafka]\nbrokers = \"b:9092\"\n[kafka.properties]\n\"sasl.password\" = \"hunter2\n",
    )
    .unwrap();
    let out = dedupe()
        .args(["config", "check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        !err.contains("hunter2"),
        "the syntax error echoed the secret:\n{err}"
    );
    assert!(err.contains("line 4"), "{err}");
}

#[test]
fn restore_from_a_mistyped_directory_creates_nothing_and_replaces_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("ledger");
    // A real ledger to protect, holding one marker file of ours beside RocksDB's.
    std::fs::create_dir_all(&data_dir).unwrap();
    let typo = dir.path().join("snapshots/ledger-00000000000001");
    for force in [false, true] {
        let mut cmd = dedupe();
        cmd.args(["ledger", "restore", "--from"])
            .arg(&typo)
            .arg("--data-dir")
            .arg(&data_dir);
        if force {
            cmd.arg("--force");
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "restore from a missing directory succeeded (force {force})"
        );
        assert!(err.contains("does not exist"), "{err}");
        assert!(!typo.exists(), "restore created {}", typo.display());
    }
    // An empty directory is no checkpoint either.
    std::fs::create_dir_all(&typo).unwrap();
    let out = dedupe()
        .args(["ledger", "restore", "--force", "--from"])
        .arg(&typo)
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is empty"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&typo).unwrap().count(),
        0,
        "restore wrote into the empty directory"
    );
    assert!(
        data_dir.exists(),
        "the ledger directory was moved aside for nothing"
    );
}

#[test]
fn version_names_the_release_its_commit_and_every_format() {
    let out = dedupe().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("dedupe {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    for format in [
        "ledger: writes 4",
        "id index: writes 3",
        "snapshot:",
        "id changelog record kinds:",
        "audit record: writes 1",
        "front door headers: writes dedupe-source",
    ] {
        assert!(text.contains(format), "{format} in:\n{text}");
    }
    // -V: one line.
    let out = dedupe().arg("-V").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}
