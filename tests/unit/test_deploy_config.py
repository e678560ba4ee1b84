"""The settings that deploy/ manifests pass are ones the server accepts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from asr_server.settings import Settings
from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"


def compose_defaults(value: str) -> str:
    """${NAME:-default} → default, as docker compose resolves it with NAME unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def manifests_env() -> list[tuple[str, dict[str, str]]]:
    configmap = yaml.safe_load((DEPLOY / "kubernetes/base/configmap.yaml").read_text())
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    server = next(s for s in compose["services"].values() if "ASR_PORT" in s.get("environment", {}))
    return [
        ("kubernetes configmap", {k: str(v) for k, v in configmap["data"].items()}),
        ("compose", {k: compose_defaults(str(v)) for k, v in server["environment"].items()}),
    ]


@pytest.mark.parametrize(("where", "env"), manifests_env())
def test_manifest_settings_validate(
    where: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.host == "0.0.0.0" and settings.port == 50051, where
    assert settings.metrics_port == 9464
    assert settings.engine.model == env["ASR_MODEL"]
    assert str(settings.engine.cache_dir) == env["ASR_CACHE_DIR"]


# -- Kubernetes manifests against the Kubernetes schemas (kubernetes-validate, offline) ------

KUBE = DEPLOY / "kubernetes"
#: the oldest version the manifests promise (native gRPC probes are GA in 1.27) and the newest
#: schema kubernetes-validate ships
KUBE_VERSIONS = ("1.27.0", "1.37.0")


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The objects a kustomization lists: its resource files, folders and generated ConfigMaps.

    Enough kustomize for these manifests (resources and configMapGenerator; patches are
    partial objects and left out), so the test needs no kubectl.
    """
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = folder / resource
        if path.is_dir():
            objects += kustomize(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for generator in spec.get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, name = entry.rpartition("=")
            data[key or name] = (folder / name).read_text()
        objects.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}}
            | {"data": data}
        )
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("variant", ["", "gpu", "autoscaling"])
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_kubernetes_manifests_validate_against_the_schemas(variant: str, version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objects = kustomize(KUBE / variant)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    kinds = sorted({o["kind"] for o in objects})
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} <= set(kinds)


def test_kubernetes_drain_probes_budget_and_proxy() -> None:
    objects = kustomize(KUBE / "autoscaling")
    server = by_kind(objects, "Deployment", "streamasr")["spec"]["template"]["spec"]
    env = by_kind(objects, "ConfigMap", "streamasr-config")["data"]
    drain_s = float(env["ASR_DRAIN_TIMEOUT_S"])
    assert server["terminationGracePeriodSeconds"] > drain_s
    (container,) = server["containers"]
    assert container["readinessProbe"]["grpc"]["service"] == "asr.v1.Recognizer"
    labels = by_kind(objects, "Deployment", "streamasr")["spec"]["selector"]["matchLabels"]
    assert by_kind(objects, "PodDisruptionBudget", "streamasr")["spec"]["selector"] == {
        "matchLabels": labels
    }
    proxy = by_kind(objects, "Deployment", "streamasr-proxy")["spec"]["template"]["spec"]
    assert proxy["containers"][0]["readinessProbe"]["grpc"]["port"] == 50051
    # the proxy keeps forwarding for its preStop sleep, and is given longer than that
    sleep_s = int(proxy["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert proxy["terminationGracePeriodSeconds"] > sleep_s
    # autoscaling: the HPA's metric is the one the prometheus-adapter rule publishes
    hpa = by_kind(objects, "HorizontalPodAutoscaler", "streamasr")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "streamasr"
    (metric,) = hpa["metrics"]
    rules = yaml.safe_load((KUBE / "autoscaling/prometheus-adapter-rules.yaml").read_text())
    assert metric["pods"]["metric"]["name"] in {r["name"]["as"] for r in rules["rules"]["custom"]}
    assert int(metric["pods"]["target"]["averageValue"]) < int(env["ASR_MAX_STREAMS"])


def envoy_settings(text: str) -> dict[str, Any]:
    """An Envoy config minus what differs by design between loopback and Kubernetes."""
    text = re.sub(r"^@ENDPOINTS@$", "", text, flags=re.M)
    config = yaml.safe_load(re.sub(r"@[A-Z_]+@", "0", text))
    del config["admin"]["address"]
    for listener in config["static_resources"]["listeners"]:
        del listener["address"]
    for cluster in config["static_resources"]["clusters"]:
        for key in ("type", "load_assignment", "dns_lookup_family", "dns_refresh_rate"):
            cluster.pop(key, None)
        cluster.pop("respect_dns_ttl", None)
    return config


def test_kubernetes_envoy_has_the_tested_settings() -> None:
    """deploy/envoy/envoy.yaml runs in tests/integration/test_proxies.py; Kubernetes' copy
    may differ only in addresses and in how it finds the replicas."""
    tested = envoy_settings((DEPLOY / "envoy/envoy.yaml").read_text())
    deployed = envoy_settings((KUBE / "proxy/envoy.yaml").read_text())
    assert deployed == tested
    cluster = yaml.safe_load((KUBE / "proxy/envoy.yaml").read_text())["static_resources"]
    assert cluster["clusters"][0]["type"] == "STRICT_DNS"


def exported_series() -> set[str]:
    """Every series name the server and the bridge can export."""
    from asr_bridge.metrics import BridgeMetrics
    from asr_server.metrics import Metrics

    names = set()
    for registry in (Metrics().registry, BridgeMetrics().registry):
        for family in registry.collect():
            names |= {family.name + s for s in ("", "_total", "_bucket", "_count", "_sum")}
    return names


@pytest.mark.parametrize(
    "path",
    ["grafana/dashboards/streamasr.json", "prometheus/alerts.yml", "prometheus/alerts_test.yml"],
)
def test_the_dashboard_and_alerts_name_only_series_that_exist(path: str) -> None:
    """A metric renamed or dropped in code would leave a panel blank or an alert that
    never fires, silently: every asr_* name they use must be one the code exports."""
    used = set(re.findall(r"\basr_[a-z_]+\b", (DEPLOY / path).read_text()))
    assert used, path
    assert used <= exported_series(), sorted(used - exported_series())


def copied_into_build(dockerfile: str) -> set[str]:
    """The context paths a Dockerfile's COPY instructions take (not ``COPY --from``)."""
    paths: set[str] = set()
    for line in (DEPLOY / dockerfile).read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--"):
            paths |= {w.rstrip("/") for w in words[1:-1]}
    return paths


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_the_images_copy_every_package_pyproject_installs(dockerfile: str) -> None:
    """The images list what they copy; a package left out still gets its console script
    (asr-bridge), which then fails with ModuleNotFoundError."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = packages | {"pyproject.toml", project["project"]["readme"]}
    assert needed <= copied_into_build(dockerfile), sorted(needed - copied_into_build(dockerfile))


def exported_buckets() -> dict[str, set[str]]:
    """Each histogram's ``le`` values, written as the server writes them ("1.0", "+Inf")."""
    from prometheus_client import Histogram

    from asr_bridge.metrics import BridgeMetrics
    from asr_server.metrics import Metrics

    buckets: dict[str, set[str]] = {}
    for metrics in (Metrics(), BridgeMetrics()):
        for metric in vars(metrics).values():
            if isinstance(metric, Histogram) and metric._labelnames:
                metric.labels(*metric._labelnames)  # a labelled histogram shows once used
        for family in metrics.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.setdefault(sample.name, set()).add(sample.labels["le"])
    return buckets


def test_the_alert_tests_feed_the_series_the_server_writes() -> None:
    """An alert test fed bucket bounds or codes the server never writes passes while the
    alert may never fire on real data."""
    from asr_server.errors import Status

    buckets = exported_buckets()
    tests = yaml.safe_load((DEPLOY / "prometheus/alerts_test.yml").read_text())["tests"]
    for test in tests:
        for entry in test["input_series"]:
            name = entry["series"].split("{")[0]
            label = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', entry["series"]))
            if name.endswith("_bucket"):
                assert label["le"] in buckets[name], (test["name"], entry["series"])
            if name == "asr_stream_errors_total":
                assert label["code"] in {s.value for s in Status}, (test["name"], entry["series"])


def test_the_down_alert_watches_every_scrape_job_the_deploy_files_define() -> None:
    """StreamasrDown named only the compose stack's job: on Kubernetes, scraped by
    prometheus/kubernetes-pods-scrape.yml's job, a pod whose metrics stopped answering
    never fired it."""
    alerts = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())
    (down,) = [r for g in alerts["groups"] for r in g["rules"] if r.get("alert") == "StreamasrDown"]
    compose = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    pods = yaml.safe_load((DEPLOY / "prometheus/kubernetes-pods-scrape.yml").read_text())
    jobs = {c["job_name"] for c in compose["scrape_configs"] if c["job_name"] != "prometheus"}
    jobs |= {c["job_name"] for c in pods["scrape_configs"]}
    for job in jobs:
        assert f'job="{job}"' in down["expr"], job
    # the pods job scrapes every annotated pod: the alert keeps to streamasr's, by the label
    # the job's labelmap makes of the Deployment's app.kubernetes.io/name
    pod_labels = yaml.safe_load((DEPLOY / "kubernetes/base/deployment.yaml").read_text())
    name = pod_labels["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    assert f'app_kubernetes_io_name="{name}"' in down["expr"]
