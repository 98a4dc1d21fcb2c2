//! Every metric and every warning or error of the workspace goes through its instrumentation
//! modules: event structs whose `emit` writes the log line and the count together, so the two
//! never drift apart (see docs/architecture.md, "Instrumentation"). This test reads every crate's
//! sources and fails, naming the file and line, on
//!
//! - a `metrics` macro (`counter!`, `gauge!`, `histogram!`; `describe_*!` aside) outside those
//!   modules, anywhere, test code included;
//! - a `warn!` or `error!` (as `tracing::warn!`, or imported by `use tracing::{warn, error}`), or a
//!   `tracing::event!` at `Level::WARN` or `Level::ERROR`, outside those modules, in production
//!   code (test code, `tests.rs` files and `tests/` may log freely);
//! - a log line inside those modules that does not name its event (`event = "PartitionsLost"`),
//!   which is what lets a test record which events fired (`dedupe::metrics::recorder`).
//!
//! The scan is not blind: it counts the calls it finds inside the modules, and its scanner is
//! checked on a made-up file (comments, strings and test code skipped).

use std::path::{Path, PathBuf};

use kit::source::{strip_comments_and_literals, tokenize, without_test_code, Token};

/// The instrumentation modules: the core's events, the worker's, the binary's, the rekey stage's
/// and the front door's.
const INSTRUMENTATION: [&str; 5] = [
    "src/metrics/",
    "actors/src/events/",
    "cli/src/events.rs",
    "cli/src/rekey/events.rs",
    "tracking/src/server/events.rs",
];

/// Every crate's sources, and the integration tests (metrics macros are refused there too).
const SOURCES: [&str; 5] = ["src", "actors/src", "cli/src", "tracking/src", "tests"];

const METRICS: [&str; 3] = ["counter", "gauge", "histogram"];
const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// One macro call found: its line and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    line: usize,
    name: String,
    /// Whether its arguments hold an `event = …` field.
    named: bool,
}

/// The macro calls of `tokens` whose name `wanted` accepts: `name!(…)`, `name![…]`, `name!{…}`.
fn macro_calls(tokens: &[Token], wanted: impl Fn(&str, &[Token]) -> bool) -> Vec<Call> {
    let mut calls = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let opens = tokens.get(i + 1).is_some_and(|b| b.text == "!")
            && tokens
                .get(i + 2)
                .is_some_and(|o| matches!(o.text.as_str(), "(" | "[" | "{"));
        if !opens {
            continue;
        }
        let end = kit::source::closing(tokens, i + 2);
        let args = &tokens[i + 3..end.saturating_sub(1).max(i + 3)];
        if wanted(&t.text, args) {
            calls.push(Call {
                line: t.line,
                name: t.text.clone(),
                named: names_its_event(args),
            });
        }
    }
    calls
}

/// Whether a log macro's arguments hold the field `event = …`.
fn names_its_event(args: &[Token]) -> bool {
    args.windows(3)
        .any(|w| w[0].text == "event" && w[1].text == "=" && w[2].text != "=")
}

/// Whether `tracing::event!`'s arguments give it the level WARN or ERROR.
fn at_warn_or_error(args: &[Token]) -> bool {
    args.windows(3).any(|w| {
        w[0].text == "Level" && w[1].text == "::" && matches!(w[2].text.as_str(), "WARN" | "ERROR")
    })
}

fn code_tokens(source: &str) -> Vec<Token> {
    tokenize(&strip_comments_and_literals(source))
}

/// The `metrics` macro calls of a file, test code included.
fn metrics_calls(source: &str) -> Vec<Call> {
    macro_calls(&code_tokens(source), |name, _| METRICS.contains(&name))
}

/// The warnings and errors logged by a file's production code.
fn warning_calls(source: &str) -> Vec<Call> {
    macro_calls(&without_test_code(code_tokens(source)), |name, args| {
        matches!(name, "warn" | "error") || (name == "event" && at_warn_or_error(args))
    })
}

