"""The deploy tests' tools: Helm and kubectl from scripts/fetch-tools.sh (pinned, in the project's prefix),
the plain manifests as kustomize lists them, and `helm template` of the chart."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "chart" / "koordlet-py"


@functools.cache
def tool(name: str) -> str:
    """The path of ``helm``, ``kubectl-1.35`` or ``kubectl-1.32``, fetched and checked on first use."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-tools.sh"), name], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/fetch-tools.sh {name} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip()


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def base_documents() -> list[dict[str, Any]]:
    """Every object of deploy/kustomization.yaml's resources, in its order (what `kubectl apply -k` sends)."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in documents((DEPLOY / name).read_text())]


def helm_template(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template koordlet-py deploy/chart/koordlet-py --include-crds ARGS`."""
    done = subprocess.run([tool("helm"), "template", "koordlet-py", str(CHART), "--include-crds", *args],
                          capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed:\n{done.stderr}")
    return done


def chart_documents(*args: str) -> list[dict[str, Any]]:
    return documents(helm_template(*args).stdout)


def object_key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]
