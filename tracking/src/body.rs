//! A request's body before it is parsed: the content types taken as JSON, and decoding (gzip)
//! within the size limit.

use std::borrow::Cow;
use std::io::Read;

use super::{Rejection, MAX_REQUEST_BYTES};

/// Checks a request's `Content-Type`: JSON is taken as `application/json`, as `text/plain` (what
/// Segment's browser library and `navigator.sendBeacon` send, because a text body needs no CORS
/// preflight), or with no type at all; parameters such as `charset` are ignored. A refusal does
/// not repeat the header's value: it is the client's text, and answers must not echo it.
pub fn check_content_type(content_type: Option<&str>) -> Result<(), Rejection> {
    let Some(value) = content_type else {
        return Ok(());
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    if essence.is_empty()
        || ["application/json", "text/plain"]
            .iter()
            .any(|t| essence.eq_ignore_ascii_case(t))
    {
        return Ok(());
    }
    Err(Rejection::UnsupportedContentType)
}

/// The request body as JSON bytes: decompressed when `Content-Encoding` is gzip, and never more
/// than [`MAX_REQUEST_BYTES`] either way. Decompression stops one byte past the limit, so a small
/// gzip bomb cannot make a large buffer.
pub fn decode_body<'a>(
    raw: &'a [u8],
    content_encoding: Option<&str>,
) -> Result<Cow<'a, [u8]>, Rejection> {
    let too_large = Rejection::RequestTooLarge {
        limit: MAX_REQUEST_BYTES,
    };
    if raw.len() > MAX_REQUEST_BYTES {
        return Err(too_large);
    }
    let encoding = content_encoding
        .map(|e| e.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match encoding.as_str() {
        "" | "identity" => Ok(Cow::Borrowed(raw)),
        "gzip" | "x-gzip" => {
            let mut out = Vec::with_capacity(raw.len() * 4);
            flate2::read::MultiGzDecoder::new(raw)
                .take(MAX_REQUEST_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| Rejection::BadGzip(e.to_string()))?;
            if out.len() > MAX_REQUEST_BYTES {
                return Err(too_large);
            }
            Ok(Cow::Owned(out))
        }
        _ => Err(Rejection::UnsupportedEncoding),
    }
}
