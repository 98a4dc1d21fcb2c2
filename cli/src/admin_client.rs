//! What the operator's commands (`dedupe forget`, `dedupe explain`, `dedupe ledger snapshot`)
//! share to call the worker's admin endpoints: the bearer token set on a request, and a transport
//! error told without anything of the request's headers, so that no error path prints the token.

use dedupe::config::Config;

/// `request` with `Authorization: Bearer <DEDUPE_ADMIN_TOKEN>` when a token is set (cleaned
/// where the configuration is loaded: see `dedupe::config::admin_token`).
pub fn authorized(request: ureq::Request, config: &Config) -> ureq::Request {
    match &config.metrics.admin_token {
        Some(token) => request.set("Authorization", &format!("Bearer {}", token.expose())),
        None => request,
    }
}

/// A transport error in words: its kind, its message and its cause, except the message of a bad
/// header, which quotes the header line (the token, for `Authorization`).
pub fn transport_error(t: &ureq::Transport) -> String {
    let mut text = t.kind().to_string();
    if let Some(message) = t
        .message()
        .filter(|_| t.kind() != ureq::ErrorKind::BadHeader)
    {
        text.push_str(": ");
        text.push_str(message);
    }
    if let Some(source) = std::error::Error::source(t) {
        text.push_str(": ");
        text.push_str(&source.to_string());
    }
    text
}

/// Writes `text` and a newline to standard output. A reader that went away (`dedupe explain ID |
/// head -1`) is not an error: the rest of the output is not wanted, and the command ends as it
/// would have (its exit code says what it did), without a panic.
pub fn print_line(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        done => done,
    }
}

/// Writes `text` and a newline to standard error, ignoring a reader that went away.
pub fn eprint_line(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_header_is_told_without_its_line() {
        // ureq refuses a header value with a newline when the request is sent, and its message
        // quotes the whole header line.
        let request = ureq::get("http://127.0.0.1:9/").set("Authorization", "Bearer s3cret\n");
        let Err(ureq::Error::Transport(t)) = request.call() else {
            panic!("a header with a newline was sent");
        };
        assert!(
            t.to_string().contains("s3cret"),
            "ureq's own text quotes it"
        );
        let told = transport_error(&t);
        assert!(!told.contains("s3cret"), "{told}");
        assert!(told.contains("Bad Header"), "{told}");
    }
}
