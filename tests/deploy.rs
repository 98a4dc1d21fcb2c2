//! The deployment files and the docs against the service: every metric name the alert rules, the
//! dashboard and the docs use is one `src/metrics/mod.rs` declares, the rules pass their promtool unit
//! tests, the Kubernetes PrometheusRule carries the same rules, every alert's runbook link names its
//! own section of `docs/operations.md`, the dashboard shows the key series, every file the compose
//! setup mounts exists, every `DEDUPE_*` variable the deployments set is a configuration key, the
//! operations page's metrics table lists every metric, and every relative link in the README, the
//! changelog and `docs/` resolves to a file and, with `#anchor`, to a heading in it, and the
//! figures tables of the performance and testing pages, rendered from the benches' JSON, agree
//! with it and with the README, and every measured figure in the README, operations.md and
//! architecture.md is rendered from that JSON (`deploy/bench/figures.py --check`).
//!
//! Reads files only (no broker). promtool and python3 must be installed (Debian's `prometheus`
//! and `python3` packages): a missing one fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use dedupe::metrics as m;

fn root() -> PathBuf {
    kit::repo_root()
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Metric name -> kind ("Counter", "Gauge", "Histogram"), from `dedupe::metrics::ALL`, the list
/// the service itself registers.
fn declared_metrics() -> BTreeMap<String, String> {
    dedupe::metrics::ALL
        .iter()
        .map(|m| (m.name.to_string(), format!("{:?}", m.kind)))
        .collect()
}

/// Every `dedupe_[a-z0-9_]+` token in `text`.
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while let Some(offset) = text[i..].find("dedupe_") {
        let start = i + offset;
        let preceded_by_word =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start + "dedupe_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        if !preceded_by_word {
            found.insert(text[start..end].to_string());
        }
        i = end;
    }
    found
}

/// The declared metric a used series name refers to: itself, or a histogram's `_bucket`, `_sum`
/// or `_count` series.
fn resolve<'a>(used: &str, declared: &'a BTreeMap<String, String>) -> Option<&'a str> {
    if let Some((name, _)) = declared.get_key_value(used) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = used.strip_suffix(suffix)?;
        let (name, kind) = declared.get_key_value(base)?;
        (kind == "Histogram").then_some(name.as_str())
    })
}

fn assert_all_declared(source: &str, used: &BTreeSet<String>, declared: &BTreeMap<String, String>) {
    let unknown: Vec<_> = used
        .iter()
        .filter(|u| resolve(u, declared).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "{source} uses metric names that src/metrics/mod.rs does not declare: {unknown:?}\n(declared: {:?})",
        declared.keys().collect::<Vec<_>>()
    );
}

/// One alert rule of rules.yml, parsed as text: its name and the lines of its block.
struct Alert {
    name: String,
    block: String,
}

impl Alert {
    /// The value of `key:` in the block (inline, or a folded `>-` block).
    fn field(&self, key: &str) -> Option<String> {
        let lines: Vec<&str> = self.block.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with(&format!("{key}:")))?;
        let indent = lines[at].len() - lines[at].trim_start().len();
        let inline = lines[at].trim_start()[key.len() + 1..].trim();
        if inline != ">-" && inline != ">" && inline != "|" {
            return Some(inline.trim_matches('"').to_string());
        }
        let folded: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .map(|l| l.trim())
            .collect();
        Some(folded.join(" ").trim().to_string())
    }
}

fn alerts(rules: &str) -> Vec<Alert> {
    let mut alerts: Vec<Alert> = Vec::new();
    for line in rules.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert: ") {
            alerts.push(Alert {
                name: name.trim().to_string(),
                block: String::new(),
            });
        } else if let Some(alert) = alerts.last_mut() {
            // Comments between rules belong to the next rule; they carry no fields.
            if !line.trim_start().starts_with('#') {
                alert.block.push_str(line);
                alert.block.push('\n');
            }
        }
    }
    alerts
}

#[test]
fn alert_rules_and_dashboard_use_only_declared_metrics() {
    let declared = declared_metrics();
    for file in [
        "deploy/prometheus/rules.yml",
        "deploy/k8s/prometheusrule.yaml",
    ] {
        assert_all_declared(file, &metric_tokens(&read(file)), &declared);
    }
    for (file, text) in docs() {
        assert_all_declared(&file, &metric_tokens(&text), &declared);
    }

    // Every expression and template query of the dashboard.
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dedupe.json")).expect("dedupe.json is JSON");
    let mut queries = Vec::new();
    collect_strings(&dashboard, &["expr", "definition"], &mut queries);
    assert!(
        queries.len() >= 20,
        "found only {} queries in the dashboard",
        queries.len()
    );
    let used: BTreeSet<String> = queries.iter().flat_map(|q| metric_tokens(q)).collect();
    assert_all_declared("deploy/grafana/dedupe.json", &used, &declared);

    // The rules' expressions name the series they are about.
    let rules = read("deploy/prometheus/rules.yml");
    let exprs: String = alerts(&rules)
        .iter()
        .filter_map(|a| a.field("expr"))
        .collect::<Vec<_>>()
        .join("\n");
    for name in [
        "dedupe_window_seconds",
        "dedupe_window_forecast_seconds",
        "dedupe_consumer_lag_records",
        "dedupe_snapshot_failures_total",
        "dedupe_snapshot_last_success_timestamp_seconds",
        "dedupe_transactions_total",
        "dedupe_partitions_ready",
        "dedupe_partitions_owned",
        "dedupe_handover_in_progress_seconds",
    ] {
        assert!(
            metric_tokens(&exprs).contains(name),
            "no alert expression uses {name}"
        );
    }
}

