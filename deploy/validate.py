#!/usr/bin/env python3
"""Render and schema-validate gpu-tracer's deployment; print every object as JSON.

Run by tests/tests/deploy.rs with the Python of the venv `cargo xtask setup` makes (it holds
helm-python-sdk, Helm's own Go engine, and kubernetes-validate, the Kubernetes OpenAPI schemas).

  validate.py REPO_ROOT  ->  {"base": [...], "privileged_overlay": [...], "chart": {VARIANT: [...]},
                              "lint": {...}, "refused": {CASE: why}, "unvalidated": [...],
                              "crd_checked": N, "crd_refused": [why, ...],
                              "shipped": {"rules": {FILE: parsed}, "dashboards": {FILE: parsed}}}
                              on stdout, exit 0
Any render, lint or schema error: a message on stderr, exit 1.
"""
import json
import os
import shutil
import subprocess
import sys

import copy
import glob

import helm_python
import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

# Oldest Kubernetes the deployment supports (securityContext.appArmorProfile is 1.30) and the
# newest schema kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]
# Kinds with no schema in Kubernetes' OpenAPI (the Prometheus operator's CRDs): checked against the
# CRDs' own openAPIV3Schema, vendored in deploy/schemas/prometheus-operator (its README says which).
CRD_GROUPS = ("monitoring.coreos.com/",)
CRD_DIR = "deploy/schemas/prometheus-operator"
CRD_SCHEMAS = {}
RELEASE = "gpu-tracer"
VARIANTS = {
    "default": {},
    "privileged": {"privileged": True},
    "cuda_memlock_price": {
        "cudaPerfEventUprobes": True,
        "memlockCapability": True,
        "config": {"attribution": {"price_per_gpu_hour": 2.5}},
        "priorityClassName": "system-node-critical",
        "runtimeClassName": "nvidia",
    },
    "tracefs_uprobes": {"cudaTracefsUprobes": True},
    "servicemonitor": {"serviceMonitor": {"enabled": True}},
    # Every option a node-agent chart has, set, under a release name that is not the chart's.
    "options": {
        "fullnameOverride": "gt-agent",
        "namespaceOverride": "gpu-monitoring",
        "image": {"repository": "registry.example/gpu-tracer", "tag": "0.1.0",
                  "digest": "sha256:" + "ab" * 32},
        "service": {"type": "ClusterIP", "clusterIP": None, "port": 9500,
                    "annotations": {"example.com/scrape": "true"}, "labels": {"tier": "node"}},
        "podSecurityContext": {"fsGroup": 2000},
        "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
        "hostNetwork": True,
        "livenessProbe": {"initialDelaySeconds": 30, "periodSeconds": 60},
        "readinessProbe": {"failureThreshold": 6},
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccount": {"create": False, "name": "existing-sa"},
        "podAnnotations": {"example.com/owner": "ml-platform"},
        "podLabels": {"team": "ml-platform"},
        "nodeSelector": {"pool": "gpu"},  # replaces the default GPU affinity
        "priorityClassName": "",
        "extraArgs": ["--log", "debug"],
        "extraEnv": [{"name": "RUST_LOG_STYLE", "value": "never"}],
        "extraVolumes": [{"name": "extra", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}],
        "updateStrategy": {"type": "OnDelete"},
        "resources": {"requests": {"cpu": "50m"}},
        "serviceMonitor": {"enabled": True, "scrapeTimeout": "10s", "honorLabels": False,
                           "labels": {"team": "ml-platform"}, "additionalLabels": {"release": "kps"},
                           "relabelings": [{"targetLabel": "cluster", "replacement": "eu-1"}],
                           "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                                                  "regex": "gpu_tracer_api_.*"}]},
        "podMonitor": {"enabled": True, "interval": "15s"},
    },
    # The rules (PrometheusRule) and the dashboards (ConfigMaps for Grafana's sidecar).
    "rules_dashboards": {
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboards": {"enabled": True, "annotations": {"grafana_folder": "GPU"}, "namespace": "monitoring"},
    },
    "rules_without_dcgm": {"prometheusRule": {"enabled": True, "dcgmCompat": False, "alerts": False}},
    # TLS on the endpoints and a bearer token for /metrics, followed by the probes and monitors.
    "metrics_security": {
        "metricsTls": {"secretName": "gpu-tracer-tls"},
        "metricsToken": {"secretName": "gpu-tracer-token"},
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
    },
    # OTLP export: endpoint, protocol, events and resource attributes in the config, headers from a
    # Secret in the environment, the collector's CA mounted.
    "otlp": {
        "otlp": {"endpoint": "https://otel-collector.monitoring:4317", "protocol": "grpc",
                 "metricExportIntervalMs": 30000, "events": ["violation", "bill"],
                 "resourceAttributes": {"k8s.cluster.name": "eu-1"},
                 "headersSecret": {"name": "otlp-headers"}, "caSecret": {"name": "otlp-ca"}},
    },
    # A release named otherwise gets prefixed names (never a ClusterRole called "monitoring").
    "release_monitoring": {},
    # Scheduling: an affinity of one's own with a nodeSelector (both apply); null: every node.
    "affinity_and_selector": {
        "nodeSelector": {"pool": "gpu"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "example.com/accelerator", "operator": "Exists"}]}]}}},
    },
    "affinity_null": {"affinity": None},
    "no_service": {"service": {"enabled": False}, "podMonitor": {"enabled": True}},
}
# More variants from the test that runs this (tests/tests/deploy.rs: the agent's whole
# configuration, every key set, as the chart's `config`).
VARIANTS.update(json.loads(os.environ.get("GPU_TRACER_EXTRA_VARIANTS") or "{}"))
# Values the chart's values.schema.json must refuse (a typo fails the install, never vanishes).
MUST_REFUSE = {
    "unknown top-level key": {"imagee": {"tag": "x"}},
    "unknown nested key": {"serviceMonitor": {"enabled": True, "intervall": "1m"}},
    "wrong type": {"metricsPort": "9400"},
    "bad duration": {"serviceMonitor": {"enabled": True, "interval": "30 seconds"}},
    "bad enum": {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
    "bad otlp endpoint": {"otlp": {"endpoint": "otel-collector:4317"}},
    # The agent's configuration, checked against its own schema (definitions.agentConfig).
    "config typo": {"config": {"attribution": {"pricePerGPUHour": 2.5}}},
    "config bad enum": {"config": {"attribution": {"cost_policy": "memorytime"}}},
    "config out of range": {"config": {"drain_interval_ms": 0}},
    "config wrong type": {"config": {"snapshot_interval_ms": "1s"}},
    "config unknown event kind": {"config": {"otlp": {"events": ["violations"]}}},
    "serviceMonitor without a Service": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}},
}

