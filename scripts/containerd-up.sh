#!/usr/bin/env bash
# containerd-up.sh — install (if missing), configure and start a private containerd 1.6 (Debian bookworm
# package) with its CRI plugin, runc, an isolated CNI bridge, and a local busybox image imported
# into the k8s.io namespace. Prints the CRI socket path (only that) on stdout; progress goes to stderr.
#
#   SOCK=$(bash containerd-up.sh)      # idempotent: if already up, just prints the socket
#   bash containerd-down.sh            # stops it (by saved PIDs) and cleans up
#
# Needs root. No registry is contacted: the image is built from Debian's busybox-static with python3's
# standard library. Knobs (environment):
#   CTRD_RUN=/run/koordlet-py/containerd          state dir, socket, pid file, log, CNI conf, IPAM data
#   CTRD_ROOT=/var/lib/koordlet-py/containerd     containerd root (content store, snapshots, bolt db)
#   CTRD_SNAPSHOTTER=overlayfs             or native (automatic fallback if overlay is unavailable)
#   CTRD_CNI=none                          bridge: isolated bridge (no uplink, no gateway, no masquerade,
#                                          no host routes) so POD-network sandboxes work;
#                                          none: no CNI config -> only NODE-network sandboxes work
#   CTRD_CNI_SUBNET=10.250.0.0/24          pod addresses (exist only inside the pods' own netns)
#   CTRD_BRIDGE=kpytest0                  bridge name
#   CTRD_IMAGE=localhost/busybox:local     image name; also used as sandbox ("pause") image
#   CTRD_LOG_LEVEL=info
#   CTRD_NO_INSTALL=1                      never call apt-get
#   CTRD_SYSTEMD_CGROUP=1                  runc's systemd cgroup driver (SystemdCgroup = true): pods in
#                                          kubepods.slice/.../cri-containerd-<id>.scope; needs systemd as PID 1
#   CTRD_VERSION=2.1                       the containerd generation: 2.1 (Debian unstable's, the default: the
#                                          current line), 1.7 (Debian 13's) or 1.6 (Debian 12's package, the
#                                          host's); the newer two are unpacked by scripts/apt-fetch.sh into
#                                          $KOORDLET_TOOLS/containerd-<gen> and run beside Debian 12's runc
#   CTRD_FETCH_ONLY=1                      install and fetch that generation, print nothing, start nothing
#                                          (scripts/v2-stage.sh: the VM has no network)
#   CTRD_NRI_SOCKET=                       containerd >= 1.7: NRI on, its socket at this path (unset: NRI off,
#                                          so no test containerd ever listens on the host's /var/run/nri)
#   CTRD_RUNC_HANDLERS=                    more runc generations, each a CRI runtime handler `runc-<gen>` beside the
#                                          default `runc` (Debian 12's 1.1.5): 1.3 (Debian unstable's 1.3.6, the
#                                          quadratic cpu.shares -> cpu.weight formula). Unpacked by
#                                          scripts/apt-fetch.sh into $KOORDLET_TOOLS/runc-<gen> with the glibc it
#                                          needs (2.38+, Debian 12 has 2.36), which patchelf makes its own
set -euo pipefail

RUN=${CTRD_RUN:-/run/koordlet-py/containerd}
ROOT=${CTRD_ROOT:-/var/lib/koordlet-py/containerd}
SNAP=${CTRD_SNAPSHOTTER:-overlayfs}
CNI=${CTRD_CNI:-none}
SUBNET=${CTRD_CNI_SUBNET:-10.250.0.0/24}
BRIDGE=${CTRD_BRIDGE:-kpytest0}
IMAGE=${CTRD_IMAGE:-localhost/busybox:local}
LEVEL=${CTRD_LOG_LEVEL:-info}
SYSTEMD_CGROUP=false
if [ "${CTRD_SYSTEMD_CGROUP:-}" = 1 ]; then
  [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] || { echo "containerd-up: CTRD_SYSTEMD_CGROUP=1 needs systemd as PID 1" >&2; exit 1; }
  SYSTEMD_CGROUP=true
