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

stamp=$venv/.installed
if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
  [ -x "$venv/bin/python" ] || { log "creating virtualenv $venv"; "$py" -m venv "$venv"; }
  log "pip install -e .[dev]"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$here[dev]" 2>&1 |
    grep -v "^WARNING: Location" >&2 || true
  "$venv/bin/python" -c "import grpc, uvloop, hpack, kubernetes, psutil, prometheus_client, watchdog, pyroute2" ||
    { log "python packages missing after pip install"; exit 1; }
  touch "$stamp"
fi
