#!/usr/bin/env python3
"""Validates deploy/k8s/ offline.

Every document must parse and name apiVersion, kind and metadata.name. Built-in kinds are validated
strictly against the Kubernetes OpenAPI schemas bundled by `kubernetes-validate` (for the oldest
supported version, 1.28, where the pod-index label appeared, and the newest bundled one). Custom
resources (PrometheusRule, ServiceMonitor, VolumeSnapshot, VolumeSnapshotClass) have no bundled
schema: their required fields are checked here. Then the manifests are checked against each other
and against the repository: PrometheusRule == deploy/prometheus/rules.yml, worker count ==
replicas, grace period > shutdown timeout, ConfigMap keys are documented configuration keys.

Usage: validate.py [DIR]   (exit status 1 on any failure, with one line per failure)
"""
import pathlib
import re
import sys
import tomllib

import kubernetes_validate
import yaml

KUBE_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
CUSTOM = {
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshot"),
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"),
}

here = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent).resolve()
root = here.parent.parent
failures = []


def fail(where, what):
    failures.append(f"{where}: {what}")


def load():
    docs = []
    for path in sorted(here.glob("*.yaml")):
        try:
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
                if doc is not None:
                    docs.append((f"{path.name}#{i}", doc))
        except yaml.YAMLError as e:
            fail(path.name, f"does not parse as YAML: {e}")
    return docs


def check_custom(where, doc, by_kind):
    kind, spec = doc["kind"], doc.get("spec") or {}
    if kind == "PrometheusRule":
        groups = spec.get("groups")
        if not isinstance(groups, list) or not groups:
            return fail(where, "spec.groups must be a non-empty list")
        for g in groups:
            if not g.get("name") or not isinstance(g.get("rules"), list):
                fail(where, f"group {g.get('name')!r} needs a name and rules")
            for r in g.get("rules", []):
                if not (r.get("alert") or r.get("record")) or not r.get("expr"):
                    fail(where, f"rule {r!r} needs alert or record, and expr")
        rules = yaml.safe_load((root / "deploy/prometheus/rules.yml").read_text())
        if spec != rules:
            fail(where, "spec differs from deploy/prometheus/rules.yml: run deploy/k8s/gen-prometheusrule.sh")
    elif kind == "ServiceMonitor":
        labels = (spec.get("selector") or {}).get("matchLabels")
        endpoints = spec.get("endpoints")
        if not labels or not endpoints:
            return fail(where, "spec.selector.matchLabels and spec.endpoints are required")
        services = [s for s in by_kind.get("Service", [])
                    if labels.items() <= (s["metadata"].get("labels") or {}).items()]
        if not services:
            fail(where, f"selects no Service (labels {labels})")
        for ep in endpoints:
            for s in services:
                if ep.get("port") not in [p.get("name") for p in s["spec"].get("ports", [])]:
                    fail(where, f"Service {s['metadata']['name']} has no port named {ep.get('port')!r}")
    elif kind == "VolumeSnapshotClass":
        if not doc.get("driver") or doc.get("deletionPolicy") not in ("Delete", "Retain"):
            fail(where, "driver and deletionPolicy (Delete or Retain) are required")
    elif kind == "VolumeSnapshot":
        source = spec.get("source") or {}
        if len([k for k in ("persistentVolumeClaimName", "volumeSnapshotContentName") if source.get(k)]) != 1:
            fail(where, "spec.source needs exactly one of persistentVolumeClaimName, volumeSnapshotContentName")
        classes = [c["metadata"]["name"] for c in by_kind.get("VolumeSnapshotClass", [])]
        if spec.get("volumeSnapshotClassName") not in classes:
            fail(where, f"volumeSnapshotClassName {spec.get('volumeSnapshotClassName')!r} is not among {classes}")
        claims = [f"{t['metadata']['name']}-{s['metadata']['name']}-0"
                  for s in by_kind.get("StatefulSet", []) for t in s["spec"].get("volumeClaimTemplates", [])]
        if source.get("persistentVolumeClaimName") not in claims:
            fail(where, f"snapshots {source.get('persistentVolumeClaimName')!r}, not a StatefulSet claim {claims}")


def documented_keys():
    """section -> keys named in config/dedupe.toml, set or commented out."""
    keys, section = {}, None
    for line in (root / "config/dedupe.toml").read_text().splitlines():
        m = re.match(r"^\[([a-z_.]+)\]", line)
        if m:
            section = m.group(1)
            keys.setdefault(section, set())
            continue
        m = re.match(r"^#?\s?([a-z_]+) = ", line)
        if m and section:
            keys[section].add(m.group(1))
    return keys


