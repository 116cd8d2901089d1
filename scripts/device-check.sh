#!/usr/bin/env bash
# Hardware checks for the lent device machine (H100, writable cgroup v2); never run in CI.
#   bash scripts/device-check.sh v2    tests marked `cgroupv2` against the real unified cgroup v2
#   bash scripts/device-check.sh gpu   tests marked `gpu` against the real NVML
# That machine has Python 3.12 with grpcio, protobuf, psutil, prometheus-client, nvidia-ml-py, pytest
# and hypothesis; the rest travels as wheels in .whl/ and containerd/runc/busybox as .debs in .debs/
# (both git-ignored; see README "Checks on real cgroup v2 and a real GPU").
set -euo pipefail
mode=${1:?usage: device-check.sh v2|gpu}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
case "$mode" in
  v2)
    if compgen -G ".debs/*.deb" >/dev/null && ! command -v containerd >/dev/null; then
      for f in .debs/*.deb; do dpkg -x "$f" /; done
    fi
    marker=cgroupv2 ;;
  gpu) marker=gpu ;;
  *) echo "usage: device-check.sh v2|gpu" >&2; exit 2 ;;
esac
exec "$py" -m pytest -q -rs -p no:cacheprovider -o addopts="" -m "$marker" tests