/// Every log line of a file's production code, at any level.
fn log_calls(source: &str) -> Vec<Call> {
    macro_calls(&without_test_code(code_tokens(source)), |name, _| {
        LEVELS.contains(&name) || name == "event"
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Test code as a whole file: the integration tests and their kit, and `tests.rs` modules.
fn is_test_file(relative: &str) -> bool {
    relative.starts_with("tests/")
        || relative.contains("/tests/")
        || relative.ends_with("/tests.rs")
}

#[test]
fn only_the_instrumentation_modules_count_and_warn() {
    let root = kit::repo_root();
    let mut files = Vec::new();
    for dir in SOURCES {
        rust_files(&root.join(dir), &mut files);
    }
    let (mut outside, mut unnamed) = (Vec::new(), Vec::new());
    let (mut metrics_inside, mut warnings_inside, mut logs_inside) = (0, 0, 0);
    for file in &files {
        let relative = file.strip_prefix(&root).expect("under the root");
        let relative = relative.to_string_lossy().replace('\\', "/");
        let source = std::fs::read_to_string(file).expect("readable source");
        let at = |c: &Call| format!("{relative}:{}: {}!", c.line, c.name);
        if INSTRUMENTATION.iter().any(|m| relative.starts_with(m)) {
            metrics_inside += metrics_calls(&source).len();
            warnings_inside += warning_calls(&source).len();
            let logs = log_calls(&source);
            logs_inside += logs.len();
            unnamed.extend(logs.iter().filter(|c| !c.named).map(at));
            continue;
        }
        outside.extend(metrics_calls(&source).iter().map(at));
        if !is_test_file(&relative) {
            outside.extend(warning_calls(&source).iter().map(at));
        }
    }
    // The scan sees the calls where they belong: it is not blind.
    assert!(
        metrics_inside > 40,
        "only {metrics_inside} metrics calls found in the instrumentation modules"
    );
    assert!(
        warnings_inside > 60,
        "only {warnings_inside} warnings and errors found in the instrumentation modules"
    );
    assert!(logs_inside > warnings_inside);
    assert!(
        outside.is_empty(),
        "metrics macros, or warnings and errors logged, outside the instrumentation modules \
         ({INSTRUMENTATION:?}); emit an event from one of them instead:\n{}",
        outside.join("\n")
    );
    assert!(
        unnamed.is_empty(),
        "log lines of the instrumentation modules that do not name their event \
         (event = \"StructName\"):\n{}",
        unnamed.join("\n")
    );
}

#[test]
fn the_scanner_finds_calls_and_skips_comments_strings_and_test_code() {
    let source = r####"
use tracing::{error, warn};
fn f() {
    metrics::counter!(A).increment(1);
    // gauge!(B) and warn!("in a comment")
    /* error!("in a block comment") */
    metrics::describe_gauge!(C, "x");
    let h = histogram!(D);
    my_counter!(E);
    let s = "tracing::warn!(in a string)";
    let r = r#"error!("in a raw string")"#;
    tracing::warn!(partition = 3, "Taking it over again.");
    warn!("Imported.");
    error!(event = "Named", "Named.");
    tracing::event!(tracing::Level::ERROR, "At error.");
    tracing::event!(Level::INFO, "At info.");
    tracing::info!("Information.");
    log_warn!("Another macro.");
    let c = '"'; warn!("After a quote character.");
}
#[cfg(test)]
mod tests {
    fn g() {
        tracing::warn!("Test code may log.");
        metrics::counter!(F).increment(1);
    }
}
"####;
    let lines = |calls: Vec<Call>| -> Vec<usize> { calls.into_iter().map(|c| c.line).collect() };
    assert_eq!(lines(metrics_calls(source)), [4, 8, 25]);
    assert_eq!(lines(warning_calls(source)), [12, 13, 14, 15, 19]);
    let logs = log_calls(source);
    assert_eq!(lines(logs.clone()), [12, 13, 14, 15, 16, 17, 19]);
    let named: Vec<usize> = logs.iter().filter(|c| c.named).map(|c| c.line).collect();
    assert_eq!(named, [14]);
    // A whole test file is test code.
    assert!(is_test_file("actors/src/consumer/tests.rs"));
    assert!(is_test_file("tests/kit/src/worker.rs"));
    assert!(!is_test_file("actors/src/consumer/protocol.rs"));
}
