"""requirements.lock against pyproject.toml: every runtime dependency pinned inside its range, every file hashed,
and nothing in the lock that no dependency explains. scripts/install-baremetal.sh installs exactly this (with
``pip install --require-hashes --no-deps``), so every node runs the same versions; `make lock` regenerates it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
BUILD_REQUIRES = "koordlet-py (pyproject.toml::build-system.requires)"
PROJECT = "koordlet-py (pyproject.toml)"


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # what pulled it in, as pip-compile annotates it


def _pins() -> dict[str, Pin]:
    pins = {}
    for block in re.split(r"\n(?=\S)", LOCK.read_text()):
        head = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if head is None:
            assert block.startswith("#"), f"an unexplained line in the lock: {block[:80]!r}"
            continue
        # "    # via X" or "    # via" followed by "    #   X" lines
        via = re.findall(r"^\s+# via (\S.*)$", block, re.M)
        listed = re.search(r"^\s+# via\n((?:\s+#   \S.*\n?)+)", block, re.M)
        if listed:
            via += [line.split("#   ", 1)[1].strip() for line in listed.group(1).splitlines()]
        name = canonicalize_name(head.group(1))
        pins[name] = Pin(name, head.group(2), tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", block)), tuple(via))
    return pins


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_runtime_dependency_is_pinned_inside_its_range() -> None:
    pins = _pins()
    for spec in _project()["project"]["dependencies"]:
        requirement = Requirement(spec)
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement.name} is a dependency of pyproject.toml but not in the lock"
        assert requirement.specifier.contains(pin.version, prereleases=True), f"{pin.name}=={pin.version} vs {spec}"
        assert PROJECT in pin.via, f"{pin.name}: the lock does not say pyproject.toml asks for it"


def test_the_build_backend_is_pinned_so_the_project_builds_without_fetching_anything() -> None:
    pins = _pins()
    for spec in _project()["build-system"]["requires"]:
        requirement = Requirement(spec)
        pin = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(pin.version), f"{pin.name}=={pin.version} vs {spec}"
        assert BUILD_REQUIRES in pin.via


def test_every_pin_has_hashes_and_nothing_is_there_that_no_dependency_explains() -> None:
    pins = _pins()
    assert pins, "an empty lock"
    for pin in pins.values():
        assert pin.hashes, f"{pin.name}: no --hash (pip --require-hashes would refuse the whole lock)"
        assert pin.via, f"{pin.name}: pinned, but nothing says what needs it"
        for reason in pin.via:
            if reason in (PROJECT, BUILD_REQUIRES):
                continue
            assert canonicalize_name(reason) in pins, f"{pin.name} is needed by {reason}, which is not in the lock"
    # and every pin is reached from pyproject.toml through that chain
    reached = {name for name, pin in pins.items() if PROJECT in pin.via or BUILD_REQUIRES in pin.via}
    while True:
        more = {name for name, pin in pins.items()
                if name not in reached and any(canonicalize_name(reason) in reached for reason in pin.via)}
        if not more:
            break
        reached |= more
    assert set(pins) == reached, f"pinned, but needed by nothing pyproject.toml asks for: {set(pins) - reached}"


def test_the_lock_names_how_it_was_made() -> None:
    assert "make lock" in LOCK.read_text().split("\n\n", 1)[0]
    assert "pip-compile" in (ROOT / "Makefile").read_text()