errors = []
unvalidated = []
crd_checked = [0]


def load_crds(root):
    for f in sorted(glob.glob(os.path.join(root, CRD_DIR, "*.yaml"))):
        crd = yaml.safe_load(open(f))
        for v in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])
            CRD_SCHEMAS[key] = v["schema"]["openAPIV3Schema"]


def pruned_fields(obj, schema, path):
    """Fields the API server would drop without a word (structural pruning): not in the schema."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out = []
    if isinstance(obj, dict):
        props, more = schema.get("properties"), schema.get("additionalProperties")
        for k, v in obj.items():
            if props is not None and k in props:
                out += pruned_fields(v, props[k], f"{path}.{k}")
            elif isinstance(more, dict):
                out += pruned_fields(v, more, f"{path}.{k}")
            elif props is not None or more is False:
                out.append(f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += pruned_fields(v, schema["items"], f"{path}[{i}]")
    return out


def crd_errors(o):
    """What the API server would refuse (schema) or silently drop (unknown fields) in a CRD object.
    metadata is ObjectMeta, which the API server checks itself (the CRD schema says only "object")."""
    schema = CRD_SCHEMAS.get((o["apiVersion"], o["kind"]))
    if schema is None:
        return [f"no vendored CRD for {o['apiVersion']} {o['kind']} in {CRD_DIR}"]
    out = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
           for e in jsonschema.Draft7Validator(schema).iter_errors(o)]
    body = {k: v for k, v in o.items() if k != "metadata"}
    out += [f"{f}: not in the CRD's schema (the API server would drop it)" for f in pruned_fields(body, schema, "")]
    return out


def docs(text, origin):
    out = [d for d in yaml.safe_load_all(text) if d]
    for d in out:
        if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d:
            errors.append(f"{origin}: a document is not a Kubernetes object: {str(d)[:80]}")
    return out


def validate(objs, origin):
    for o in objs:
        what = f"{origin}: {o.get('kind')}/{o.get('metadata', {}).get('name')}"
        if o["apiVersion"].startswith(CRD_GROUPS):
            crd_checked[0] += 1
            errors.extend(f"{what}: invalid against its CRD: {e}" for e in crd_errors(o))
            continue
        for v in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(o, v, strict=True)
            except SchemaNotFoundError:
                errors.append(f"{what}: no schema for {o['apiVersion']} {o['kind']} in Kubernetes {v}")
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                errors.append(f"{what}: invalid against Kubernetes {e.version} (strict): {path}: {e.message}")


def main():
    root = sys.argv[1]
    load_crds(root)
    base_dir = os.path.join(root, "deploy/kubernetes/base")
    kust = yaml.safe_load(open(os.path.join(base_dir, "kustomization.yaml")))
    base = []
    for f in kust["resources"]:
        base += docs(open(os.path.join(base_dir, f)).read(), f"deploy/kubernetes/base/{f}")
    validate(base, "base")

    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not kubectl:
        errors.append("kubectl not found (its kustomize renders the privileged overlay); run `cargo xtask setup`")
        overlay = []
    else:
        r = subprocess.run([kubectl, "kustomize", os.path.join(root, "deploy/kubernetes/privileged")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            errors.append(f"kubectl kustomize deploy/kubernetes/privileged failed: {r.stderr.strip()}")
            overlay = []
        else:
            overlay = docs(r.stdout, "privileged overlay")
    validate(overlay, "privileged overlay")

    chart_dir = os.path.join(root, "deploy/helm/gpu-tracer")
    chart = helm_python.Chart.load(chart_dir)
    lint = helm_python.lint(chart_dir, strict=True, namespace=RELEASE, kube_version="v1.30.0")
    for m in lint.get("messages") or []:
        if m.get("severity", 0) >= 2:
            errors.append(f"helm lint: {m.get('path')}: {m.get('error')}")
    for e in lint.get("errors") or []:
        errors.append(f"helm lint: {e}")
    rendered = {}
    for name, values in VARIANTS.items():
        release = "monitoring" if name == "release_monitoring" else RELEASE
        manifests = chart.render(values=values, name=release, namespace=RELEASE, is_install=True)
        objs = []
        for path, text in sorted(manifests.items()):
            if path.endswith(".yaml"):
                objs += docs(text, f"chart[{name}] {path}")
        validate(objs, f"chart[{name}]")
        rendered[name] = objs

    refused = {}
    for what, values in MUST_REFUSE.items():
        try:
            chart.render(values=values, name=RELEASE, namespace=RELEASE, is_install=True)
            errors.append(f"values.schema.json accepts {what}: {values}")
        except Exception as e:  # helm_python raises its own error types
            refused[what] = str(e)

    # The CRD check refuses what it must: a typo'd field and an interval Prometheus cannot parse.
    bad = copy.deepcopy(next(o for o in rendered["servicemonitor"] if o["kind"] == "ServiceMonitor"))
    bad["spec"]["endpoints"][0]["intervall"] = "15s"
    bad["spec"]["endpoints"][0]["interval"] = "15 seconds"
    crd_refused = crd_errors(bad)

    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    # The rule files and dashboards the chart ships, parsed, to compare with what it renders.
    files = os.path.join(chart_dir, "files")
    shipped = {
        "rules": {f: yaml.safe_load(open(os.path.join(files, "prometheus", f)))
                  for f in sorted(os.listdir(os.path.join(files, "prometheus"))) if f.endswith(".rules.yml")},
        "dashboards": {f: json.load(open(os.path.join(files, "grafana", f)))
                       for f in sorted(os.listdir(os.path.join(files, "grafana"))) if f.endswith(".json")},
    }
    json.dump({"base": base, "privileged_overlay": overlay, "chart": rendered, "lint": lint, "refused": refused,
               "unvalidated": unvalidated, "crd_checked": crd_checked[0], "crd_refused": crd_refused,
               "k8s_versions": K8S_VERSIONS, "shipped": shipped}, sys.stdout)


main()