fn collect_strings(value: &serde_json::Value, keys: &[&str], out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    serde_json::Value::String(s) if keys.contains(&k.as_str()) => {
                        out.push(s.clone())
                    }
                    _ => collect_strings(v, keys, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_strings(v, keys, out)),
        _ => {}
    }
}

#[test]
fn alert_rules_have_severity_annotations_and_the_promised_thresholds() {
    let rules = read("deploy/prometheus/rules.yml");
    let alerts = alerts(&rules);
    let by_name: BTreeMap<&str, &Alert> = alerts.iter().map(|a| (a.name.as_str(), a)).collect();
    let expected = [
        ("DedupeWindowUnderPromise", "page"),
        ("DedupeWindowForecastUnderPromise", "warn"),
        ("DedupeConsumerLagGrowing", "warn"),
        ("DedupeSnapshotsFailing", "warn"),
        ("DedupeProducerFenced", "warn"),
        ("DedupeWorkerDown", "page"),
        ("DedupeWorkerNotReady", "warn"),
        ("DedupeLedgerIndexOverflowed", "warn"),
        ("DedupeHandoverStuck", "warn"),
        ("DedupeReusedIds", "warn"),
        ("DedupeMisroutedIds", "warn"),
        ("DedupePartitionStalled", "page"),
    ];
    for (name, severity) in expected {
        let alert = by_name
            .get(name)
            .unwrap_or_else(|| panic!("rules.yml has no alert {name}"));
        assert_eq!(
            alert.field("severity").as_deref(),
            Some(severity),
            "{name}: severity"
        );
        for key in ["summary", "description"] {
            assert!(
                alert.field(key).is_some_and(|v| v.len() > 20),
                "{name}: needs a {key} annotation"
            );
        }
        // Each alert has its own section of the runbook, named after it.
        let expected_runbook = format!("{OPERATIONS}#{}", name.to_lowercase());
        assert_eq!(
            alert.field("runbook").as_deref(),
            Some(expected_runbook.as_str()),
            "{name}: runbook"
        );
    }
    assert_eq!(
        alerts.len(),
        expected.len(),
        "an alert was added: add it to this test and to rules.test.yml"
    );

    // The page: the window under the promise each worker exports, held for 10 minutes; the
    // forecast under one and a half times it, held for 30.
    let page = by_name["DedupeWindowUnderPromise"];
    let promise = format!("max by (job, instance) ({})", m::PROMISED_WINDOW_SECONDS);
    assert_eq!(
        page.field("expr").as_deref(),
        Some(
            format!(
                "min by (job, instance) (dedupe_window_seconds unless on (job, instance, partition) ({} == 1)) < on (job, instance) {promise}",
                m::WINDOW_LIMITED
            )
            .as_str()
        ),
        "{}",
        page.block
    );
    assert_eq!(page.field("for").as_deref(), Some("10m"));
    let forecast = by_name["DedupeWindowForecastUnderPromise"];
    assert!(forecast
        .field("expr")
        .unwrap()
        .ends_with(&format!("< on (job, instance) 1.5 * {promise}")));
    assert_eq!(forecast.field("for").as_deref(), Some("30m"));
    // A handover still loading after 10 minutes, held for 5.
    let handover = by_name["DedupeHandoverStuck"];
    assert!(handover
        .field("expr")
        .unwrap()
        .contains("dedupe_handover_in_progress_seconds) > 600"));
    assert_eq!(handover.field("for").as_deref(), Some("5m"));
    // Reused ids: one input record in 10,000, held for 15 minutes.
    let reused = by_name["DedupeReusedIds"];
    assert!(reused.field("expr").unwrap().contains("> 0.0001"));
    assert_eq!(reused.field("for").as_deref(), Some("15m"));
    // Misrouted ids: any in 10 minutes, per partition, held for 10.
    let misrouted = by_name["DedupeMisroutedIds"];
    assert!(misrouted
        .field("expr")
        .unwrap()
        .contains("(increase(dedupe_misrouted_ids_total[10m])) > 0"));
    assert_eq!(misrouted.field("for").as_deref(), Some("10m"));
    // Three missed hourly snapshots.
    assert!(by_name["DedupeSnapshotsFailing"]
        .field("expr")
        .unwrap()
        .contains("> 10800"));
    assert!(by_name["DedupeWorkerDown"]
        .field("expr")
        .unwrap()
        .contains("up{job=\"dedupe\"} == 0"));

    // The runbook has a section per alert.
    let sections = anchors(&read(OPERATIONS));
    for (name, _) in expected {
        assert!(
            sections.contains(&name.to_lowercase()),
            "{OPERATIONS} has no section (heading) for {name}"
        );
    }
}

