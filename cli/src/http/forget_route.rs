//! `POST /admin/forget`: forget ids, so that each one's next copy is published (see
//! `dedupe_actors::consumer::ForgetRequest`). Under the admin rules of [`super::admin`].
//!
//! Body (JSON): `{"ids": ["..."], "by": "who asks", "reason": "...", "source": "web",
//! "partition": 3}`; `id` may stand for a single id; `json_ids` names ids as the text of one JSON
//! value each (`["12345678901234567890", "\"abc\""]`: the number a `json:` id source read, and a
//! string), keyed as the worker keys them (`dedupe::identity::named_id`); `by` (the client's
//! address when missing), `reason`, `source` (the front door's source: the worker holds
//! `<source>:<id>`) and `partition` are optional. An id of `ids` that is a JSON number where the
//! id source reads JSON is refused with 400, naming both ways to ask: the text alone names the
//! string, which may not be the id meant. `DELETE /admin/ids/{id}` forgets one id, the same
//! fields in its query, and `json_id=true` for an id that is one JSON value's text (an id or a
//! query value that is not UTF-8 once percent-decoded is refused with 400: ids are text). `partition` is needed only when the id source
//! does not read ids from the record key (the partition of an id cannot be derived then). At most
//! [`MAX_IDS`] ids per request. An id read from the record key is forgotten on the partition each
//! common partitioner gives it (one or two), all with one time (see
//! `dedupe::ledger::forgotten_since`): the worker's partitions share its ledger, so the first copy
//! through on any of them ends the forget on all of them, and exactly one more copy is published
//! by this worker. The answer says how many ids were forgotten on every partition they may be on
//! (`forgotten`), on some but not all (`partial`), and on none (`failed`), and per partition what
//! was done (`done`) and what could not be (`not_done`, with the cause: a partition this worker
//! does not own, or one being taken over); 200 when every id was forgotten everywhere, 409
//! otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use dedupe::identity::{named_id, NamedId};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::admin::{id_of, Admin};
use dedupe_actors::consumer::{ForgetId, ForgetReport, ForgetRequest};
use dedupe_actors::coordinator::Forget;

/// Ids one request may forget.
pub const MAX_IDS: usize = 10_000;
/// The largest body taken: [`MAX_IDS`] ids of up to 1 KiB each would not fit, typical ids do.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Longest `by` and `reason`, in characters.
const MAX_BY_CHARS: usize = 200;
const MAX_REASON_CHARS: usize = 1000;
/// How long a partition's pipeline may take to do a forget (it waits for the batch under way).
const FORGET_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgetBody {
    /// The ids (`id` for one).
    #[serde(default)]
    pub ids: Vec<String>,
    #[serde(default)]
    pub id: Option<String>,
    /// Ids each named as the text of one JSON value (a number, or a string in double quotes).
    #[serde(default)]
    pub json_ids: Vec<String>,
    /// Who asks; the client's address when not given.
    #[serde(default)]
    pub by: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub partition: Option<i32>,
}

/// What could not be forgotten on one partition, and why.
#[derive(Debug, Serialize)]
struct Failed {
    partition: i32,
    ids: usize,
    error: String,
}

/// Checks a request's fields; the message names the field.
fn check(body: &ForgetBody, partitions: i32) -> Result<(), String> {
    let count = body.ids.len() + body.json_ids.len();
    if count == 0 {
        return Err("ids: give at least one id (or id, or json_ids)".into());
    }
    if count > MAX_IDS {
        return Err(format!(
            "ids: {count} ids, more than the {MAX_IDS} one request takes"
        ));
    }
    let text = |field: &str, value: &str, max: usize| {
        if value.chars().count() > max {
            return Err(format!("{field}: longer than {max} characters"));
        }
        if value.chars().any(char::is_control) {
            return Err(format!("{field}: holds control characters"));
        }
        Ok(())
    };
    if let Some(by) = &body.by {
        if by.trim().is_empty() {
            return Err("by: say who asks (it is written to the audit with each forget)".into());
        }
        text("by", by, MAX_BY_CHARS)?;
    }
    if let Some(reason) = &body.reason {
        text("reason", reason, MAX_REASON_CHARS)?;
    }
    if let Some(p) = body.partition {
        if !(0..partitions).contains(&p) {
            return Err(format!(
                "partition: {p} is not one of the input's {partitions} partitions"
            ));
        }
    }
    Ok(())
}