fi
SOCK=$RUN/containerd.sock
PIDFILE=$RUN/containerd.pid
CONF=$RUN/config.toml
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GEN=${CTRD_VERSION:-2.1}

log() { echo "containerd-up: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

ctr_() { ctr -a "$SOCK" -n k8s.io "$@"; }
# Never `producer | grep -q` here: with pipefail, grep exiting at its first match can kill the producer
# with SIGPIPE and fail the whole test (seen in CI: ctr printed a second image name after grep left).
alive() { local p c; [ -f "$PIDFILE" ] && p=$(cat "$PIDFILE") && [ -d "/proc/$p" ] &&
          c=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null) && [[ $c == *"containerd --config $CONF"* ]]; }
has_image() { local l; l=$(ctr_ images ls -q 2>/dev/null) && grep -qxF "$IMAGE" <<<"$l"; }

# ---- fast path: already running and image present ------------------------------------------
if alive && ctr -a "$SOCK" version >/dev/null 2>&1 && has_image; then
  log "already running (pid $(cat "$PIDFILE"))"; echo "$SOCK"; exit 0
fi

# ---- install what is missing ----------------------------------------------------------------
mkdir -p "$RUN"
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null       || need+=(runc)
[ -x /bin/busybox ]              || need+=(busybox-static)
if [ "$CNI" = bridge ] && { [ ! -x /usr/lib/cni/bridge ] || [ ! -x /usr/lib/cni/host-local ]; }; then
  need+=(containernetworking-plugins)
fi
read -r -a RUNC_HANDLERS <<< "${CTRD_RUNC_HANDLERS:-}"
[ ${#RUNC_HANDLERS[@]} -eq 0 ] || command -v patchelf >/dev/null || need+=(patchelf)
if [ ${#need[@]} -gt 0 ]; then
  [ -z "${CTRD_NO_INSTALL:-}" ] || die "missing packages: ${need[*]} (CTRD_NO_INSTALL set)"
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # containerd's postinst starts the systemd unit only when systemd runs; nothing to stop here.
  if ! apt-get install -y -q --no-install-recommends "${need[@]}" >"$RUN.apt.log" 2>&1; then
    apt-get update -q >>"$RUN.apt.log" 2>&1 || true
    apt-get install -y -q --no-install-recommends "${need[@]}" >>"$RUN.apt.log" 2>&1 ||
      { tail -20 "$RUN.apt.log" >&2; die "apt-get install failed"; }
  fi
fi

# ---- the containerd generation -----------------------------------------------------------------
# Pinned by exact Debian version; the binaries (containerd, its runc shim, ctr) go first on PATH.
case $GEN in
  1.6) ;;
  1.7|2.1)
    if [ "$GEN" = 1.7 ]; then spec=(trixie containerd=1.7.24~ds1-6+deb13u1); else spec=(sid containerd=2.1.9+ds1-5); fi
    prefix=$(bash "$HERE/apt-fetch.sh" "${spec[0]}" "${KOORDLET_TOOLS:-$HERE/../.tools}/containerd-$GEN" "${spec[1]}") ||
      die "could not fetch containerd $GEN (${spec[*]})"
    export PATH=$prefix/usr/bin:$PATH ;;
  *) die "CTRD_VERSION=$GEN: known generations are 1.6, 1.7 and 2.1" ;;
esac
have=$(containerd --version | awk '{print $3}')
[[ $have == "$GEN".* || $have == v"$GEN".* ]] || die "containerd on PATH is $have, not $GEN"

# ---- more runc generations (CTRD_RUNC_HANDLERS) ----------------------------------------------------
# fetch_runc GEN: unpack that runc with its glibc and print the path of a runc that runs here. Debian unstable's
# runc is built against glibc 2.38+: a copy of it gets the unpacked glibc's loader as its interpreter and library
# path (a wrapper script would not do: runc re-executes /proc/self/exe for its container init).
fetch_runc() {
  local spec prefix bin
  case $1 in
    1.3) spec=(sid runc=1.3.6+ds1-1 libc6=2.43-7) ;;
    *) die "CTRD_RUNC_HANDLERS=$1: known runc generations are 1.3" ;;
  esac
  prefix=$(bash "$HERE/apt-fetch.sh" "${spec[0]}" "${KOORDLET_TOOLS:-$HERE/../.tools}/runc-$1" "${spec[@]:1}") ||
    die "could not fetch runc $1 (${spec[*]})"
  bin=$prefix/runc
  if [ ! -x "$bin" ]; then
    cp "$prefix/usr/sbin/runc" "$bin.tmp"
    patchelf --set-interpreter "$prefix/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
      --set-rpath "$prefix/usr/lib/x86_64-linux-gnu" "$bin.tmp" || die "patchelf failed on runc $1"
    mv "$bin.tmp" "$bin"
  fi
  local version; version=$("$bin" --version 2>&1) || die "$bin does not run: $version"
  [[ $version == "runc version $1."* ]] || die "$bin is not runc $1: ${version%%$'\n'*}"
  echo "$bin"
}
declare -A RUNC_BIN=()
for gen in "${RUNC_HANDLERS[@]}"; do RUNC_BIN[$gen]=$(fetch_runc "$gen"); done
[ "${CTRD_FETCH_ONLY:-}" != 1 ] || exit 0