/// The `runbook:` values of a rules or rule-test file, by the alert they belong to (the last
/// `alert:` or `alertname:` line above them).
fn runbooks(text: &str) -> Vec<(String, String)> {
    let mut current = None;
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        let line = line.strip_prefix("- ").unwrap_or(line);
        if let Some(name) = line
            .strip_prefix("alert: ")
            .or_else(|| line.strip_prefix("alertname: "))
        {
            current = Some(name.trim().to_string());
        } else if let Some(value) = line.strip_prefix("runbook: ") {
            let alert = current
                .clone()
                .unwrap_or_else(|| panic!("a runbook before any alert: {line}"));
            found.push((alert, value.trim().trim_matches('"').to_string()));
        }
    }
    found
}

#[test]
fn every_runbook_link_names_a_section_that_exists() {
    let rules = read("deploy/prometheus/rules.yml");
    let own: BTreeMap<String, String> = alerts(&rules)
        .iter()
        .map(|a| {
            (
                a.name.clone(),
                a.field("runbook")
                    .unwrap_or_else(|| panic!("{}: no runbook annotation", a.name)),
            )
        })
        .collect();
    for file in [
        "deploy/prometheus/rules.yml",
        "deploy/prometheus/rules.test.yml",
        "deploy/k8s/prometheusrule.yaml",
    ] {
        let found = runbooks(&read(file));
        assert!(
            found.len() >= own.len(),
            "{file}: only {} runbook annotations",
            found.len()
        );
        for (alert, runbook) in found {
            // The expected annotations of the rule tests, and the PrometheusRule, match the rule's.
            assert_eq!(
                own.get(&alert),
                Some(&runbook),
                "{file}: the runbook of {alert}"
            );
            let (path, anchor) = runbook
                .split_once('#')
                .unwrap_or_else(|| panic!("{file}: {alert}'s runbook {runbook} names no section"));
            let target = root().join(path);
            assert!(
                target.is_file(),
                "{file}: {alert}'s runbook names {path}, which does not exist"
            );
            let text = std::fs::read_to_string(&target).unwrap();
            assert!(
                anchors(&text).contains(anchor),
                "{file}: {alert}'s runbook names #{anchor}, not a heading of {path}"
            );
        }
    }
}