/// Per input partition, the ids to forget there, each with its place in the request.
type Groups = BTreeMap<i32, Vec<(usize, ForgetId)>>;

/// The request's ids by input partition, with their ledger keys; and how many partitions each id
/// goes to. An id read from the record key goes to the partition each common partitioner (the
/// Java client's murmur2, librdkafka's crc32) gives it: producers differ, and the worker takes
/// both as the id's own (see `dedupe::kafka::is_home`).
fn by_partition(body: &ForgetBody, admin: &Admin) -> Result<(Groups, Vec<usize>), String> {
    let t = &admin.targets;
    let mut groups = Groups::new();
    let mut wanted = Vec::with_capacity(body.ids.len() + body.json_ids.len());
    let texts = body
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| ("ids", i, NamedId::Text(id)));
    let jsons = body.json_ids.iter().enumerate();
    let named = texts.chain(jsons.map(|(i, id)| ("json_ids", i, NamedId::Json(id))));
    // `n` numbers the request's ids, those of `ids` first.
    for (n, (field, i, named)) in named.enumerate() {
        let named = named_id(named, body.source.as_deref(), &t.id_source)
            .map_err(|e| format!("{field}[{i}]: {e}"))?;
        let (id, key) = (named.id, named.key);
        let mut partitions: Vec<i32> = match body.partition {
            Some(p) => vec![p],
            None => [t.partitioner, t.partitioner.other()]
                .into_iter()
                .filter_map(|partitioner| {
                    crate::explain_client::partition_of_id(
                        &t.id_source,
                        partitioner,
                        id.as_bytes(),
                        t.input_partitions,
                    )
                })
                .collect(),
        };
        partitions.sort_unstable();
        partitions.dedup();
        wanted.push(partitions.len());
        if partitions.is_empty() {
            return Err(format!(
                "partition: the worker reads ids from {} rather than the record key, so the partition of an id cannot be derived; name it",
                t.id_source
            ));
        }
        for p in partitions {
            groups.entry(p).or_default().push((
                n,
                ForgetId {
                    id: id.clone(),
                    key,
                    // Set once the request's ids are looked up.
                    held_by_worker: false,
                },
            ));
        }
    }
    Ok((groups, wanted))
}

/// The query of `DELETE /admin/ids/{id}`: the body's fields but the ids, and whether the id is
/// one JSON value's text.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForgetQuery {
    by: Option<String>,
    reason: Option<String>,
    source: Option<String>,
    partition: Option<i32>,
    /// The id is the text of one JSON value.
    #[serde(default)]
    json_id: bool,
}

/// `POST /admin/forget`.
pub(crate) async fn admin_forget(
    req: HttpRequest,
    admin: web::Data<Admin>,
    body: web::Json<ForgetBody>,
) -> HttpResponse {
    let mut body = body.into_inner();
    body.ids.extend(body.id.take());
    forget(&req, &admin, body).await
}

/// `DELETE /admin/ids/{id}[?by=&reason=&source=&partition=]`: forgets one id, as `POST
/// /admin/forget` does.
pub(crate) async fn admin_forget_one(
    req: HttpRequest,
    admin: web::Data<Admin>,
    query: web::Query<ForgetQuery>,
) -> HttpResponse {
    let id = match id_of(&req) {
        Ok(id) => id,
        Err(e) => return HttpResponse::BadRequest().json(json!({ "error": e })),
    };
    let q = query.into_inner();
    let (ids, json_ids) = if q.json_id {
        (Vec::new(), vec![id])
    } else {
        (vec![id], Vec::new())
    };
    let body = ForgetBody {
        ids,
        id: None,
        json_ids,
        by: q.by,
        reason: q.reason,
        source: q.source,
        partition: q.partition,
    };
    forget(&req, &admin, body).await
}

