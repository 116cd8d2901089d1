#!/usr/bin/env bash
# test-latest.sh — `make test-latest`: the test command on the newest release of every dependency instead of
# requirements-dev.lock, to learn whether `make lock LOCK_ARGS=--upgrade` would be safe today. Not in CI: what
# PyPI publishes tomorrow must not change a submission's result (scripts/install-deps.sh installs the lock).
#   VENV_LATEST=.venv-latest (default)   PYTHON=python3 (default)
# It makes (or refreshes) its own virtualenv with `pip install --upgrade -e .[dev]`, prints every package whose
# version there differs from the lock (and those the lock lacks), then runs scripts/test-all.sh with that
# virtualenv. Any argument is handed to pytest in the host stage (PYTEST_ARGS).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
venv=${VENV_LATEST:-$here/.venv-latest}
py=${PYTHON:-python3}
log() { echo "test-latest: $*" >&2; }

bash scripts/install-deps.sh  # the Debian packages (and the locked .venv, which the lock check below reads)
[ -x "$venv/bin/python" ] || { log "creating virtualenv $venv"; "$py" -m venv "$venv"; }
log "pip install --upgrade -e .[dev] (the newest releases pyproject.toml allows)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade --upgrade-strategy eager -e "$here[dev]"

"$venv/bin/python" - requirements-dev.lock <<'PY'
import re
import sys
from importlib import metadata

from packaging.utils import canonicalize_name

pins = {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", open(sys.argv[1]).read(), re.M)}
have = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
have.pop("koordlet-py", None)
rows = [(n, pins.get(n, "(not in the lock)"), have.get(n, "(not installed)"))
        for n in sorted(set(pins) | set(have)) if pins.get(n) != have.get(n)]
rows = [r for r in rows if r[0] not in ("pip",)]
if not rows:
    print("test-latest: every package is at its locked version")
else:
    print(f"test-latest: {len(rows)} package(s) differ from requirements-dev.lock:")
    width = max(len(r[0]) for r in rows)
    for name, locked, latest in rows:
        print(f"  {name:<{width}}  lock {locked:<20} newest {latest}")
PY

VENV=$venv PYTEST_ARGS="${*:-${PYTEST_ARGS:-}}" exec bash scripts/test-all.sh
