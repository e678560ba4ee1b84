"""The TLS deployments (deploy/kubernetes/tls, deploy/docker-compose.tls.yml) give the server
settings it accepts, probe the health-only port, and mount credentials so they can rotate."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from asr_server.settings import Settings
from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
OVERLAY = DEPLOY / "kubernetes" / "tls"
HEALTH_PORT = 50052


class _ComposeLoader(yaml.SafeLoader):
    """Compose's merge tags (``!override``, ``!reset``) read as the plain value they tag."""


def _untagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_ComposeLoader.add_multi_constructor("!", _untagged)


def load(path: str) -> Any:
    return yaml.load((DEPLOY / path).read_text(), Loader=_ComposeLoader)  # noqa: S506


def patched_container() -> dict[str, Any]:
    patch = load("kubernetes/tls/deployment-tls.yaml")
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "asr-server"
    return container


def overlay_env() -> dict[str, str]:
    """What the pod sees: the base ConfigMap (envFrom), overridden by the patch's env."""
    env = {k: str(v) for k, v in load("kubernetes/base/configmap.yaml")["data"].items()}
    env.update({e["name"]: e["value"] for e in patched_container()["env"]})
    return env


def test_overlay_builds_on_base_and_patches_the_deployment() -> None:
    kustomization = load("kubernetes/tls/kustomization.yaml")
    assert "../base" in kustomization["resources"]
    for patch in kustomization["patches"]:
        assert (OVERLAY / patch["path"]).is_file()


def test_overlay_env_is_a_valid_tls_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    env = overlay_env()
    assert env["ASR_INSECURE"] == "0"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.tls and not settings.insecure
    assert settings.host == "0.0.0.0"
    assert settings.health_port == HEALTH_PORT
    assert settings.auth_tokens is not None


def test_probes_use_the_health_only_port() -> None:
    container = patched_container()
    assert {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"} in container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == HEALTH_PORT, probe
    assert container["readinessProbe"]["grpc"]["service"] == "asr.v1.Recognizer"


def test_secrets_are_mounted_read_only_as_whole_volumes() -> None:
    """subPath mounts are never updated by the kubelet: rotation would need a restart."""
    patch = load("kubernetes/tls/deployment-tls.yaml")
    volumes = {v["name"]: v for v in patch["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "streamasr-tls"
    assert volumes["tokens"]["secret"]["secretName"] == "streamasr-tokens"
    env = overlay_env()
    mounts = patched_container()["volumeMounts"]
    assert {m["name"] for m in mounts} == {"tls", "tokens"}
    for mount in mounts:
        assert mount["readOnly"] is True, mount
        assert "subPath" not in mount and "subPathExpr" not in mount, mount
    # every credential path the server is given lies in one of these mounts
    for key in ("ASR_TLS_CERT", "ASR_TLS_KEY", "ASR_AUTH_TOKENS"):
        assert any(env[key].startswith(m["mountPath"] + "/") for m in mounts), key


def rendered_resources(folder: Any) -> list[dict[str, Any]]:
    """The objects a kustomization's ``resources`` list, files and folders (recursively),
    before its patches."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            out += rendered_resources(path)
        else:
            out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


@pytest.mark.parametrize("overlay", ["tls", "gpu"])
def test_every_patch_of_an_overlay_finds_what_it_patches(overlay: str) -> None:
    """kubectl fails on a strategic-merge patch that matches nothing (a renamed Deployment
    or container), but kubectl is not on every test machine: the match is checked here."""
    folder = DEPLOY / "kubernetes" / overlay
    resources = rendered_resources(folder)
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    for patch in kustomization["patches"]:
        if "path" in patch:
            body = yaml.safe_load((folder / patch["path"]).read_text())
            kind, name = body["kind"], body["metadata"]["name"]
        else:
            kind, name = patch["target"]["kind"], patch["target"]["name"]
            body = None
        (target,) = [r for r in resources if (r["kind"], r["metadata"]["name"]) == (kind, name)]
        if body is None or kind != "Deployment":
            continue
        have = {c["name"] for c in target["spec"]["template"]["spec"]["containers"]}
        for container in body["spec"]["template"]["spec"].get("containers", []):
            assert container["name"] in have, (overlay, container["name"], have)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_overlay_renders_with_kubectl() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True
    ).stdout
    (deployment,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    assert "ASR_INSECURE" in names and "ASR_ENGINE__WORKERS" in names  # merged, not replaced
    assert container["livenessProbe"]["periodSeconds"] == 15  # base's timing kept
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {
        "/etc/streamasr/tls",
        "/home/asr/.cache/streamasr",
    }


def test_compose_tls_override_is_a_valid_tls_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docker-compose.yml + docker-compose.tls.yml, variables unset, as compose merges them."""

    def resolve(value: object) -> str:
        return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))

    env: dict[str, str] = {}
    for path in ("docker-compose.yml", "docker-compose.tls.yml"):
        env.update(
            {k: resolve(v) for k, v in load(path)["services"]["asr-server"]["environment"].items()}
        )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.tls and not settings.insecure
    assert settings.health_port == HEALTH_PORT
    # an empty ASR_TLS_CLIENT_CA would become Path(".") and stop the server at start
    assert settings.tls_client_ca is None


def test_the_gpu_overlay_lets_the_server_choose_one_batching_worker() -> None:
    # the base sets a worker per CPU (the CPU limit, 4 in the GPU patch): on one GPU the
    # server's own choice is one worker batching across streams
    patch = load("kubernetes/gpu/deployment-gpu.yaml")
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    (workers,) = [e for e in container["env"] if e["name"] == "ASR_ENGINE__WORKERS"]
    assert workers == {"name": "ASR_ENGINE__WORKERS", "value": "0", "valueFrom": None}
    assert Settings(engine={"workers": int(workers["value"])}).engine.workers == 0  # type: ignore[arg-type]


def test_both_images_health_check_the_health_only_port_when_there_is_one() -> None:
    # with TLS the gRPC port refuses plaintext: the check must use ASR_HEALTH_PORT
    checks = [
        line
        for name in ("Dockerfile", "Dockerfile.cuda")
        for line in (DEPLOY / name).read_text().splitlines()
        if "HealthStub" in line
    ]
    assert len(checks) == 2 and checks[0] == checks[1]
    assert "ASR_HEALTH_PORT" in checks[0]