/// Forgets the ids of `body` on each partition they may be on, and answers.
async fn forget(req: &HttpRequest, admin: &Admin, body: ForgetBody) -> HttpResponse {
    let (mut groups, wanted) = match check(&body, admin.targets.input_partitions)
        .and_then(|()| by_partition(&body, admin))
    {
        Ok(found) => found,
        Err(e) => return HttpResponse::BadRequest().json(json!({ "error": e })),
    };
    let at_ms = match look_up(admin, &mut groups).await {
        Ok(at_ms) => at_ms,
        Err(refused) => return refused,
    };
    let by = body.by.clone().unwrap_or_else(|| match req.peer_addr() {
        Some(peer) => format!("an admin client at {}", peer.ip()),
        None => "an admin client".to_string(),
    });
    let mut done: Vec<ForgetReport> = Vec::new();
    let mut not_done: Vec<Failed> = Vec::new();
    // Per id of the request: on how many of its partitions it was forgotten.
    let mut forgotten_on = vec![0usize; wanted.len()];
    for (partition, group) in groups {
        let (which, ids): (Vec<usize>, Vec<ForgetId>) = group.into_iter().unzip();
        let asked = forget_on(admin, partition, ids, &by, body.reason.as_deref(), at_ms);
        match asked.await {
            Ok(report) => {
                which.iter().for_each(|&n| forgotten_on[n] += 1);
                done.push(report);
            }
            Err(error) => not_done.push(Failed {
                partition,
                ids: which.len(),
                error,
            }),
        }
    }
    let tally = Tally::of(&forgotten_on, &wanted);
    let answer = json!({
        "forgotten": tally.forgotten,
        "partial": tally.partial,
        "failed": tally.failed,
        "done": done,
        "not_done": not_done,
    });
    if tally.partial == 0 && tally.failed == 0 {
        HttpResponse::Ok().json(answer)
    } else {
        HttpResponse::Conflict().json(answer)
    }
}

/// Looks the request's ids up in the ledger before any partition forgets them: marks those the
/// worker holds now (for the audit), and returns the forget's time, one for every partition of
/// the request and later than any re-send of its ids (a re-send on one partition then ends the
/// forget on all of them, and an earlier re-send ends none). The answer when the lookup fails.
async fn look_up(admin: &Admin, groups: &mut Groups) -> Result<i64, HttpResponse> {
    let keys: Vec<dedupe::identity::LedgerKey> =
        groups.values().flatten().map(|(_, id)| id.key).collect();
    let ledger = admin.targets.ledger.clone();
    let looked = web::block(move || {
        let held = ledger.held_in(&keys)?.0;
        let resent = ledger.newest_resent_ms(&keys);
        Ok::<_, dedupe::ledger::LedgerError>((keys, held, resent))
    })
    .await;
    let (keys, held, resent) = match looked {
        Ok(Ok(looked)) => looked,
        Ok(Err(e)) => {
            return Err(HttpResponse::InternalServerError()
                .json(json!({ "error": format!("looking the ids up: {e}") })))
        }
        Err(_) => {
            return Err(HttpResponse::ServiceUnavailable()
                .json(json!({ "error": "the worker is stopping" })))
        }
    };
    let at_ms = dedupe::clock::now_ms().max(resent.map_or(i64::MIN, |r| r + 1));
    let held: std::collections::HashSet<_> = keys
        .iter()
        .zip(&held)
        .filter(|(_, h)| h.is_some())
        .map(|(k, _)| *k)
        .collect();
    for (_, id) in groups.values_mut().flatten() {
        id.held_by_worker = held.contains(&id.key);
    }
    Ok(at_ms)
}

