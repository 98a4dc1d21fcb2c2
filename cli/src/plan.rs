//! `dedupe plan`: what a promised window costs at an id rate, printed as a table or JSON, from the
//! core's one arithmetic (`dedupe::plan`); the rate given, or measured on a topic.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use dedupe::config::{Assignment, Config, DigestSource, LedgerConfig, MAX_RETENTION_LIMIT_SECS};
use dedupe::plan::{Ask, PerWorker, Plan, FIGURES};
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Flags of `dedupe plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Ids per second into the pipeline, all partitions together.
    #[arg(long, value_name = "N", required_unless_present = "topic", value_parser = rate)]
    pub ids_per_sec: Option<f64>,
    /// Measure the rate instead: records appended to this topic over --measure (by its
    /// partitions' high watermarks), at the brokers of --brokers or the configuration.
    #[arg(long, value_name = "NAME", conflicts_with = "ids_per_sec")]
    pub topic: Option<String>,
    /// How long to measure --topic.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = duration)]
    pub measure: Duration,
    /// Kafka bootstrap servers for --topic (default: the configuration's kafka.brokers).
    #[arg(long, value_name = "HOST:PORT,...")]
    pub brokers: Option<String>,
    /// The promised window, e.g. 24h, 7d, 90m (default: the configuration's
    /// worker.promised_window_secs, else 24h). At least a second.
    #[arg(long, value_name = "DURATION", value_parser = promise)]
    pub promise: Option<Duration>,
    /// The retention limit, e.g. 30d (default: the configuration's ledger.max_window_secs, else
    /// none): the id changelog keeps ids no longer, as the worker creates it. At least the promise,
    /// at most ten years (as ledger.max_window_secs).
    #[arg(long, value_name = "DURATION", value_parser = limit)]
    pub limit: Option<Duration>,
    /// The id changelog's replication factor: 1 to 32767 (Kafka's replication factor is an
    /// int16).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(i16::MAX)))]
    pub replication: u32,
    /// A configuration file: its generations, content digests and changelog retention are
    /// planned with, and the plan says whether its ledger.budget_bytes holds the promise.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// A duration on the command line: `24h`, `7d`, `90m`, `1h 30m`.
fn duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration such as 24h, 7d or 90m: {e}"))?;
    if d.is_zero() {
        return Err("a duration of zero".into());
    }
    Ok(d)
}

/// `--promise`: a duration of at least a second, as `worker.promised_window_secs` counts whole
/// seconds from 1.
fn promise(text: &str) -> Result<Duration, String> {
    let d = duration(text)?;
    if d.as_secs() == 0 {
        return Err(format!(
            "`{text}` is under a second: worker.promised_window_secs counts whole seconds"
        ));
    }
    Ok(d)
}

/// `--limit`: a duration no longer than the configuration takes for `ledger.max_window_secs`
/// (the same bound, [`MAX_RETENTION_LIMIT_SECS`]).
fn limit(text: &str) -> Result<Duration, String> {
    let d = duration(text)?;
    if d > Duration::from_secs(MAX_RETENTION_LIMIT_SECS) {
        return Err(format!(
            "`{text}` is more than the largest retention limit, {} (ledger.max_window_secs refuses it too); leave --limit out for none",
            humantime::format_duration(Duration::from_secs(MAX_RETENTION_LIMIT_SECS))
        ));
    }
    Ok(d)
}

/// `--ids-per-sec`: a positive, finite number.
fn rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if !rate.is_finite() || rate <= 0.0 {
        return Err(format!(
            "`{text}` is not a positive number of ids per second"
        ));
    }
    Ok(rate)
}

/// What a configuration file's budget holds at the plan's rate.
#[derive(Debug, serde::Serialize)]
struct ConfigCheck {
    file: String,
    budget_bytes: u64,
    workers: u32,
    ids_per_sec_per_worker: f64,
    /// The lowest window the budget holds at that rate (a generation just dropped).
    window_secs: f64,
    holds_promise: bool,
}

/// Runs `dedupe plan`; the text to print.
pub fn plan(args: &PlanArgs) -> anyhow::Result<String> {
    let config = match &args.config {
        Some(path) => Some(
            Config::load(Some(path), std::env::vars(), &Default::default())
                .with_context(|| format!("reading {}", path.display()))?,
        ),
        None => None,
    };
    let ids_per_sec = match (args.ids_per_sec, &args.topic) {
        (Some(rate), _) => rate,
        (None, Some(topic)) => {
            let kafka = measuring_kafka(args, config.as_ref())?;
            let rate = measure(&kafka, topic, args.measure)?;
            if rate <= 0.0 {
                bail!(
                    "--topic {topic}: no records were appended over {}: there is no rate to plan for; give --ids-per-sec",
                    humantime::format_duration(args.measure)
                );
            }
            rate
        }
        (None, None) => bail!("give --ids-per-sec or --topic"),
    };
    let ask = ask(args, config.as_ref(), ids_per_sec)?;
    let plan = ask.plan().with_context(|| {
        format!(
            "--ids-per-sec {ids_per_sec} with a promise of {}",
            humantime::format_duration(ask.promise)
        )
    })?;
    let check = match config.as_ref().zip(args.config.as_ref()) {
        Some((c, path)) => Some(config_check(&ask, &plan, c, path)?),
        None => None,
    };
    if args.json {
        let mut json = serde_json::to_value(&plan)?;
        json["figures_from"] = serde_json::json!("docs/performance.md");
        if let Some(check) = &check {
            json["config"] = serde_json::to_value(check)?;
        }
        return Ok(json.to_string());
    }
    Ok(table(&plan, check.as_ref()))
}

/// The Kafka settings --topic is measured with: the configuration's (security included), its
/// brokers overridden by --brokers; or only --brokers.
fn measuring_kafka(
    args: &PlanArgs,
    config: Option<&Config>,
) -> anyhow::Result<dedupe::kafka::KafkaConfig> {
    let mut kafka = match (config, &args.brokers) {
        (Some(c), _) => c.kafka.clone(),
        (None, Some(_)) => dedupe::kafka::KafkaConfig::default(),
        (None, None) => bail!("--topic needs --brokers or a --config naming kafka.brokers"),
    };
    if let Some(brokers) = &args.brokers {
        kafka.brokers.clone_from(brokers);
    }
    Ok(kafka)
}

/// What is asked of the plan: the rate, and the promise, the retention limit, the changelog's
/// retention and the ledger's shape from the flags, else the configuration, else the defaults.
fn ask(args: &PlanArgs, config: Option<&Config>, ids_per_sec: f64) -> anyhow::Result<Ask> {
    let w = config.map(|c| &c.worker);
    let promise = args
        .promise
        .or_else(|| w.map(|w| Duration::from_secs(w.promised_window_secs)))
        .unwrap_or(Duration::from_secs(86_400));
    let limit = args.limit.or_else(|| {
        config
            .and_then(|c| c.ledger.max_window_secs)
            .map(Duration::from_secs)
    });
    if let Some(limit) = limit.filter(|&l| l < promise) {
        // Both from the file is a file the configuration refuses, so one at least is a flag.
        let (limit_from, promise_from) = match (args.limit, args.promise) {
            (Some(_), Some(_)) => ("--limit", "--promise"),
            (Some(_), None) if config.is_some() => ("--limit", "worker.promised_window_secs"),
            (Some(_), None) => ("--limit", "the default promise"),
            (None, _) => ("ledger.max_window_secs", "--promise"),
        };
        bail!(
            "{limit_from}: a retention limit of {} is shorter than the promise of {} ({promise_from}): it would forget ids the promise says are held",
            humantime::format_duration(limit),
            humantime::format_duration(promise)
        );
    }
    let retention = w
        .map(|w| Duration::from_secs(w.changelog_retention_secs))
        .unwrap_or(Duration::from_secs(7 * 86_400))
        .max(promise);
    Ok(Ask {
        ids_per_sec,
        promise,
        // With a limit the worker creates the changelog to keep ids no longer than it.
        changelog_retention: limit.map_or(retention, |l| retention.min(l)),
        replication: args.replication,
        generations: config.map_or(8, |c| c.ledger.generations as u32),
        digests: w.is_none_or(|w| w.content_digest != DigestSource::None),
        // The configuration's, else the default ledger section's.
        least_budget_bytes: config
            .map_or_else(LedgerConfig::default, |c| c.ledger.clone())
            .least_budget_bytes(),
    })
}

/// What the configuration file at `path`'s budget holds at the plan's rate; refused when the
/// window is longer than a `Duration` holds (a rate near zero), naming the least rate answered.
fn config_check(
    ask: &Ask,
    plan: &Plan,
    c: &Config,
    path: &std::path::Path,
) -> anyhow::Result<ConfigCheck> {
    let workers = match (c.worker.assignment, c.worker.worker_count) {
        (Assignment::Static, Some(n)) => n.max(1),
        _ => plan.workers,
    };
    let rate = ask.ids_per_sec / f64::from(workers);
    let budget = c.ledger.budget_bytes.0 as f64;
    let Some(window) = ask.window_of(budget, rate) else {
        bail!(
            "--ids-per-sec {}: at that rate {}'s budget would hold ids for longer than a window this plan can state ({} s); give at least {:.3e} ids per second",
            ask.ids_per_sec,
            path.display(),
            Duration::MAX.as_secs(),
            ask.least_ids_per_sec(budget) * f64::from(workers)
        );
    };
    Ok(ConfigCheck {
        file: path.display().to_string(),
        budget_bytes: c.ledger.budget_bytes.0,
        workers,
        ids_per_sec_per_worker: rate,
        window_secs: window.as_secs_f64(),
        holds_promise: window >= ask.promise,
    })
}

/// Appended records per second on `topic`, over `span`.
fn measure(kafka: &dedupe::kafka::KafkaConfig, topic: &str, span: Duration) -> anyhow::Result<f64> {
    let brokers = &kafka.brokers;
    let consumer: BaseConsumer = dedupe::kafka::client_config(kafka)
        .create()
        .context("making a Kafka client to measure the topic")?;
    let partitions = dedupe::kafka::partition_count(kafka, topic, Duration::from_secs(10))
        .with_context(|| format!("reading topic {topic}'s partitions from {brokers}"))?
        .with_context(|| format!("topic {topic} has no partitions at {brokers}"))?;
    let total = |consumer: &BaseConsumer| -> anyhow::Result<i64> {
        let mut sum = 0;
        for p in 0..partitions as i32 {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .with_context(|| format!("reading {topic}/{p}'s high watermark from {brokers}"))?;
            sum += high;
        }
        Ok(sum)
    };
    let start = Instant::now();
    let before = total(&consumer)?;
    std::thread::sleep(span);
    let after = total(&consumer)?;
    Ok((after - before).max(0) as f64 / start.elapsed().as_secs_f64())
}

fn table(plan: &Plan, check: Option<&ConfigCheck>) -> String {
    let rows = rows(plan, check);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<width$}  {v}\n"));
    }
    out.push_str("\nFrom the figures measured in docs/performance.md:\n");
    out.push_str(&figures());
    out
}

/// The table's rows: the plan's figures, and what the configuration's budget holds.
fn rows(plan: &Plan, check: Option<&ConfigCheck>) -> Vec<(String, String)> {
    let w = &plan.per_worker;
    let mut rows = vec![
        ("ids per second".to_string(), count(plan.ids_per_sec)),
        (
            format!("ids held over {}", span(plan.promise_secs)),
            count(plan.ids_held),
        ),
        (
            "ledger bytes per id".to_string(),
            format!("{:.2}", plan.bytes_per_id),
        ),
        ("workers".to_string(), plan.workers.to_string()),
        ("input partitions".to_string(), plan.partitions.to_string()),
        (
            "per worker: ids per second".to_string(),
            count(w.ids_per_sec),
        ),
        ("per worker: ledger.budget_bytes".to_string(), budget(w)),
        ("per worker: ledger volume".to_string(), bytes(w.disk_bytes)),
        ("per worker: memory".to_string(), bytes(w.memory_bytes)),
        (
            "id changelog, all replicas".to_string(),
            bytes(plan.changelog_bytes),
        ),
        (
            "handover of one partition".to_string(),
            format!("{:.1} s", plan.handover_secs),
        ),
    ];
    if let Some(c) = check {
        let window = humantime::format_duration(Duration::from_secs(c.window_secs as u64));
        rows.push((
            format!("{}: its budget", c.file),
            format!(
                "{} over {} workers holds {window}: {}",
                bytes(c.budget_bytes as f64),
                c.workers,
                if c.holds_promise {
                    "holds the promise"
                } else {
                    "does NOT hold the promise"
                }
            ),
        ));
    }
    rows
}

/// The budget's row: what the promise needs, or the least budget the configuration accepts and
/// what the promise alone would need.
fn budget(w: &PerWorker) -> String {
    if w.budget_is_least {
        format!(
            "{}, the least the configuration accepts (the promise alone needs {})",
            bytes(w.budget_bytes),
            bytes(w.promise_budget_bytes)
        )
    } else {
        bytes(w.budget_bytes)
    }
}

/// The measured figures the plan rests on, one line each with its source.
fn figures() -> String {
    let mut out = String::new();
    let f = FIGURES;
    for (what, value, figure) in [
        (
            "bytes per id",
            f.bytes_per_id.value.to_string(),
            f.bytes_per_id,
        ),
        (
            "bytes per id with digests",
            f.bytes_per_id_with_digests.value.to_string(),
            f.bytes_per_id_with_digests,
        ),
        (
            "changelog bytes per id",
            f.changelog_bytes_per_id.value.to_string(),
            f.changelog_bytes_per_id,
        ),
        (
            "resident memory at 100M ids",
            bytes(f.rss_100m_bytes.value),
            f.rss_100m_bytes,
        ),
        (
            "resident memory at 1B ids",
            bytes(f.rss_1b_bytes.value),
            f.rss_1b_bytes,
        ),
        (
            "a worker's throughput",
            format!("{} msgs/s", count(f.worker_msgs_per_sec.value)),
            f.worker_msgs_per_sec,
        ),
        (
            "handover of 50M ids",
            format!("{} s", f.handover_50m_secs.value),
            f.handover_50m_secs,
        ),
        (
            "handover of 200M ids",
            format!("{} s", f.handover_200m_secs.value),
            f.handover_200m_secs,
        ),
    ] {
        out.push_str(&format!("  {what}: {value} ({})\n", figure.source));
    }
    out
}

/// A promise as an operator writes it: `7d`, `24h`, `90m`, else humantime's form.
fn span(secs: u64) -> String {
    match secs {
        s if s >= 2 * 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3_600 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => humantime::format_duration(Duration::from_secs(s)).to_string(),
    }
}

fn count(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2}B", n / 1e9),
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e4 => format!("{:.1}k", n / 1e3),
        n if n >= 1.0 || n == 0.0 => format!("{n:.0}"),
        // Under one a rounded count would read as none.
        n => format!("{n:.2e}"),
    }
}

fn bytes(n: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if n >= 1024.0 * GIB {
        format!("{:.2} TiB", n / 1024.0 / GIB)
    } else if n >= GIB {
        format!("{:.1} GiB", n / GIB)
    } else if n >= MIB {
        format!("{:.0} MiB", n / MIB)
    } else {
        // A budget the promise alone needs at a slow rate: in MiB it would read as nothing.
        format!("{:.0} KiB", n / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_operators_write_them() {
        assert_eq!(duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert!(duration("0s").is_err());
        assert!(duration("soon").unwrap_err().contains("`soon`"));
    }

    /// `dedupe plan` with these flags, parsed as the binary parses them.
    fn parse(flags: &[&str]) -> Result<PlanArgs, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            plan: PlanArgs,
        }
        let argv = std::iter::once("plan").chain(flags.iter().copied());
        Cli::try_parse_from(argv).map(|cli| cli.plan)
    }

    fn args(limit: Option<&str>) -> PlanArgs {
        let mut flags = vec!["--ids-per-sec", "5000", "--promise", "24h", "--json"];
        if let Some(l) = limit {
            flags.extend(["--limit", l]);
        }
        parse(&flags).unwrap()
    }

    /// The shipped configuration file, which spells out every default.
    const SHIPPED_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/dedupe.toml");

    /// The plan's one JSON line.
    fn json_of(flags: &[&str]) -> serde_json::Value {
        let mut flags = flags.to_vec();
        flags.push("--json");
        let out = plan(&parse(&flags).unwrap()).unwrap();
        serde_json::from_str(out.lines().last().unwrap()).unwrap()
    }

    #[test]
    fn a_flag_the_plan_cannot_answer_is_refused_naming_it_as_clap_refuses_a_bad_argument() {
        // Each of these is refused while the command line is read: clap prints the flag and the
        // reason and exits 2, as for its own errors.
        for (flags, flag, says) in [
            (
                &["--ids-per-sec", "1", "--replication", "0"][..],
                "--replication",
                "1..=32767",
            ),
            (
                &["--ids-per-sec", "1", "--replication", "40000"],
                "--replication",
                "1..=32767",
            ),
            (
                &["--ids-per-sec", "1", "--limit", "1000000y"],
                "--limit",
                "largest retention limit",
            ),
            (
                &["--ids-per-sec", "1", "--promise", "500ms"],
                "--promise",
                "under a second",
            ),
            (&["--ids-per-sec", "0"], "--ids-per-sec", "positive"),
            (&["--ids-per-sec=-3"], "--ids-per-sec", "positive"),
            (&["--ids-per-sec", "NaN"], "--ids-per-sec", "positive"),
            (&["--ids-per-sec", "inf"], "--ids-per-sec", "positive"),
            (&["--ids-per-sec", "many"], "--ids-per-sec", "not a number"),
        ] {
            let e = parse(flags)
                .err()
                .unwrap_or_else(|| panic!("{flags:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{flags:?}");
            let text = e.to_string();
            assert!(
                text.contains(flag) && text.contains(says),
                "{flags:?}: {text}"
            );
        }
        // Ten years is the largest limit the configuration takes, and so is it here.
        assert!(parse(&["--ids-per-sec", "1", "--limit", "3650d"]).is_ok());
        assert!(parse(&["--ids-per-sec", "1", "--limit", "3650d 1s"]).is_err());
        assert!(parse(&["--ids-per-sec", "1", "--replication", "1"]).is_ok());
    }

    #[test]
    fn a_rate_near_zero_against_a_configuration_is_refused_with_the_least_rate_not_a_panic() {
        // 1e-11 ids/s: the file's 16 GiB would hold ids for longer than a Duration reaches.
        let args = parse(&["--ids-per-sec", "0.00000000001", "--config", SHIPPED_CONFIG]).unwrap();
        let e = format!("{:#}", plan(&args).unwrap_err());
        assert!(
            e.starts_with("--ids-per-sec 0.00000000001: ") && e.contains("give at least"),
            "{e}"
        );
        // Without a file there is no budget's window to state: the plan answers.
        let small = json_of(&["--ids-per-sec", "0.00000000001"]);
        assert_eq!(small["workers"], 1, "{small}");
        // A slow rate the window can be stated at is answered, and holds the promise.
        let slow = json_of(&["--ids-per-sec", "0.001", "--config", SHIPPED_CONFIG]);
        assert_eq!(slow["config"]["holds_promise"], true, "{slow}");
    }

    #[test]
    fn a_rate_whose_answer_does_not_fit_is_refused_with_the_bound_not_saturated() {
        let args = parse(&["--ids-per-sec", "1e30"]).unwrap();
        let e = format!("{:#}", plan(&args).unwrap_err());
        assert!(
            e.starts_with("--ids-per-sec 1000000000000000000000000000000 with a promise of 1day: "),
            "{e}"
        );
        assert!(e.contains("at most 1.243e12 ids per second"), "{e}");
        // Just under the bound the plan answers, its workers and partitions exact.
        let under = json_of(&["--ids-per-sec", "1.2e12"]);
        let workers = under["workers"].as_f64().unwrap();
        let per_worker = under["per_worker"]["ids_per_sec"].as_f64().unwrap();
        assert!(
            (workers * per_worker / 1.2e12 - 1.0).abs() < 1e-9,
            "{under}"
        );
        assert!(under["partitions"].as_f64().unwrap() <= f64::from(i32::MAX));
    }

    #[test]
    fn a_budget_under_the_least_the_configuration_accepts_is_the_least_and_says_so() {
        // One id a second for an hour needs under a MiB; the default ledger section takes no
        // budget under 512 MiB (its 64 MiB write buffer in each of 8 generations).
        let least = LedgerConfig::default().least_budget_bytes() as f64;
        let plan_json = json_of(&["--ids-per-sec", "1", "--promise", "1h"]);
        let w = &plan_json["per_worker"];
        assert_eq!(w["budget_bytes"].as_f64(), Some(least), "{plan_json}");
        assert_eq!(w["budget_is_least"], true);
        assert!(w["promise_budget_bytes"].as_f64().unwrap() < 1e6);
        // The recommended budget is one the configuration takes.
        let config = Config {
            ledger: LedgerConfig {
                budget_bytes: dedupe::config::ByteSize(least as u64),
                ..LedgerConfig::default()
            },
            ..Config::default()
        };
        assert!(config.validate().is_ok());
        let table = plan(&parse(&["--ids-per-sec", "1", "--promise", "1h"]).unwrap()).unwrap();
        assert!(
            table.contains(
                "512 MiB, the least the configuration accepts (the promise alone needs 83 KiB)"
            ),
            "{table}"
        );
        // With the file's own ledger section, its least: the shipped file's is the default's.
        let with_file = json_of(&[
            "--ids-per-sec",
            "1",
            "--promise",
            "1h",
            "--config",
            SHIPPED_CONFIG,
        ]);
        assert_eq!(
            with_file["per_worker"]["budget_bytes"].as_f64(),
            Some(least)
        );
    }

    #[test]
    fn a_retention_limit_bounds_the_changelog_and_is_never_below_the_promise() {
        let json = |limit| -> serde_json::Value {
            let out = plan(&args(limit)).unwrap();
            serde_json::from_str(out.lines().last().unwrap()).unwrap()
        };
        let week = json(None)["changelog_bytes"].as_f64().unwrap();
        let two_days = json(Some("2d"))["changelog_bytes"].as_f64().unwrap();
        assert!((week / two_days - 3.5).abs() < 1e-9, "{week} {two_days}");
        assert_eq!(json(Some("30d"))["changelog_bytes"].as_f64().unwrap(), week);
        let err = plan(&args(Some("12h"))).unwrap_err().to_string();
        assert!(err.contains("shorter than the promise"), "{err}");
    }

    #[test]
    fn counts_and_bytes_read_at_a_glance() {
        assert_eq!(count(432e6), "432.0M");
        assert_eq!(count(3.024e9), "3.02B");
        assert_eq!(count(5_000.0), "5000");
        assert_eq!(count(0.0), "0");
        assert_eq!(count(1e-11), "1.00e-11");
        assert_eq!(bytes(16.0 * (1u64 << 30) as f64), "16.0 GiB");
        assert_eq!(bytes(300.0 * (1u64 << 20) as f64), "300 MiB");
        assert_eq!(bytes(84_960.0), "83 KiB");
        assert_eq!(span(86_400), "24h");
        assert_eq!(span(7 * 86_400), "7d");
        assert_eq!(span(5_400), "90m");
        assert_eq!(span(61), "1m 1s");
    }
}
