#!/usr/bin/env python3
"""Validates deploy/k8s/ offline.

Every document must parse and name apiVersion, kind and metadata.name. Built-in kinds are validated
strictly against the Kubernetes OpenAPI schemas bundled by `kubernetes-validate` (for the oldest
supported version, 1.28, and the newest bundled one). Custom resources (PrometheusRule,
ServiceMonitor, VolumeSnapshot, VolumeSnapshotClass, KEDA's ScaledObject) have no bundled schema:
their required fields are checked here. Then the manifests are checked against each other and
against the repository: PrometheusRule == deploy/prometheus/rules.yml, the workers take their
partitions from the consumer group (`--assignment group`, dynamic members: no `--member-id`, no
static worker count), a ScaledObject scales a StatefulSet on the ConfigMap's group and input topic, grace
period > shutdown timeout, ConfigMap keys are documented configuration keys.

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
    ("keda.sh/v1alpha1", "ScaledObject"),
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


def dedupe_config(by_kind):
    """The dedupe.toml of the ConfigMap that holds one, parsed; None when there is none or it does
    not parse (check_cross reports both)."""
    cms = [c for c in by_kind.get("ConfigMap", []) if "dedupe.toml" in (c.get("data") or {})]
    try:
        return tomllib.loads(cms[0]["data"]["dedupe.toml"]) if cms else None
    except tomllib.TOMLDecodeError:
        return None


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
    elif kind == "ScaledObject":
        target = spec.get("scaleTargetRef") or {}
        sets = [s["metadata"]["name"] for s in by_kind.get("StatefulSet", [])]
        # KEDA's default kind is Deployment: the StatefulSet must be named explicitly.
        if target.get("kind") != "StatefulSet" or target.get("apiVersion", "apps/v1") != "apps/v1" \
                or target.get("name") not in sets:
            fail(where, f"spec.scaleTargetRef {target} must be an apps/v1 StatefulSet, one of {sets}")
        low, high = spec.get("minReplicaCount"), spec.get("maxReplicaCount")
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
            fail(where, f"need 1 <= minReplicaCount <= maxReplicaCount, not {low!r}, {high!r}")
        triggers = spec.get("triggers")
        if not isinstance(triggers, list) or not triggers:
            return fail(where, "spec.triggers must be a non-empty list")
        worker = (dedupe_config(by_kind) or {}).get("worker", {})
        # worker.group_id's default is derived from the output topic (src/config/worker.rs).
        default_group = "dedupe." + worker.get("output_topic", "events.out")
        expected = {"consumerGroup": worker.get("group_id", default_group),
                    "topic": worker.get("input_topic", "events.in")}
        for t in triggers:
            if t.get("type") != "kafka":
                continue
            meta = t.get("metadata") or {}
            missing = [k for k in ("bootstrapServers", "consumerGroup", "topic", "lagThreshold") if not meta.get(k)]
            if missing:
                fail(where, f"kafka trigger lacks metadata {missing}")
            # Trigger metadata is a map of strings: a bare YAML number is rejected by the CRD.
            lag = meta.get("lagThreshold")
            if not (isinstance(lag, str) and re.fullmatch(r"[1-9][0-9]*", lag)):
                fail(where, f"kafka trigger lagThreshold {lag!r} must be a positive integer string")
            for key, value in expected.items():
                if meta.get(key) != value:
                    fail(where, f"kafka trigger {key} {meta.get(key)!r} must be the ConfigMap's {value!r}")


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


def arg_value(args, flag):
    """The value of `flag VALUE` or `flag=VALUE` in args, else None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


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
    worker = config.get("worker", {})
    shutdown_ms = worker.get("shutdown_timeout_ms", 25000)
    static_keys = [k for k in ("partitions", "worker_index", "worker_count") if k in worker]
    if static_keys:
        fail("configmap", f"worker.{', worker.'.join(static_keys)} would fix the partitions the group assigns")

    for sts in by_kind.get("StatefulSet", []):
        name, spec = sts["metadata"]["name"], sts["spec"]
        pod = spec["template"]["spec"]
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace * 1000 <= shutdown_ms:
            fail(name, f"terminationGracePeriodSeconds {grace} must exceed worker.shutdown_timeout_ms {shutdown_ms}")
        for c in pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            args = [str(a) for a in c.get("args", [])]
            # Scaling is `replicas` alone: Kafka's group coordinator assigns the partitions.
            if (arg_value(args, "--assignment") or worker.get("assignment")) != "group":
                fail(name, f"{c['name']}: needs --assignment group (or worker.assignment = \"group\" in the ConfigMap)")
            static = [a for a in args if a.split("=")[0] in ("--worker-count", "--worker-index", "--partitions")]
            static += [v for v in env if v in ("WORKER_COUNT", "WORKER_INDEX", "DEDUPE_WORKER_WORKER_COUNT",
                                               "DEDUPE_WORKER_WORKER_INDEX", "DEDUPE_WORKER_PARTITIONS")]
            if static:
                fail(name, f"{c['name']}: {static} would fix the partitions the group assigns")
            # Dynamic members: a stopped pod's partitions move at once instead of waiting, unserved,
            # for the session timeout as a static member's (group.instance.id) do.
            if arg_value(args, "--member-id") or "DEDUPE_WORKER_MEMBER_ID" in env:
                fail(name, f"{c['name']}: a static member id holds a stopped pod's partitions for the session timeout; leave --member-id unset")
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
