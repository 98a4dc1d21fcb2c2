//! Write keys and authentication: which source a request is from. A write key stands for one
//! source (a website, an app, a server); keys are never logged, and errors never quote them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine;
use dedupe::wire::SOURCE_SEPARATOR;

use super::MAX_SOURCE_BYTES;

/// The environment variable holding write keys as `KEY=SOURCE,KEY2=SOURCE2`.
pub const ENV_WRITE_KEYS: &str = "DEDUPE_WRITE_KEYS";

/// Why a request is refused with 401. Never names the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("a write key is required: HTTP Basic auth with the key as user name, or `writeKey` in the body")]
    Missing,
    #[error("the Authorization header is not HTTP Basic auth with a write key as user name")]
    Malformed,
    #[error("the write key is not known")]
    Unknown,
}

impl AuthError {
    /// The `reason` label and `code` field for this refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing_write_key",
            Self::Malformed => "malformed_authorization",
            Self::Unknown => "unknown_write_key",
        }
    }
}

/// Why the write keys could not be loaded. Never quotes a key.
#[derive(Debug, thiserror::Error)]
pub enum WriteKeysError {
    #[error("cannot read the write keys file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{origin}, entry {entry}: {message}")]
    Invalid {
        origin: String,
        entry: usize,
        message: String,
    },
    #[error("no write keys: set ingest.write_keys_file (--write-keys-file) or {ENV_WRITE_KEYS}")]
    Empty,
}

/// The write keys and the source each one stands for. `Debug` lists sources, never keys.
#[derive(Clone, Default)]
pub struct WriteKeys {
    sources: HashMap<String, String>,
}

impl fmt::Debug for WriteKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sources: Vec<&str> = self.sources.values().map(String::as_str).collect();
        sources.sort_unstable();
        f.debug_struct("WriteKeys")
            .field("keys", &self.sources.len())
            .field("sources", &sources)
            .finish()
    }
}

impl WriteKeys {
    /// Loads keys from the file (`KEY SOURCE` per line, `#` comments, blank lines ignored) and
    /// from the environment's `KEY=SOURCE,...`; both may be given. Having none is an error.
    pub fn load(file: Option<&Path>, env: Option<&str>) -> Result<Self, WriteKeysError> {
        let mut keys = Self::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| WriteKeysError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            keys.add_file(&path.display().to_string(), &text)?;
        }
        if let Some(text) = env {
            keys.add_env(text)?;
        }
        if keys.sources.is_empty() {
            return Err(WriteKeysError::Empty);
        }
        Ok(keys)
    }

    /// Adds the `KEY SOURCE` lines of a write keys file; `origin` names it in errors.
    pub fn add_file(&mut self, origin: &str, text: &str) -> Result<(), WriteKeysError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(key), Some(source), None) = (words.next(), words.next(), words.next()) else {
                return Err(invalid(origin, i + 1, "must be `KEY SOURCE`"));
            };
            self.add(origin, i + 1, key, source)?;
        }
        Ok(())
    }

    /// Adds `KEY=SOURCE,KEY2=SOURCE2` as `DEDUPE_WRITE_KEYS` holds them.
    pub fn add_env(&mut self, text: &str) -> Result<(), WriteKeysError> {
        for (i, entry) in text
            .split(',')
            .map(str::trim)
            .enumerate()
            .filter(|(_, e)| !e.is_empty())
        {
            let Some((key, source)) = entry.split_once('=') else {
                return Err(invalid(ENV_WRITE_KEYS, i + 1, "must be `KEY=SOURCE`"));
            };
            self.add(ENV_WRITE_KEYS, i + 1, key.trim(), source.trim())?;
        }
        Ok(())
    }

    fn add(
        &mut self,
        origin: &str,
        entry: usize,
        key: &str,
        source: &str,
    ) -> Result<(), WriteKeysError> {
        if key.is_empty() {
            return Err(invalid(origin, entry, "the key is empty"));
        }
        if source.is_empty() || source.len() > MAX_SOURCE_BYTES {
            return Err(invalid(
                origin,
                entry,
                format!("the source must be 1 to {MAX_SOURCE_BYTES} bytes"),
            ));
        }
        if source.contains(SOURCE_SEPARATOR) || source.chars().any(char::is_control) {
            return Err(invalid(
                origin,
                entry,
                format!("the source must not contain `{SOURCE_SEPARATOR}` or control characters"),
            ));
        }
        if self
            .sources
            .insert(key.to_string(), source.to_string())
            .is_some()
        {
            return Err(invalid(origin, entry, "repeats a write key given earlier"));
        }
        Ok(())
    }

    /// The source `key` stands for, if it is known.
    pub fn source(&self, key: &str) -> Option<&str> {
        self.sources.get(key).map(String::as_str)
    }

    /// Every source a key stands for (a source with two keys appears twice).
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.sources.values().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.sources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The source a request is from: the key in the `Authorization` header (HTTP Basic, key as
    /// user name; the password is ignored) if there is one, else `writeKey` from the body.
    pub fn authenticate(
        &self,
        authorization: Option<&str>,
        body_key: Option<&str>,
    ) -> Result<&str, AuthError> {
        let key = match authorization {
            Some(header) => Cow::Owned(basic_auth_user(header)?),
            None => Cow::Borrowed(body_key.ok_or(AuthError::Missing)?),
        };
        if key.is_empty() {
            return Err(AuthError::Missing);
        }
        self.source(&key).ok_or(AuthError::Unknown)
    }
}

fn invalid(origin: &str, entry: usize, message: impl Into<String>) -> WriteKeysError {
    WriteKeysError::Invalid {
        origin: origin.to_string(),
        entry,
        message: message.into(),
    }
}

/// The user name of an HTTP Basic `Authorization` header value.
pub fn basic_auth_user(header: &str) -> Result<String, AuthError> {
    let header = header.trim();
    let (scheme, encoded) = header.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AuthError::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| AuthError::Malformed)?;
    let text = String::from_utf8(decoded).map_err(|_| AuthError::Malformed)?;
    let (user, _password) = text.split_once(':').ok_or(AuthError::Malformed)?;
    Ok(user.to_string())
}