def check_cross(by_kind):
    cms = [c for c in by_kind.get("ConfigMap", []) if "dedupe.toml" in (c.get("data") or {})]
    if not cms:
        return fail("configmap", "no ConfigMap holds dedupe.toml")
    try:
        config = tomllib.loads(cms[0]["data"]["dedupe.toml"])
    except tomllib.TOMLDecodeError as e:
        return fail("configmap", f"dedupe.toml does not parse: {e}")
    documented = documented_keys()
    for section, table in config.items():
        if section not in documented:
            fail("configmap", f"[{section}] is not a section of config/dedupe.toml")
            continue
        for key in table:
            if key not in documented[section]:
                fail("configmap", f"{section}.{key} is not a key of config/dedupe.toml")
    shutdown_ms = config.get("worker", {}).get("shutdown_timeout_ms", 25000)

    for sts in by_kind.get("StatefulSet", []):
        name, spec = sts["metadata"]["name"], sts["spec"]
        pod = spec["template"]["spec"]
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace * 1000 <= shutdown_ms:
            fail(name, f"terminationGracePeriodSeconds {grace} must exceed worker.shutdown_timeout_ms {shutdown_ms}")
        for c in pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            count = env.get("WORKER_COUNT", {}).get("value")
            if count != str(spec.get("replicas")):
                fail(name, f"WORKER_COUNT {count!r} must equal replicas {spec.get('replicas')}")
            index = env.get("WORKER_INDEX", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if index != "metadata.labels['apps.kubernetes.io/pod-index']":
                fail(name, "WORKER_INDEX must come from the pod-index label")
            args = c.get("args", [])
            for flag, var in (("--worker-index", "$(WORKER_INDEX)"), ("--worker-count", "$(WORKER_COUNT)")):
                if flag not in args or args[args.index(flag) + 1] != var:
                    fail(name, f"args must pass {flag} {var}")
            sc = c.get("securityContext", {})
            if not sc.get("readOnlyRootFilesystem") or not pod.get("securityContext", {}).get("runAsNonRoot"):
                fail(name, "must run as non-root with a read-only root filesystem")
            probes = {p: (c.get(p) or {}).get("httpGet", {}).get("path") for p in ("livenessProbe", "readinessProbe")}
            if probes != {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}:
                fail(name, f"liveness must ask /healthz and readiness /readyz, not {probes}")
        if spec.get("persistentVolumeClaimRetentionPolicy", {}).get("whenScaled") != "Retain":
            fail(name, "ledger claims must be retained on scale-down")

    # Every Service and PodDisruptionBudget selects the pods of some workload.
    pod_labels = [w["spec"]["template"]["metadata"]["labels"]
                  for kind in ("StatefulSet", "Deployment") for w in by_kind.get(kind, [])]
    for kind, get in (("Service", lambda s: s["spec"].get("selector")),
                      ("PodDisruptionBudget", lambda s: s["spec"]["selector"].get("matchLabels"))):
        for obj in by_kind.get(kind, []):
            sel = get(obj) or {}
            if not any(sel.items() <= labels.items() for labels in pod_labels):
                fail(f"{kind} {obj['metadata']['name']}", f"selector {sel} matches no workload's pods")
    names = [s["metadata"]["name"] for s in by_kind.get("Service", [])]
    for job in ("dedupe", "dedupe-ingest"):
        if job not in names:
            fail("services", f"no Service named {job!r}: the job label the alert rules and dashboard expect")


def main():
    docs = load()
    by_kind = {}
    for where, doc in docs:
        if not isinstance(doc, dict) or not all(doc.get(k) for k in ("apiVersion", "kind")) \
                or not (doc.get("metadata") or {}).get("name"):
            fail(where, "needs apiVersion, kind and metadata.name")
            continue
        by_kind.setdefault(doc["kind"], []).append(doc)
    for where, doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc:
            continue
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            check_custom(where, doc, by_kind)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                fail(where, f"Kubernetes {version}: {'.'.join(str(p) for p in e.path)}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                fail(where, f"no Kubernetes {version} schema for {doc['apiVersion']} {doc['kind']}")
    check_cross(by_kind)
    for f in failures:
        print(f"k8s: FAIL {f}")
    kinds = sorted(f"{k}x{len(v)}" for k, v in by_kind.items())
    print(f"k8s: {len(docs)} documents ({', '.join(kinds)}), schemas {' and '.join(KUBE_VERSIONS)}: "
          f"{'FAILED' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
