//! The `dedupe` binary's command line, run as a user would. (Having an integration test here also
//! makes `cargo test --workspace` build the binary that the top-level `tests/ingest.rs` starts.)

use std::process::Command;

fn dedupe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupe"))
}

#[test]
fn ingest_subcommand_has_its_flags() {
    let out = dedupe().args(["ingest", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--config", "--listen", "--brokers", "--topic", "--write-keys-file"] {
        assert!(help.contains(flag), "`dedupe ingest --help` lacks {flag}:\n{help}");
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
