"""The settings that deploy/ manifests pass are ones the server accepts."""

from __future__ import annotations

import re

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