# ---- stale instance (crashed / killed): clean it up first -------------------------------------
if [ -f "$PIDFILE" ] && ! alive; then
  log "stale pid file; cleaning up previous instance"
  if [ -x "$HERE/containerd-down.sh" ] || [ -f "$HERE/containerd-down.sh" ]; then
    CTRD_RUN=$RUN CTRD_ROOT=$ROOT CTRD_BRIDGE=$BRIDGE bash "$HERE/containerd-down.sh" >&2 || true
  else
    rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc"
  fi
fi

if [ "$SNAP" = overlayfs ] && ! grep -qw overlay /proc/filesystems; then
  modprobe overlay 2>/dev/null || true
  grep -qw overlay /proc/filesystems || { log "overlay fs unavailable; using native snapshotter"; SNAP=native; }
fi

mkdir -p "$RUN/cni/net.d" "$ROOT"
# ---- config -----------------------------------------------------------------------------------
# restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE, so runc cannot set the
#   sandbox's oom_score_adj=-998 ("failed to update /proc/self/oom_score_adj: Permission denied"
#   -> "can't get final child's PID from pipe: EOF"); with it, negative values are clamped to 0.
# netns_mounts_under_state_dir: pod netns bind mounts live under $RUN, so down.sh finds them.
# runc Root: keep runc's state under $RUN too (default is /run/containerd/runc).
# The parts both config formats share: the header, the CRI knobs and the runc runtime (their sections differ).
if [ "$GEN" = 2.1 ]; then config_version=3; else config_version=2; fi
cat > "$CONF" <<EOF
version = $config_version
root = "$ROOT/root"
state = "$RUN/state"
oom_score = 0

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  level = "$LEVEL"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$ROOT/opt"
EOF
cri_knobs() {
  cat <<EOF
    enable_selinux = false
    disable_apparmor = true
    restrict_oom_score_adj = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true
    netns_mounts_under_state_dir = true
EOF
}
# runc_runtime PLUGIN [LINE]: the runc runtime under PLUGIN's containerd table (LINE: one more key of that table).
runc_runtime() {
  cat <<EOF
    [plugins."$1".containerd]${2:+
      $2}
      default_runtime_name = "runc"
      [plugins."$1".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."$1".containerd.runtimes.runc.options]
          SystemdCgroup = $SYSTEMD_CGROUP
          Root = "$RUN/runc"
EOF
  local gen
  for gen in "${RUNC_HANDLERS[@]}"; do
    cat <<EOF
      [plugins."$1".containerd.runtimes."runc-$gen"]
        runtime_type = "io.containerd.runc.v2"
        [plugins."$1".containerd.runtimes."runc-$gen".options]
          SystemdCgroup = $SYSTEMD_CGROUP
          Root = "$RUN/runc-$gen"
          BinaryName = "${RUNC_BIN[$gen]}"
EOF
  done
}
if [ "$GEN" = 2.1 ]; then
  # containerd 2.x: config version 3. The CRI plugin is split: images (snapshotter, the pinned sandbox image),
  # runtime (the runtimes, CNI, the security knobs) and the gRPC service (streaming); systemd_cgroup is gone.
  {
    echo '  [plugins."io.containerd.cri.v1.images"]'
    echo "    snapshotter = \"$SNAP\""
    echo '    [plugins."io.containerd.cri.v1.images".pinned_images]'
    echo "      sandbox = \"$IMAGE\""
    echo '  [plugins."io.containerd.cri.v1.runtime"]'
    cri_knobs
    echo '    [plugins."io.containerd.cri.v1.runtime".cni]'
    echo '      bin_dirs = ["/usr/lib/cni"]'
    echo "      conf_dir = \"$RUN/cni/net.d\""
    runc_runtime io.containerd.cri.v1.runtime
    echo '  [plugins."io.containerd.grpc.v1.cri"]'
    echo '    stream_server_address = "127.0.0.1"'
    echo '    stream_server_port = "0"'
  } >> "$CONF"