/// Has `partition`'s pipeline forget `ids` and waits for its report, at most [`FORGET_WAIT`]:
/// the report, or why the forget is not done there.
async fn forget_on(
    admin: &Admin,
    partition: i32,
    ids: Vec<ForgetId>,
    by: &str,
    reason: Option<&str>,
    at_ms: i64,
) -> Result<ForgetReport, String> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    admin.targets.coordinator.do_send(Forget {
        partition,
        request: ForgetRequest {
            ids,
            by: by.to_string(),
            reason: reason.map(str::to_string),
            at_ms,
            reply,
        },
    });
    match tokio::time::timeout(FORGET_WAIT, answer).await {
        Ok(Ok(Ok(report))) => Ok(report),
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(_)) => Err(format!("partition {partition}: its pipeline stopped before the forget was done; ask again")),
        Err(_) => Err(format!("partition {partition}: no answer within {} s; ask again (a forget done twice is harmless)", FORGET_WAIT.as_secs())),
    }
}

/// A request's ids by how far each was forgotten.
#[derive(Debug, PartialEq, Eq)]
struct Tally {
    /// On every partition it may be on.
    forgotten: usize,
    /// On some of them, not all.
    partial: usize,
    /// On none.
    failed: usize,
}

impl Tally {
    /// From, per id, the partitions it was forgotten on and the partitions it may be on.
    fn of(done: &[usize], wanted: &[usize]) -> Tally {
        let mut tally = Tally {
            forgotten: 0,
            partial: 0,
            failed: 0,
        };
        for (&done, &wanted) in done.iter().zip(wanted) {
            match done {
                0 => tally.failed += 1,
                n if n >= wanted => tally.forgotten += 1,
                _ => tally.partial += 1,
            }
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_forgotten_on_some_of_its_partitions_is_partial() {
        // Ids on two partitions forgotten on both, on one, on none; an id on one partition.
        assert_eq!(
            Tally::of(&[2, 1, 0, 1], &[2, 2, 2, 1]),
            Tally {
                forgotten: 2,
                partial: 1,
                failed: 1
            }
        );
    }

    fn body(ids: &[&str], by: &str) -> ForgetBody {
        ForgetBody {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            by: Some(by.to_string()),
            ..ForgetBody::default()
        }
    }

    #[test]
    fn a_request_names_the_field_it_gets_wrong() {
        assert!(check(&body(&["a"], "alice"), 4).is_ok());
        let cases = [
            (body(&[], "alice"), "ids:"),
            (body(&["a"], " "), "by:"),
            (body(&["a"], "al\nice"), "by:"),
            (
                ForgetBody {
                    partition: Some(4),
                    ..body(&["a"], "alice")
                },
                "partition:",
            ),
            (
                ForgetBody {
                    reason: Some("x".repeat(MAX_REASON_CHARS + 1)),
                    ..body(&["a"], "alice")
                },
                "reason:",
            ),
        ];
        for (b, field) in cases {
            let e = check(&b, 4).unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
        let many: Vec<String> = (0..=MAX_IDS).map(|i| i.to_string()).collect();
        let b = ForgetBody {
            ids: many,
            ..body(&[], "alice")
        };
        assert!(check(&b, 4).unwrap_err().starts_with("ids:"));
        // Ids named as JSON values count as ids: alone they are a request, and with the others
        // they are held to the same limit.
        let json = |n: usize, json_ids: usize| ForgetBody {
            json_ids: (0..json_ids).map(|i| i.to_string()).collect(),
            ..body(&vec!["a"; n], "alice")
        };
        assert!(check(&json(0, 1), 4).is_ok());
        assert!(check(&json(MAX_IDS - 1, 1), 4).is_ok());
        assert!(check(&json(MAX_IDS, 1), 4).unwrap_err().starts_with("ids:"));
    }

    #[test]
    fn a_delete_names_a_json_id_in_its_query() {
        // `DELETE /admin/ids/12345678901234567890?json_id=true&partition=0`.
        let q: ForgetQuery = serde_urlencoded_query("json_id=true&partition=0");
        assert!(q.json_id);
        let q: ForgetQuery = serde_urlencoded_query("partition=0");
        assert!(!q.json_id);
    }

    /// A query string read as actix-web's `web::Query` reads it.
    fn serde_urlencoded_query<T: serde::de::DeserializeOwned>(query: &str) -> T {
        web::Query::<T>::from_query(query).unwrap().into_inner()
    }
}
