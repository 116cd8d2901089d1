#!/usr/bin/env bash
# Install what the project needs on a fresh Debian 12 machine (root): Debian packages for the
# runtime under test, then a virtualenv with the Python packages. Idempotent and quiet when done.
#   VENV=.venv (default)   PYTHON=python3 (default)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$here/.venv}
py=${PYTHON:-python3}
log() { echo "install-deps: $*" >&2; }

pkgs=(containerd runc busybox-static iproute2 ca-certificates systemd)
missing=()
for p in "${pkgs[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { log "need root to apt-get install ${missing[*]}"; exit 1; }
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/koordlet-py-apt.log 2>&1 || {
    apt-get update -q >>/tmp/koordlet-py-apt.log 2>&1
    apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/koordlet-py-apt.log 2>&1 ||
      { tail -20 /tmp/koordlet-py-apt.log >&2; log "apt-get failed"; exit 1; }
  }
fi

# The virtualenv holds exactly requirements-dev.lock (runtime, build backend and dev tools, every file checked
# against its sha256), then the project itself, editable, built with the lock's setuptools and resolving nothing.
# So a release made upstream since the lock changes nothing here; `make test-latest` tries the newest ones. The
# stamp holds the digest of the lock and pyproject.toml: a changed lock (or a virtualenv made another way, say by
# an older checkout's `pip install -e .[dev]`) is installed again, pins moving both up and down.
lock=$here/requirements-dev.lock
stamp=$venv/.installed
want=$(cat "$lock" "$here/pyproject.toml" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  [ -x "$venv/bin/python" ] || { log "creating virtualenv $venv"; "$py" -m venv "$venv"; }
  log "pip install --require-hashes -r requirements-dev.lock, then the project (editable)"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" --require-hashes --no-deps -r "$lock" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "${pip[@]}" --no-deps --no-build-isolation -e "$here" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$venv/bin/python" -m pip check -q --disable-pip-version-check >&2 ||
    { log "the virtualenv's packages do not fit together (pip check above)"; exit 1; }
  "$venv/bin/python" - "$lock" <<'PY' || { log "the virtualenv does not hold requirements-dev.lock's versions"; exit 1; }
import re, sys
from importlib import metadata
from packaging.utils import canonicalize_name
pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", open(sys.argv[1]).read(), re.M))
have = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
wrong = [f"{n}=={v} (installed: {have.get(canonicalize_name(n), 'none')})" for n, v in pins.items()
         if have.get(canonicalize_name(n)) != v]
for line in wrong:
    print("install-deps: not as locked:", line, file=sys.stderr)
sys.exit(1 if wrong else 0)
PY
  "$venv/bin/python" -c "import grpc, uvloop, hpack, kubernetes, psutil, prometheus_client, watchdog, pyroute2" ||
    { log "python packages missing after pip install"; exit 1; }
  echo "$want" >"$stamp"
fi