else
  # containerd 1.6 and 1.7: config version 2, one CRI plugin.
  {
    echo '  [plugins."io.containerd.grpc.v1.cri"]'
    echo "    sandbox_image = \"$IMAGE\""
    echo '    stream_server_address = "127.0.0.1"'
    echo '    stream_server_port = "0"'
    cri_knobs
    echo '    systemd_cgroup = false'
    echo '    [plugins."io.containerd.grpc.v1.cri".cni]'
    echo '      bin_dir = "/usr/lib/cni"'
    echo "      conf_dir = \"$RUN/cni/net.d\""
    runc_runtime io.containerd.grpc.v1.cri "snapshotter = \"$SNAP\""
  } >> "$CONF"
fi
if [ "$GEN" != 1.6 ]; then
  # NRI: off unless asked for (2.x has it on by default at /var/run/nri/nri.sock).
  if [ -n "${CTRD_NRI_SOCKET:-}" ]; then
    mkdir -p "$(dirname "$CTRD_NRI_SOCKET")"
    nri_disable=false nri_socket=$CTRD_NRI_SOCKET
  else
    nri_disable=true nri_socket=$RUN/nri/nri.sock
  fi
  cat >> "$CONF" <<EOF
  [plugins."io.containerd.nri.v1.nri"]
    disable = $nri_disable
    socket_path = "$nri_socket"
    plugin_path = "$RUN/nri/plugins"
    plugin_config_path = "$RUN/nri/conf.d"
EOF
fi

rm -f "$RUN/cni/net.d/"*.conflist
if [ "$CNI" = bridge ]; then
  # Isolated: the bridge has no IP and no uplink, no gateway, no masquerade, no routes in the pods
  # beyond their own subnet, and ip_forward is untouched -> nothing can leave the machine.
  cat > "$RUN/cni/net.d/10-kpytest.conflist" <<EOF
{"cniVersion":"0.4.0","name":"kpytest","plugins":[
 {"type":"bridge","bridge":"$BRIDGE","isGateway":false,"ipMasq":false,"hairpinMode":false,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"$SUBNET"}]],"routes":[],"dataDir":"$RUN/cni-ipam"}}]}
EOF
fi

