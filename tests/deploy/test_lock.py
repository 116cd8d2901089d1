"""The locks against pyproject.toml and each other: every dependency pinned inside its range, every file hashed,
and nothing in a lock that no dependency explains.

- requirements.lock: the runtime dependencies and the build backend. scripts/install-baremetal.sh installs exactly
  this (``pip install --require-hashes --no-deps``), so every node runs the same versions.
- requirements-dev.lock: the same pins plus the dev extras. scripts/install-deps.sh installs exactly this for
  `make test`, `make demo` and CI, so a release made upstream after the lock cannot change a run.
`make lock` regenerates both.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
BUILD_REQUIRES = "koordlet-py (pyproject.toml::build-system.requires)"
PROJECT = "koordlet-py (pyproject.toml)"


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # what pulled it in, as pip-compile annotates it


def _pins(lock: Path = LOCK) -> dict[str, Pin]:
    pins = {}
    for block in re.split(r"\n(?=\S)", lock.read_text()):
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


@pytest.mark.parametrize("lock", [LOCK, DEV_LOCK], ids=lambda p: p.name)
def test_every_pin_has_hashes_and_nothing_is_there_that_no_dependency_explains(lock: Path) -> None:
    pins = _pins(lock)
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


def test_every_dev_dependency_is_pinned_inside_its_range_in_the_dev_lock() -> None:
    pins = _pins(DEV_LOCK)
    for spec in _project()["project"]["optional-dependencies"]["dev"]:
        requirement = Requirement(spec)
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement.name} is a dev dependency but not in requirements-dev.lock"
        assert requirement.specifier.contains(pin.version, prereleases=True), f"{pin.name}=={pin.version} vs {spec}"


def test_the_dev_lock_holds_every_runtime_pin_at_the_same_version_and_files() -> None:
    """What the tests run is what a node installs: the runtime lock is the dev lock's runtime part."""
    runtime, dev = _pins(LOCK), _pins(DEV_LOCK)
    for name, pin in runtime.items():
        assert name in dev, f"{name} is in requirements.lock but not in requirements-dev.lock"
        assert dev[name].version == pin.version, f"{name}: {pin.version} on nodes, {dev[name].version} in the tests"
        assert set(dev[name].hashes) == set(pin.hashes), f"{name}=={pin.version}: the two locks hash other files"


def test_the_test_command_installs_the_dev_lock_with_hashes_and_nothing_unpinned() -> None:
    script = (ROOT / "scripts/install-deps.sh").read_text()
    assert re.search(r"--require-hashes --no-deps -r \"\$lock\"", script)
    assert 'lock=$here/requirements-dev.lock' in script
    assert "--no-deps --no-build-isolation -e" in script
    # the other stages install nothing of their own
    for script_path in ("scripts/v2-stage.sh", "scripts/test-all.sh", "scripts/v2-guest.sh"):
        assert "pip install" not in (ROOT / script_path).read_text(), script_path


def test_the_locks_name_how_they_were_made() -> None:
    for lock in (LOCK, DEV_LOCK):
        assert "make lock" in lock.read_text().split("\n\n", 1)[0], lock.name
    assert "pip-compile" in (ROOT / "Makefile").read_text()