#[test]
fn every_alert_has_a_firing_and_a_silent_unit_test() {
    // alertname -> (cases expecting no alert, cases expecting alerts)
    let tests = read("deploy/prometheus/rules.test.yml");
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in tests.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname: ") {
            current = Some(name.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("exp_alerts:") {
            let name = current.take().expect("exp_alerts without an alertname");
            let entry = cases.entry(name).or_default();
            if rest.trim() == "[]" {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    for alert in alerts(&read("deploy/prometheus/rules.yml")) {
        let (silent, firing) = cases.get(&alert.name).copied().unwrap_or_default();
        assert!(
            silent >= 1 && firing >= 1,
            "{}: {silent} silent and {firing} firing cases in rules.test.yml",
            alert.name
        );
    }
    // The page is tested a minute before and at the end of its 10 minutes.
    assert!(tests.contains(
        "eval_time: 30m\n        alertname: DedupeWindowUnderPromise\n        exp_alerts: []"
    ));
    assert!(tests.contains(
        "eval_time: 31m\n        alertname: DedupeWindowUnderPromise\n        exp_alerts:\n          - exp_labels:"
    ));
}

/// Runs promtool with `args` in the repository root and asserts it succeeds.
fn promtool(args: &[&str]) {
    let output = Command::new("promtool").args(args).current_dir(root()).output().unwrap_or_else(|e| {
        panic!(
            "cannot run promtool ({e}): install Debian's `prometheus` package (apt-get install prometheus), \
             which ships /usr/bin/promtool"
        )
    });
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_checks_rules_config_and_runs_the_rule_tests() {
    promtool(&["check", "rules", "deploy/prometheus/rules.yml"]);
    promtool(&["check", "config", "deploy/prometheus/prometheus.yml"]);
    promtool(&["test", "rules", "deploy/prometheus/rules.test.yml"]);
}

#[test]
fn prometheus_rule_for_kubernetes_carries_the_same_rules() {
    // deploy/k8s/gen-prometheusrule.sh: everything from `groups:` on, indented under `spec:`.
    let rules = read("deploy/prometheus/rules.yml");
    let start = rules
        .find("\ngroups:")
        .expect("rules.yml has a top-level groups:")
        + 1;
    let indented: String = rules[start..]
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    let k8s = read("deploy/k8s/prometheusrule.yaml");
    let (head, spec) = k8s
        .split_once("\nspec:\n")
        .expect("prometheusrule.yaml has spec:");
    assert!(
        head.contains("apiVersion: monitoring.coreos.com/v1")
            && head.contains("kind: PrometheusRule")
    );
    assert!(
        spec == indented,
        "deploy/k8s/prometheusrule.yaml differs from deploy/prometheus/rules.yml: run deploy/k8s/gen-prometheusrule.sh"
    );
}

#[test]
fn dashboard_is_a_grafana_dashboard_showing_the_key_series() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dedupe.json")).expect("dedupe.json is JSON");
    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion >= 36"
    );
    assert_eq!(dashboard["uid"], "dedupe");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    assert!(
        variables.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "a `datasource` variable of type prometheus"
    );

    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "panel id of {title} repeats"
        );
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && grid["h"].as_u64().unwrap() > 0,
            "{title}: gridPos {grid}"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{title}: uses the datasource variable"
            );
            for target in panel["targets"].as_array().expect("targets") {
                assert_eq!(
                    target["datasource"]["uid"], "${datasource}",
                    "{title}: target datasource"
                );
                assert!(
                    target["expr"].as_str().is_some_and(|e| !e.is_empty()),
                    "{title}: empty expr"
                );
            }
        }
    }

    let panel_with = |needle: &str| {
        panels
            .iter()
            .find(|p| {
                p["targets"].as_array().is_some_and(|ts| {
                    ts.iter()
                        .any(|t| t["expr"].as_str().unwrap_or("").contains(needle))
                })
            })
            .unwrap_or_else(|| panic!("no dashboard panel queries {needle}"))
    };
    // The window per partition (the raw series, not an aggregate), with the promise beside it.
    let window = panels
        .iter()
        .find(|p| {
            p["targets"][0]["expr"]
                .as_str()
                .is_some_and(|e| e.starts_with("dedupe_window_seconds{"))
        })
        .expect("a panel plots dedupe_window_seconds per partition");
    assert_eq!(window["type"], "timeseries");
    assert!(
        window["targets"][1]["expr"]
            .as_str()
            .is_some_and(|e| e.contains(m::PROMISED_WINDOW_SECONDS)),
        "the window panel plots the promise beside the window: {}",
        window["targets"]
    );
    panel_with("1.5 * max by (instance) (dedupe_promised_window_seconds");
    panel_with("dedupe_window_forecast_seconds");
    panel_with("dedupe_consumer_lag_records");
    panel_with("rate(dedupe_duplicates_dropped_total");
    // Retries and reused ids: by verdict, by what the policy did, by source.
    panel_with("sum by (verdict) (rate(dedupe_duplicates_dropped_total");
    panel_with("sum by (action) (rate(dedupe_reused_ids_total");
    panel_with("sum by (source) (rate(dedupe_source_reused_ids_total");
    panel_with("time() - dedupe_snapshot_last_success_timestamp_seconds");
    panel_with("dedupe_transactions_total");
    panel_with("dedupe_ledger_budget_bytes");
    // Handovers (worker.assignment = "group").
    panel_with("dedupe_partitions_loading");
    panel_with("dedupe_partition_revocations_total");
    panel_with("dedupe_handover_duration_seconds");
    panel_with("dedupe_handover_ids_loaded_total");
    for histogram in [
        "dedupe_stage_seconds_bucket",
        "dedupe_end_to_end_seconds_bucket",
        "dedupe_ingest_request_seconds_bucket",
    ] {
        assert!(panel_with(histogram)["targets"][0]["expr"]
            .as_str()
            .unwrap()
            .starts_with("histogram_quantile("));
    }
    // The duplicate-age heatmap reads the buckets as a heatmap.
    let heatmap = panel_with("dedupe_duplicate_age_seconds_bucket");
    assert_eq!(heatmap["type"], "heatmap");
    assert_eq!(heatmap["targets"][0]["format"], "heatmap");
    assert!(heatmap["targets"][0]["expr"]
        .as_str()
        .unwrap()
        .starts_with("sum by (le) (rate(dedupe_duplicate_age_seconds_bucket"));
}

#[test]
fn operations_page_lists_every_metric() {
    let operations = read(OPERATIONS);
    // The rows whose first cell is one metric name.
    let rows: BTreeMap<&str, &str> = operations
        .lines()
        .filter_map(|l| {
            let first = l.strip_prefix("| `")?.split_once("` |")?.0;
            Some((first, l))
        })
        .collect();
    let declared = declared_metrics();
    for (name, kind) in &declared {
        let row = rows
            .get(name.as_str())
            .unwrap_or_else(|| panic!("the metrics table of {OPERATIONS} has no row for `{name}`"));
        assert!(
            row.to_lowercase().contains(&kind.to_lowercase()),
            "the row of {name} gives its kind, {kind}: {row}"
        );
    }
    for name in rows.keys().filter(|n| n.starts_with("dedupe_")) {
        assert!(
            declared.contains_key(*name),
            "the metrics table of {OPERATIONS} lists `{name}`, which src/metrics/mod.rs does not declare"
        );
    }
}

/// The runbook: the page every alert's `runbook` annotation links into.
const OPERATIONS: &str = "docs/operations.md";

/// The Markdown pages: the README, the changelog and every page of `docs/`, as (path from the
/// root, text).
fn docs() -> Vec<(String, String)> {
    let mut files = vec!["README.md".to_string(), "CHANGELOG.md".to_string()];
    let dir = root().join("docs");
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 5, "found only {pages:?} in docs/");
    files.extend(pages);
    files.into_iter().map(|f| (f.clone(), read(&f))).collect()
}

