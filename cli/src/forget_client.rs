//! `dedupe forget ID... [--json-id JSON]... [--file FILE]`: asks the running worker (`POST /admin/forget` at its
//! metrics address) to forget ids, [`crate::http::forget_route::MAX_IDS`] per request, and prints
//! each answer as one JSON line. Its exit code ([`Outcome::code`]) is what `dedupe forget --help`
//! says: 0 when every id was forgotten on every partition it may be on, 2 when none was
//! forgotten anywhere (or nothing could be asked), 1 otherwise.

use std::io::BufRead;
use std::time::Duration;

use anyhow::Context;
use dedupe::config::Config;
use serde_json::json;

use crate::admin_client::{authorized, eprint_line, print_line, transport_error};
use crate::args::ForgetArgs;
use crate::http::forget_route::MAX_IDS;

/// What a `dedupe forget` came to: the exit code and the last line (on standard output for 0,
/// standard error otherwise).
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub code: u8,
    pub message: String,
}

/// The ids of a command by how far each was forgotten (the answers' `forgotten`, `partial` and
/// `failed`; ids never asked about count as failed).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Forgot {
    pub ids: u64,
    pub forgotten: u64,
    pub partial: u64,
    pub failed: u64,
}

impl Forgot {
    /// The exit code and the last line; `error` is why the command stopped asking, if it did.
    pub fn outcome(&self, error: Option<&str>) -> Outcome {
        let Forgot {
            ids,
            forgotten,
            partial,
            failed,
        } = *self;
        let why = error.map(|e| format!(": {e}")).unwrap_or_default();
        if forgotten == ids && error.is_none() {
            return Outcome {
                code: 0,
                message: format!("forgot {forgotten} ids"),
            };
        }
        if forgotten + partial == 0 {
            return Outcome {
                code: 2,
                message: format!("{failed} of {ids} ids were not forgotten (see `failed` and `not_done` above){why}"),
            };
        }
        Outcome {
            code: 1,
            message: format!(
                "{} of {ids} ids were not forgotten on every partition they may be on ({partial} on some, {failed} on none; see `partial`, `failed` and `not_done` above); {forgotten} were{why}",
                partial + failed
            ),
        }
    }
}

/// An id to forget, and whether it is one JSON value's text (`--json-id`).
type Asked = (String, bool);

/// The body of one request: the ids as the worker reads them, and those named as JSON values
/// (`json_ids` only when there are any, so that a worker older than it still takes the rest).
fn request_body(chunk: &[Asked], args: &ForgetArgs, by: &str) -> serde_json::Value {
    let of = |json: bool| -> Vec<&str> {
        chunk
            .iter()
            .filter(|(_, j)| *j == json)
            .map(|(id, _)| id.as_str())
            .collect()
    };
    let mut body = json!({
        "ids": of(false),
        "by": by,
        "reason": args.reason,
        "source": args.source,
        "partition": args.partition,
    });
    let json_ids = of(true);
    if !json_ids.is_empty() {
        body["json_ids"] = json!(json_ids);
    }
    body
}

/// Forgets the ids of `args` (and of its file); prints each answer, then says what it came to.
pub fn forget(config: &Config, args: &ForgetArgs) -> Outcome {
    let mut ids: Vec<Asked> = args.ids.iter().map(|id| (id.clone(), false)).collect();
    ids.extend(args.json_ids.iter().map(|id| (id.clone(), true)));
    if let Some(file) = &args.file {
        match read_ids(file) {
            Ok(more) => ids.extend(more.into_iter().map(|id| (id, false))),
            Err(e) => return failed(format!("{e:#}")),
        }
    }
    if ids.is_empty() {
        return failed("no ids to forget: name them, give --json-id, or give --file".into());
    }
    let addr = config.metrics.addr;
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(Duration::from_secs(300))
        .build();
    let by = args.by.clone().unwrap_or_else(whoami);
    let mut forgot = Forgot {
        ids: ids.len() as u64,
        ..Forgot::default()
    };
    let mut held = 0u64;
    let mut asked = 0u64;
    for chunk in ids.chunks(MAX_IDS) {
        let body = request_body(chunk, args, &by);
        let request = authorized(agent.post(&format!("http://{addr}/admin/forget")), config)
            .set("Content-Type", "application/json");
        let answer = match ask(request, &body, addr) {
            Ok(answer) => answer,
            Err(e) => {
                forgot.failed += forgot.ids - asked;
                return forgot.outcome(Some(&e));
            }
        };
        asked += chunk.len() as u64;
        held += answer["done"].as_array().map_or(0, |d| {
            d.iter().filter_map(|r| r["held_by_worker"].as_u64()).sum()
        });
        let count = |field: &str| answer[field].as_u64().unwrap_or(0);
        forgot.forgotten += count("forgotten");
        forgot.partial += count("partial");
        forgot.failed += count("failed");
        // The answer was acted on whatever happens to its line; a reader that went away is no
        // error (see `print_line`), a full disk is, and the ids not yet asked about are not.
        if let Err(e) = print_line(&answer.to_string()) {
            forgot.failed += forgot.ids - asked;
            return forgot.outcome(Some(&format!("writing to standard output: {e}")));
        }
    }
    // The front door's ids are text: no hint about its sources for ids named as JSON values.
    let texts = args.json_ids.is_empty();
    if held == 0 && forgot.forgotten + forgot.partial > 0 && args.source.is_none() && texts {
        eprint_line("note: the worker held none of these ids. Ids the front door (dedupe ingest) writes are held as <source>:<messageId>: give --source NAME (the write key's source) to forget those.");
    }
    forgot.outcome(None)
}

