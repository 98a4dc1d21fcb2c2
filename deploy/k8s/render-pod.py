#!/usr/bin/env python3
"""Renders the worker StatefulSet of deploy/k8s/worker.yaml as one Pod for `podman kube play`,
which in Debian's podman 4.3 takes Pods and Deployments but not StatefulSets.

    deploy/k8s/render-pod.py [--image IMAGE] [--host-network] [--env NAME=VALUE ...] >pod.yaml

The Pod is the StatefulSet's pod template as it is (probes, security context, mounts, resources),
named as Kubernetes names the first replica (dedupe-worker-0), with the ledger's
volumeClaimTemplate as the claim Kubernetes would make for it (ledger-dedupe-worker-0); podman
makes a volume of that name. The ConfigMap of deploy/k8s/configmap.yaml comes first in the
output, so one file carries both. The options exist for a machine without a cluster: the image
built there, the host's network to reach a broker on loopback (where podman refuses port
mappings, so the container's ports go and the probes take the port's number), and settings as
environment variables (which override the ConfigMap's file, as in any deployment).
"""

import argparse
import copy
import pathlib
import sys

import yaml

K8S = pathlib.Path(__file__).resolve().parent


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path, kind):
    found = [d for d in documents(path) if d.get("kind") == kind]
    if len(found) != 1:
        sys.exit(f"render-pod: expected one {kind} in {path}, found {len(found)}")
    return found[0]


def pod(statefulset, image, host_network, env):
    template = copy.deepcopy(statefulset["spec"]["template"])
    name = f"{statefulset['metadata']['name']}-0"
    spec = template["spec"]
    spec.pop("affinity", None)  # one pod on one machine: nothing to spread
    for claim in statefulset["spec"].get("volumeClaimTemplates", []):
        claim_name = claim["metadata"]["name"]
        spec.setdefault("volumes", []).append(
            {"name": claim_name, "persistentVolumeClaim": {"claimName": f"{claim_name}-{name}"}}
        )
    if host_network:
        spec["hostNetwork"] = True
    for container in spec["containers"]:
        if image:
            container["image"] = image
        if host_network:
            host_ports(container)
        container.setdefault("env", []).extend({"name": k, "value": v} for k, v in env)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
        "spec": spec,
    }


def host_ports(container):
    """On the host's network podman refuses port mappings: the container's ports go, and the probes
    that named one take its number."""
    named = {p["name"]: p["containerPort"] for p in container.pop("ports", []) if "name" in p}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = container.get(probe, {}).get("httpGet")
        if action and action.get("port") in named:
            action["port"] = named[action["port"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image")
    parser.add_argument("--host-network", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    env = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            sys.exit(f"render-pod: --env takes NAME=VALUE, not {item!r}")
        env.append((name, value))
    statefulset = one(K8S / "worker.yaml", "StatefulSet")
    configmap = one(K8S / "configmap.yaml", "ConfigMap")
    yaml.safe_dump_all([configmap, pod(statefulset, args.image, args.host_network, env)], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