/// The lines of a Markdown text outside fenced code blocks, with their line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// The anchors GitHub makes for the headings of a Markdown text: the heading's text lower-cased,
/// every character but letters, digits, `-`, `_` and spaces dropped, spaces made hyphens; a
/// repeated anchor gets `-1`, `-2`, ... appended.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(heading) = line[hashes..]
            .strip_prefix(' ')
            .filter(|_| (1..=6).contains(&hashes))
        else {
            continue;
        };
        let heading = heading.trim().trim_end_matches('#').trim_end();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// The link targets of a Markdown line: what stands in `](...)`, outside inline code.
fn link_targets(line: &str) -> Vec<String> {
    // Drop inline code: `](` inside backticks is text, not a link.
    let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        targets.push(
            after[..end]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string(),
        );
        rest = &after[end..];
    }
    targets
}

/// `base`'s directory joined with `relative`, `.` and `..` resolved, as a path from the root.
fn resolve_link(base: &str, relative: &str) -> String {
    let mut parts: Vec<&str> = base.split('/').collect();
    parts.pop();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                assert!(
                    parts.pop().is_some(),
                    "{base}: the link {relative} leaves the repository"
                );
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let pages = docs();
    let mut checked = 0;
    let mut broken = Vec::new();
    for (file, text) in &pages {
        for (number, line) in prose_lines(text) {
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target
                    .split_once('#')
                    .map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    resolve_link(file, path)
                };
                let on_disk = root().join(&resolved);
                checked += 1;
                if !on_disk.exists() {
                    broken.push(format!(
                        "{file}:{number}: {target}: {resolved} does not exist"
                    ));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if !resolved.ends_with(".md") {
                    broken.push(format!(
                        "{file}:{number}: {target}: an anchor into a file that is not Markdown"
                    ));
                } else if !anchors(&std::fs::read_to_string(&on_disk).unwrap()).contains(anchor) {
                    broken.push(format!(
                        "{file}:{number}: {target}: no heading of {resolved} makes #{anchor}"
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked >= 50,
        "found only {checked} relative links in {} pages",
        pages.len()
    );
}

#[test]
fn every_table_in_the_docs_has_as_many_cells_in_each_row_as_its_header() {
    for (file, text) in docs() {
        let mut header: Option<usize> = None;
        for (number, line) in prose_lines(&text) {
            let row = line.trim();
            if !row.starts_with('|') {
                header = None;
                continue;
            }
            // GitHub splits a row at every pipe not escaped with a backslash, inside code too.
            let cells = row.trim_matches('|').replace("\\|", "").split('|').count();
            match header {
                None => header = Some(cells),
                Some(expected) => {
                    assert_eq!(
                        cells, expected,
                        "{file}:{number}: {cells} cells in a table of {expected} columns: {row}"
                    )
                }
            }
        }
    }
}

/// Host paths a compose file references: bind-mount sources, env files (their default), the build
/// context and Dockerfile.
fn compose_references(compose: &str) -> Vec<PathBuf> {
    let deploy = root().join("deploy");
    let mut paths = Vec::new();
    let mut context = None;
    for line in compose.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        let item = line.strip_prefix("- ").unwrap_or(line).trim_matches('"');
        if let Some(source) = item.strip_prefix("./").and_then(|s| s.split(':').next()) {
            paths.push(deploy.join(source));
        } else if let Some(dir) = item.strip_prefix("context: ") {
            context = Some(deploy.join(dir));
            paths.push(deploy.join(dir));
        } else if let Some(file) = item.strip_prefix("dockerfile: ") {
            paths.push(
                context
                    .clone()
                    .expect("context: before dockerfile:")
                    .join(file),
            );
        } else if let Some(var) = item.strip_prefix("${").and_then(|s| s.strip_suffix('}')) {
            let (_, default) = var
                .split_once(":-")
                .unwrap_or_else(|| panic!("{item}: give a default"));
            paths.push(deploy.join(default));
        }
    }
    paths
}

#[test]
fn compose_references_files_that_exist() {
    let compose = read("deploy/compose.yaml");
    let paths = compose_references(&compose);
    assert!(paths.len() >= 7, "found only {paths:?} in compose.yaml");
    for path in &paths {
        assert!(
            path.exists(),
            "deploy/compose.yaml references {}, which does not exist",
            path.display()
        );
    }
    for service in [
        "kafka:",
        "topics:",
        "worker:",
        "ingest:",
        "prometheus:",
        "grafana:",
    ] {
        assert!(
            compose.contains(&format!("\n  {service}\n")),
            "compose.yaml has no service {service}"
        );
    }
    assert!(compose.contains("image: apache/kafka:4.1.1"));
    assert!(compose.contains("command: [\"run\"") && compose.contains("command: [\"ingest\"]"));
    assert!(
        compose.contains("DEDUPE_WRITE_KEYS")
            || read("deploy/ingest.env.example").contains("DEDUPE_WRITE_KEYS=")
    );
}

#[test]
fn image_builds_like_the_readme_and_runs_unprivileged() {
    let dockerfile = read("deploy/Dockerfile");
    for needle in [
        "FROM rust:1.95-bookworm AS build",
        "libclang-dev libssl-dev pkg-config",
        "cargo build --release --locked -p dedupe-cli --bin dedupe",
        "FROM debian:bookworm-slim",
        "ca-certificates libssl3",
        "--uid 10001",
        "USER 10001:10001",
        "VOLUME /var/lib/dedupe",
        "EXPOSE 9464 8080",
        "STOPSIGNAL SIGTERM",
        "HEALTHCHECK",
        "/healthz",
        "DEDUPE_METRICS_ADDR=0.0.0.0:9464",
        "DEDUPE_INGEST_LISTEN=0.0.0.0:8080",
    ] {
        assert!(
            dockerfile.contains(needle),
            "deploy/Dockerfile lacks {needle:?}"
        );
    }
    // The runtime stage copies the binary and the configuration, nothing else.
    let runtime = dockerfile
        .rsplit_once("FROM debian:bookworm-slim")
        .unwrap()
        .1;
    for copy in runtime.lines().filter(|l| l.starts_with("COPY ")) {
        assert!(
            copy.starts_with("COPY --from=binary /usr/local/bin/dedupe ")
                || copy.starts_with("COPY config/ "),
            "{copy}"
        );
    }
    // The binary comes from the Rust build stage unless deploy/local/image.sh says `prebuilt`.
    assert!(
        dockerfile.contains("ARG BINARY=build") && dockerfile.contains("FROM ${BINARY} AS binary"),
        "the binary's stage is chosen by BINARY, `build` by default"
    );
    let ignore = read(".dockerignore");
    assert!(
        ignore.lines().any(|l| l == "target/"),
        ".dockerignore keeps target/ out of the build context"
    );
}

/// section -> keys named in config/dedupe.toml (set or commented out).
fn documented_config_keys() -> BTreeMap<String, BTreeSet<String>> {
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in read("config/dedupe.toml").lines() {
        if let Some(name) = line
            .strip_prefix('[')
            .and_then(|l| l.split_once(']'))
            .map(|(n, _)| n)
        {
            section = name.to_string();
            keys.entry(section.clone()).or_default();
        } else if let Some((key, _)) = line.trim_start_matches('#').trim_start().split_once(" = ") {
            if !section.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.entry(section.clone())
                    .or_default()
                    .insert(key.to_string());
            }
        }
    }
    keys
}

#[test]
fn deployment_environment_variables_are_configuration_keys() {
    // The configuration reads DEDUPE_<SECTION>_<KEY>; an unknown key in a known section stops the
    // service at start. Variables outside the sections are passed through untouched.
    let documented = documented_config_keys();
    let not_keys = ["DEDUPE_WRITE_KEYS", "DEDUPE_KAFKA_SASL_PASSWORD"];
    let files = [
        "deploy/Dockerfile",
        "deploy/compose.yaml",
        "deploy/ingest.env.example",
        "deploy/k8s/worker.yaml",
        "deploy/k8s/ingest.yaml",
    ];
    let mut seen = 0;
    for file in files {
        let text = read(file);
        for (start, _) in text.match_indices("DEDUPE_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if not_keys.contains(&name.as_str()) {
                continue;
            }
            let rest = name["DEDUPE_".len()..].to_ascii_lowercase();
            let Some(section) = documented
                .keys()
                .find(|s| rest.starts_with(&format!("{s}_")))
            else {
                continue;
            };
            let key = &rest[section.len() + 1..];
            assert!(
                documented[section].contains(key),
                "{file}: {name} sets {section}.{key}, which config/dedupe.toml does not document"
            );
            seen += 1;
        }
    }
    assert!(
        seen >= 5,
        "found only {seen} configuration variables in the deployment files"
    );
    assert!(Path::new(&root().join("config/dedupe.toml")).exists());
}

#[test]
fn test_helpers_parse_what_they_claim() {
    // Tokens: words that merely contain dedupe_ are not metric names.
    let tokens =
        metric_tokens("rate(dedupe_x_total[5m]) + my_dedupe_y + dedupe_z_bucket{le=\"1\"}");
    assert_eq!(
        tokens,
        BTreeSet::from(["dedupe_x_total".to_string(), "dedupe_z_bucket".to_string()])
    );
    // Only histograms have _bucket series.
    let declared = BTreeMap::from([
        ("dedupe_a_seconds".to_string(), "Histogram".to_string()),
        ("dedupe_b".to_string(), "Gauge".to_string()),
    ]);
    assert_eq!(
        resolve("dedupe_a_seconds_bucket", &declared),
        Some("dedupe_a_seconds")
    );
    assert_eq!(resolve("dedupe_b_bucket", &declared), None);
    assert_eq!(resolve("dedupe_c", &declared), None);
    // Folded expressions are read whole.
    let a = &alerts("    - alert: A\n      expr: >-\n        x\n        and y\n      for: 5m\n")[0];
    assert_eq!(a.field("expr").as_deref(), Some("x and y"));
    assert_eq!(a.field("for").as_deref(), Some("5m"));
    // Runbooks belong to the alert above them, in the rules and in their tests.
    let found =
        runbooks("- alert: A\n  runbook: \"x.md#a\"\n- alertname: B\n  exp_annotations:\n    runbook: \"x.md#b\"\n");
    assert_eq!(
        found,
        [
            ("A".to_string(), "x.md#a".to_string()),
            ("B".to_string(), "x.md#b".to_string())
        ]
    );
    // Anchors as GitHub makes them: punctuation dropped, spaces to hyphens, repeats numbered; not
    // from a heading inside a code block.
    let made = anchors(
        "# `DedupeWindowUnderPromise`\n## Kafka TLS, SASL and ACLs\n### Notes\n### Notes\n```\n# not a heading\n```\n",
    );
    let expected = [
        "dedupewindowunderpromise",
        "kafka-tls-sasl-and-acls",
        "notes",
        "notes-1",
    ];
    assert_eq!(
        made,
        expected
            .iter()
            .map(|a| a.to_string())
            .collect::<BTreeSet<_>>()
    );
    // Links: inline code is not a link; titles are not part of the target.
    assert_eq!(
        link_targets("see [a](docs/a.md#x) and `[b](c)` and [d](e.md \"title\")"),
        ["docs/a.md#x", "e.md"]
    );
    assert_eq!(
        resolve_link("docs/operations.md", "../config/dedupe.toml"),
        "config/dedupe.toml"
    );
    assert_eq!(
        resolve_link("README.md", "docs/testing.md"),
        "docs/testing.md"
    );
}

/// The figures tables of docs/performance.md and docs/testing.md are what
/// `deploy/bench/figures.py` renders from the benches' JSON in `docs/bench/`, each of those pages
/// keeps at most five dated lines (dated runs belong in the changelog), the README's headline
/// figures say what the tables say, and every figure with a measurement's unit in the README,
/// docs/operations.md and docs/architecture.md is either rendered from docs/bench/ (the demo's
/// and the build's times from docs/bench/build.json) or listed as a setting. The script names
/// every difference.
#[test]
fn measured_figures_in_the_docs_are_rendered_from_the_bench_json() {
    let output = Command::new("python3")
        .args(["deploy/bench/figures.py", "--check"])
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): install Debian's `python3` package (3.11 or newer)")
        });
    assert!(
        output.status.success(),
        "deploy/bench/figures.py --check failed ({}); run deploy/bench/figures.py to render the \
         tables, and make the README and the pages it names say what docs/bench/ says:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The figures `dedupe plan` starts from are the measurements of docs/performance.md: each one
/// read again from its bench's raw JSON in docs/bench/, so a new run that moves one fails here
/// until `dedupe::plan::FIGURES` follows.
#[test]
fn the_plan_agrees_with_a_measured_ten_minute_ledger_run_within_ten_percent() {
    let run: serde_json::Value = serde_json::from_str(&read("docs/bench/plan-run.json")).unwrap();
    let r = &run["result"];
    assert!(
        r["seconds"].as_f64().unwrap() >= 600.0,
        "a ten-minute run: {r}"
    );
    let rate = r["ids_per_sec"].as_f64().unwrap();
    let plan = dedupe::plan::Ask {
        ids_per_sec: rate,
        promise: std::time::Duration::from_secs(86_400),
        changelog_retention: std::time::Duration::from_secs(7 * 86_400),
        replication: 3,
        generations: 8,
        digests: true,
        least_budget_bytes: dedupe::config::LedgerConfig::default().least_budget_bytes(),
    }
    .plan()
    .unwrap();
    let measured = r["ledger_bytes"].as_f64().unwrap() / r["ledger_ids"].as_f64().unwrap();
    assert!(
        (plan.bytes_per_id / measured - 1.0).abs() <= 0.10,
        "the plan's {} bytes per id against {measured} measured",
        plan.bytes_per_id
    );
    // The ids a day at the run's rate, in the plan and as the run's ledger grew.
    let held_a_day = r["ledger_ids"].as_f64().unwrap() * 86_400.0 / r["seconds"].as_f64().unwrap();
    assert!(
        (plan.ids_held / held_a_day - 1.0).abs() <= 0.10,
        "{} against {held_a_day}",
        plan.ids_held
    );
}

#[test]
fn the_plan_starts_from_the_measured_figures() {
    let json = |file: &str| -> serde_json::Value {
        serde_json::from_str(&read(&format!("docs/bench/{file}")))
            .unwrap_or_else(|e| panic!("{file}: {e}"))
    };
    let f = dedupe::plan::FIGURES;
    let close = |what: &str, figure: dedupe::plan::Figure, measured: f64, file: &str| {
        assert!(
            figure.source.contains(file),
            "{what}: its source ({}) should name {file}",
            figure.source
        );
        assert!(
            (figure.value - measured).abs() <= measured.abs() * 0.001,
            "{what}: the plan says {} but {file} measured {measured}",
            figure.value
        );
    };
    let ledger = json("ledger-100m.json");
    close(
        "bytes per id",
        f.bytes_per_id,
        ledger["result"]["bytes_per_key"].as_f64().unwrap(),
        "ledger-100m.json",
    );
    close(
        "resident at 100M",
        f.rss_100m_bytes,
        ledger["result"]["peak_rss_bytes"].as_f64().unwrap(),
        "ledger-100m.json",
    );
    let digests = json("digests.json");
    close(
        "bytes per id with digests",
        f.bytes_per_id_with_digests,
        digests["runs"]["with"]["result"]["bytes_per_key"]
            .as_f64()
            .unwrap(),
        "digests.json",
    );
    close(
        "bytes per id without digests",
        f.bytes_per_id_digest_baseline,
        digests["runs"]["without"]["result"]["bytes_per_key"]
            .as_f64()
            .unwrap(),
        "digests.json",
    );
    let billion = json("billion.json");
    close(
        "resident at 1B",
        f.rss_1b_bytes,
        billion["runs"]["1b"]["result"]["peak_rss_bytes"]
            .as_f64()
            .unwrap(),
        "billion.json",
    );
    let pipeline = json("pipeline.json");
    close(
        "worker throughput",
        f.worker_msgs_per_sec,
        pipeline["result"]["dedupe_msgs_per_sec"].as_f64().unwrap(),
        "pipeline.json",
    );
    // The 50M handovers: the slowest of the runs, and the changelog's bytes per id.
    let handoff = json("handoff-50m.json");
    let runs: Vec<&serde_json::Value> = handoff["runs"]
        .as_object()
        .unwrap()
        .values()
        .map(|r| &r["result"])
        .collect();
    let slowest = runs
        .iter()
        .map(|r| r["handover_ready_secs"].as_f64().unwrap())
        .fold(0.0, f64::max);
    close(
        "handover of 50M",
        f.handover_50m_secs,
        slowest,
        "handoff-50m.json",
    );
    let per_id = runs[0]["changelog_bytes"].as_f64().unwrap() / runs[0]["ids"].as_f64().unwrap();
    close(
        "changelog bytes per id",
        f.changelog_bytes_per_id,
        per_id,
        "handoff-50m.json",
    );
    let handoff = json("handoff-200m.json");
    close(
        "handover of 200M",
        f.handover_200m_secs,
        handoff["runs"]["1"]["result"]["handover_ready_secs"]
            .as_f64()
            .unwrap(),
        "handoff-200m.json",
    );
}

/// docs/operations.md's sizing table is `dedupe plan`'s own output for its example, so the docs
/// and the command cannot disagree.
#[test]
fn the_sizing_table_in_the_docs_is_what_dedupe_plan_prints() {
    let output = Command::new(env!("CARGO_BIN_EXE_dedupe"))
        .args(["plan", "--ids-per-sec", "5000", "--promise", "24h"])
        .output()
        .expect("run dedupe plan");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8(output.stdout).unwrap();
    let docs = read(OPERATIONS);
    assert!(
        docs.contains(&format!("$ dedupe plan --ids-per-sec 5000 --promise 24h\n{table}")),
        "docs/operations.md should show `dedupe plan --ids-per-sec 5000 --promise 24h` as it prints today:\n{table}"
    );
    // The JSON form says the same and names where its figures come from.
    let output = Command::new(env!("CARGO_BIN_EXE_dedupe"))
        .args([
            "plan",
            "--ids-per-sec",
            "5000",
            "--promise",
            "24h",
            "--json",
        ])
        .output()
        .expect("run dedupe plan --json");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["ids_held"], 432e6);
    assert_eq!(json["figures_from"], "docs/performance.md");
    assert_eq!(json["workers"], 1);
}