/// Nothing could be asked.
fn failed(message: String) -> Outcome {
    Outcome { code: 2, message }
}

/// Sends one request; its answer (200 and 409 both carry one), or why there is none.
fn ask(
    request: ureq::Request,
    body: &serde_json::Value,
    addr: std::net::SocketAddr,
) -> Result<serde_json::Value, String> {
    let read = |response: ureq::Response| -> Result<serde_json::Value, String> {
        serde_json::from_reader(response.into_reader())
            .map_err(|e| format!("reading the answer of the worker at {addr}: {e}"))
    };
    match request.send_string(&body.to_string()) {
        Ok(response) => read(response),
        Err(ureq::Error::Status(409, response)) => read(response),
        Err(ureq::Error::Status(status, response)) => {
            let body = response.into_string().unwrap_or_default();
            Err(format!(
                "the worker at {addr} refused the forget ({status}): {}",
                crate::explain_client::error_of(&body)
            ))
        }
        Err(ureq::Error::Transport(t)) => Err(format!(
            "asking the worker at {addr} to forget: {} (forget needs the running worker that owns the ids' partitions)",
            transport_error(&t)
        )),
    }
}

/// Ids from a file (`-`: standard input), one per line; blank lines and `#` comments skipped.
fn read_ids(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(path)
            .with_context(|| format!("reading ids from {}", path.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    let mut ids = Vec::new();
    for line in reader.lines() {
        let line = line.with_context(|| format!("reading ids from {}", path.display()))?;
        let id = line.trim();
        if !id.is_empty() && !id.starts_with('#') {
            ids.push(id.to_string());
        }
    }
    Ok(ids)
}

/// The user running the command, `USER@HOST` as the environment and the kernel name them.
fn whoami() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown user".to_string());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    if host.is_empty() {
        user
    } else {
        format!("{user}@{host}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_says_whether_all_some_or_none_were_forgotten() {
        let of = |forgotten, partial, failed| Forgot {
            ids: forgotten + partial + failed,
            forgotten,
            partial,
            failed,
        };
        assert_eq!(of(3, 0, 0).outcome(None).code, 0);
        // An id forgotten on one of its two partitions: the other's next copy is still dropped.
        assert_eq!(of(0, 1, 0).outcome(None).code, 1);
        assert_eq!(of(2, 0, 1).outcome(None).code, 1);
        assert_eq!(of(0, 0, 2).outcome(None).code, 2);
        // A request that failed after earlier ones went through: some were forgotten.
        assert_eq!(of(2, 0, 3).outcome(Some("timed out")).code, 1);
        assert_eq!(of(0, 0, 3).outcome(Some("refused")).code, 2);
        let partial = of(1, 1, 1).outcome(None).message;
        assert!(partial.contains("2 of 3 ids"), "{partial}");
    }

    fn args(flags: &[&str]) -> ForgetArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            forget: ForgetArgs,
        }
        let argv = std::iter::once("forget").chain(flags.iter().copied());
        Cli::try_parse_from(argv).unwrap().forget
    }

    #[test]
    fn ids_named_as_json_values_go_in_json_ids_and_only_when_there_are_some() {
        let a = args(&[
            "m-1",
            "--json-id",
            "12345678901234567890",
            "--json-id",
            r#""abc""#,
            "--partition",
            "0",
        ]);
        let asked: Vec<Asked> = vec![
            ("m-1".into(), false),
            ("12345678901234567890".into(), true),
            (r#""abc""#.into(), true),
        ];
        let body = request_body(&asked, &a, "alice");
        assert_eq!(body["ids"], json!(["m-1"]));
        assert_eq!(
            body["json_ids"],
            json!(["12345678901234567890", r#""abc""#])
        );
        assert_eq!(body["partition"], 0);
        // Without JSON ids the body is what a worker older than them takes.
        let body = request_body(&asked[..1], &a, "alice");
        assert!(body.get("json_ids").is_none(), "{body}");
        // The route reads the body the command sends.
        let route: crate::http::forget_route::ForgetBody =
            serde_json::from_value(request_body(&asked, &a, "alice")).unwrap();
        assert_eq!(route.json_ids.len(), 2);
    }

    #[test]
    fn a_json_id_is_not_scoped_by_the_front_doors_source() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            forget: ForgetArgs,
        }
        let e = Cli::try_parse_from(["forget", "--json-id", "1", "--source", "web"])
            .err()
            .unwrap();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--source"), "{e}");
    }
}