# ---- start --------------------------------------------------------------------------------------
if ! alive; then
  rm -f "$SOCK" "$SOCK.ttrpc"
  log "starting containerd ($have, snapshotter=$SNAP, cni=$CNI, systemd cgroup=$SYSTEMD_CGROUP${CTRD_RUNC_HANDLERS:+, runc handlers $CTRD_RUNC_HANDLERS})"
  setsid containerd --config "$CONF" >"$RUN/containerd.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 100); do
    ctr -a "$SOCK" version >/dev/null 2>&1 && break
    alive || { tail -20 "$RUN/containerd.log" >&2; die "containerd exited"; }
    sleep 0.1
  done
  ctr -a "$SOCK" version >/dev/null 2>&1 || { tail -20 "$RUN/containerd.log" >&2; die "socket not up"; }
fi
plugins=$(ctr -a "$SOCK" plugins ls 2>/dev/null || true)
grep -E '^io\.containerd\.grpc\.v1 +cri ' <<<"$plugins" | grep -qw ok ||
  { tail -20 "$RUN/containerd.log" >&2; die "CRI plugin not loaded"; }

# ---- local image (OCI layout from busybox-static, stdlib python) ------------------------------
if ! has_image; then
  tarball=$ROOT/busybox-oci.tar
  if [ ! -s "$tarball" ]; then
    log "building $IMAGE from /bin/busybox"
    python3 - /bin/busybox "$tarball.tmp" "$IMAGE" <<'PY'
import gzip, hashlib, io, json, subprocess, sys, tarfile
busybox, out, name = sys.argv[1:4]
applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
def ti(n, typ=tarfile.REGTYPE, mode=0o755, size=0, link=""):
    t = tarfile.TarInfo(n); t.type, t.mode, t.size, t.linkname = typ, mode, size, link
    t.mtime = 0; t.uid = t.gid = 0; t.uname = t.gname = "root"; return t
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
    for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "root", "var", "usr", "usr/bin", "sbin"):
        tf.addfile(ti(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
    data = open(busybox, "rb").read()
    tf.addfile(ti("bin/busybox", size=len(data)), io.BytesIO(data))
    for a in sorted(set(applets) - {"busybox"}):
        if "/" not in a:
            tf.addfile(ti("bin/" + a, tarfile.SYMTYPE, 0o777, link="busybox"))
    for f, body in (("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
                    ("etc/group", b"root:x:0:\nnogroup:x:65534:\n")):
        tf.addfile(ti(f, mode=0o644, size=len(body)), io.BytesIO(body))
layer = raw.getvalue()
gz = io.BytesIO()
with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
    g.write(layer)
blobs = {}
def blob(b):
    d = hashlib.sha256(b).hexdigest(); blobs[d] = b; return "sha256:" + d, len(b)
ldig, lsize = blob(gz.getvalue())
j = lambda o: json.dumps(o, sort_keys=True, separators=(",", ":")).encode()
cdig, csize = blob(j({"created": "1970-01-01T00:00:00Z", "architecture": "amd64", "os": "linux",
    "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
               "Cmd": ["/bin/sleep", "infinity"], "WorkingDir": "/"},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "busybox-static"}]}))
mdig, msize = blob(j({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdig, "size": csize},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": ldig, "size": lsize}]}))
index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdig, "size": msize,
     "platform": {"architecture": "amd64", "os": "linux"},
     "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}]}
with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
    def add(n, b=None):
        t = ti(n, tarfile.DIRTYPE if b is None else tarfile.REGTYPE, 0o755 if b is None else 0o644, len(b or b""))
        tf.addfile(t, None if b is None else io.BytesIO(b))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'); add("index.json", json.dumps(index).encode())
    add("blobs"); add("blobs/sha256")
    for d, b in sorted(blobs.items()):
        add("blobs/sha256/" + d, b)
PY
    mv "$tarball.tmp" "$tarball"
  fi
  log "importing $IMAGE"
  ctr_ images import --snapshotter "$SNAP" "$tarball" >&2
  for _ in $(seq 1 20); do has_image && break; sleep 0.1; done
  has_image || { ctr_ images ls >&2 || true; die "image import failed: $IMAGE not listed"; }
fi

log "up: pid $(cat "$PIDFILE"), log $RUN/containerd.log"
echo "$SOCK"