/// Given a configuration file, `dedupe plan` says whether its budget holds the promise at the
/// rate: the shipped configuration's 16 GiB does at 5,000 ids/s per worker, not at 50,000.
#[test]
fn dedupe_plan_says_whether_a_configuration_holds_its_promise() {
    let plan = |rate: &str| -> serde_json::Value {
        let output = Command::new(env!("CARGO_BIN_EXE_dedupe"))
            .args([
                "plan",
                "--config",
                "config/dedupe.toml",
                "--ids-per-sec",
                rate,
                "--json",
            ])
            .current_dir(root())
            .output()
            .expect("run dedupe plan");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let slow = plan("5000");
    assert_eq!(slow["config"]["holds_promise"], true, "{slow}");
    // The configuration's promise is the plan's when --promise is not given.
    assert_eq!(slow["promise_secs"], 86_400);
    let fast = plan("50000");
    assert_eq!(fast["config"]["holds_promise"], false, "{fast}");
    assert!(fast["config"]["window_secs"].as_f64().unwrap() < 86_400.0);
    // A rate that is not a positive number is refused, naming the flag.
    for bad in ["--ids-per-sec=-5", "--ids-per-sec=NaN", "--ids-per-sec=0"] {
        let output = Command::new(env!("CARGO_BIN_EXE_dedupe"))
            .args(["plan", bad])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--ids-per-sec")
                && String::from_utf8_lossy(&output.stderr).contains("not a positive number"),
            "{bad}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
