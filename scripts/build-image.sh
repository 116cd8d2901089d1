#!/usr/bin/env bash
# build-image.sh — build the koordlet-py image (Containerfile) with no registry: `make image`.
#
#   bash scripts/build-image.sh                 # -> out/image/koordlet-py-<version>.oci.tar (and
#                                               #    koordlet-py-<version>.rootfs.tar.gz, its root tree)
#   bash scripts/build-image.sh --context-only  # only the build context (Containerfile + wheelhouse), for
#                                               # `docker build` / `podman build` elsewhere; prints its dir
#
# 1. A wheelhouse built on this host (`pip wheel`): the project and every dependency at requirements.lock's
#    version. pip inside the build never reaches an index (a machine whose certificate chain the image lacks
#    can still build).
# 2. The base image the Containerfile names (BASE_IMAGE): when it is not in the local storage, a Debian 12
#    minbase root made with debootstrap from this machine's own apt archive, trimmed and committed as
#    localhost/koordlet-py-base:bookworm. Elsewhere pass BASE_IMAGE=docker.io/library/debian:bookworm-slim.
# 3. `buildah bud` (chroot isolation, vfs storage under $KOORDLET_TOOLS/buildah: nothing of the host's
#    container storage is touched), then an OCI archive that `ctr images import` and `skopeo` take.
# 4. The image's root tree as a tar (install-baremetal.sh --rootfs: bare metal with no Python on the node).
# The image is named koordlet-py:<version from pyproject.toml>, the name deploy/ and the chart use.
#
# Knobs: IMAGE_REPOSITORY (koordlet-py), BASE_IMAGE (local debootstrap base), KOORDLET_TOOLS (<repo>/.tools),
#        IMAGE_OUT (<repo>/out/image), IMAGE_REBUILD=1 (build even when nothing changed since the last build).
#        Needs root (debootstrap, buildah's chroot).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=${KOORDLET_TOOLS:-$here/.tools}
out=${IMAGE_OUT:-$here/out/image}
repository=${IMAGE_REPOSITORY:-koordlet-py}
py=${PYTHON:-$here/.venv/bin/python}
[ -x "$py" ] || py=python3
log() { echo "build-image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

version=$("$py" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$here/pyproject.toml")
image=$repository:$version
context=$out/context
archive=$out/koordlet-py-$version.oci.tar
rootfs=$out/koordlet-py-$version.rootfs.tar.gz

# One build at a time in this output dir (the host suite's image test and the v2 stage may both ask for it); an image
# already built from the same inputs (the checkout's files as they are now, the names and the base) is not built
# again: IMAGE_REBUILD=1 builds it anyway.
mkdir -p "$out"
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"
inputs=$( { (cd "$here" && git ls-files -z --cached --others --exclude-standard | xargs -0 sha256sum 2>/dev/null) || true
           echo "$repository $version ${BASE_IMAGE:-debootstrap}"; } | sha256sum | cut -c1-64)
if [ "${1:-}" != --context-only ] && [ "${IMAGE_REBUILD:-0}" != 1 ] && [ -s "$archive" ] && [ -s "$rootfs" ] &&
   [ "$(cat "$out/.inputs" 2>/dev/null)" = "$inputs" ]; then
  log "unchanged: $image was built from these inputs ($archive, $rootfs); IMAGE_REBUILD=1 builds it again"
  echo "$archive"
  exit 0
fi
rm -f "$out/.inputs"

# ---- 1. context: Containerfile + wheelhouse --------------------------------------------------------
# The wheelhouse is requirements.lock's (the versions a bare-metal node installs, each file checked against its
# sha256), kept per lock and only the project's wheel is rebuilt.
deps_key=$(sha256sum "$here/requirements.lock" | cut -c1-16)
wheels=$tools/image/wheels-$deps_key
if [ ! -f "$wheels/.complete" ]; then
  log "wheelhouse: pip wheel requirements.lock into $wheels"
  rm -rf "$wheels"; mkdir -p "$wheels"
  "$py" -m pip wheel -q --disable-pip-version-check --require-hashes --no-deps --wheel-dir "$wheels" \
    -r "$here/requirements.lock" >&2 || die "pip wheel failed"
  touch "$wheels/.complete"
fi
rm -rf "$context"; mkdir -p "$context/wheels"
cp "$here/Containerfile" "$context/Containerfile"
cp "$wheels"/*.whl "$context/wheels/"
build_src=$(mktemp -d); trap 'rm -rf "$build_src"' EXIT
# Only what is committed (plus the working tree's changes to it) goes into the image: no .venv, no out/.
git -C "$here" ls-files -z --cached --others --exclude-standard |
  (cd "$here" && xargs -0 -I{} sh -c '[ -e "{}" ] && cp --parents -P "{}" "$0"' "$build_src")
"$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir "$context/wheels" \
  "$build_src" >&2 2>&1 || die "pip wheel of the project failed"
if [ "${1:-}" = --context-only ]; then
  log "context ready: $context (docker build -t $image $context)"
  echo "$context"; exit 0
fi

# ---- tools -----------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap and buildah's chroot isolation)"
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  aptlog=/tmp/koordlet-py-apt-image.log
  apt-get install -y -q --no-install-recommends "${need[@]}" >"$aptlog" 2>&1 || {
    apt-get update -q >>"$aptlog" 2>&1
    apt-get install -y -q --no-install-recommends "${need[@]}" >>"$aptlog" 2>&1 ||
      { tail -20 "$aptlog" >&2; die "apt-get install ${need[*]} failed"; }
  }
fi
storage=(--root "$tools/buildah/storage" --runroot "$tools/buildah/run" --storage-driver vfs)
bah() { buildah "${storage[@]}" "$@"; }

# ---- 2. base image ---------------------------------------------------------------------------------
base=${BASE_IMAGE:-localhost/koordlet-py-base:bookworm}
if ! bah inspect --type image "$base" >/dev/null 2>&1; then
  [ -z "${BASE_IMAGE:-}" ] || die "BASE_IMAGE $base is not in $tools/buildah/storage (buildah ${storage[*]} pull it first)"
  roottar=$tools/image/base-bookworm.tar
  if [ ! -s "$roottar" ]; then
    uri=""
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -r "$f" ] && uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f") && [ -n "$uri" ] && break
    done
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$uri" ] || die "no Debian archive URI in the host's apt sources"
    root=$(mktemp -d "$tools/image/root.XXXXXX")
    log "base: debootstrap --variant=minbase bookworm (from the host's apt archive)"
    debootstrap --variant=minbase bookworm "$root" "$uri" >"$tools/image/debootstrap.log" 2>&1 ||
      { tail -20 "$tools/image/debootstrap.log" >&2; rm -rf "$root"; die "debootstrap failed"; }
    # What Debian's slim image leaves out: apt lists and caches, docs, man pages, locales.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
      "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
      "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/dev/*
    tar -C "$root" --numeric-owner -cf "$roottar.tmp" .
    mv "$roottar.tmp" "$roottar"
    rm -rf "$root"
  fi
  ctr=$(bah from scratch)
  bah add "$ctr" "$roottar" / >/dev/null
  bah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  bah commit -q --rm "$ctr" "$base" >/dev/null
  log "base: committed $base"
fi

# ---- 3. build and export ---------------------------------------------------------------------------
revision=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
source_url=$(git -C "$here" remote get-url origin 2>/dev/null || echo unknown)
started=$(date +%s)
log "buildah bud $image (base $base)"
bah bud -q --pull=false --isolation chroot --network host --layers=false \
  --build-arg "BASE_IMAGE=$base" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" -t "$image" -f "$context/Containerfile" "$context" >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log" >&2; die "buildah bud failed (log: $out/build.log)"; }
rm -f "$archive"
# The archive names the image as kubelet and containerd's CRI spell it: an image without a registry
# (koordlet-py:0.1.0) is docker.io/library/koordlet-py:0.1.0 to them, so `ctr -n k8s.io images import`
# of this archive is found by a pod spec that says koordlet-py:<version>.
case $repository in
  */*) first=${repository%%/*}
       if [[ $first == *.* || $first == *:* || $first == localhost ]]; then ref=$image; else ref=docker.io/$image; fi ;;
  *)   ref=docker.io/library/$image ;;
esac
bah push -q "$image" "oci-archive:$archive:$ref" >&2
size=$(bah images --format '{{.Size}}' "$image" | head -1)
echo "$size" > "$out/image-size"
log "built $image in $(( $(date +%s) - started )) s: $size uncompressed, $(du -m "$archive" | cut -f1) MiB archive ($archive)"

# ---- 4. the image's root tree, for bare metal ------------------------------------------------------
# The same image as one root file system (its layers applied by buildah, whiteouts and all): what
# `install-baremetal.sh --rootfs` unpacks on a node and runs under systemd with RootDirectory=, so the node needs
# no Python of its own. gzip, because every node can unpack it.
ctr=$(bah from -q --pull=false "$image")
mnt=$(bah mount "$ctr")
tar -C "$mnt" --numeric-owner --sort=name -cf - . | gzip -6 >"$rootfs.tmp" ||
  { bah umount "$ctr" >/dev/null; bah rm "$ctr" >/dev/null; die "packing the root tree failed"; }
bah umount "$ctr" >/dev/null
bah rm "$ctr" >/dev/null
mv "$rootfs.tmp" "$rootfs"
log "root tree for bare metal: $(du -m "$rootfs" | cut -f1) MiB ($rootfs)"
echo "$inputs" >"$out/.inputs"
echo "$archive"
