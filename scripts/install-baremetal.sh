#!/usr/bin/env bash
# Install koordlet-py on a node with systemd: the version's own virtualenv, the koord-runtime-proxy socket and
# service units and the kubelet drop-in that points kubelet at the proxy, and (unless --proxy-only) koordlet's
# own unit. Idempotent: files are only rewritten when their content differs, systemd is reloaded only then, and
# a version already installed is not built again. scripts/uninstall.sh takes it all off again, the proxy off
# kubelet's path first.
#
#   scripts/install-baremetal.sh [--proxy-only] [--kubeconfig FILE | --local] [--metrics-bind-address ADDR]
#       [--dry-run] [--prefix /opt/koordlet-py] [--root DIR] [--no-venv] [--no-start] [--restart-kubelet]
#       [--python python3]
#   scripts/install-baremetal.sh --rollback [--prefix /opt/koordlet-py] [--root DIR] [--dry-run] [--no-start]
#
#   --proxy-only       only the proxy and the kubelet drop-in: for clusters where koordlet runs as the
#                      DaemonSet (Helm chart or deploy/). A koordlet.service of an earlier full install is
#                      stopped, disabled and removed, so a node never runs two koordlets.
#   --kubeconfig FILE  koordlet.service reaches the API server with FILE (default: /etc/kubernetes/kubelet.conf
#                      when it exists, else local mode)
#   --local            koordlet.service in local mode: no API server; pods from containerd's CRI, NodeSLO
#                      from /etc/koordlet/nodeslo.yaml, reports under /var/lib/koordlet/reports
#   --metrics-bind-address ADDR
#                      where the proxy serves /metrics, /healthz and /readyz (default 127.0.0.1:9318, this
#                      node only): the node's IP (10.0.0.5:9318) or 0.0.0.0:9318 for Prometheus to scrape it
#                      (deploy/prometheus/runtime-proxy-scrape.yaml scrapes port 9318 of each node's address).
#                      Written to /etc/default/koord-runtime-proxy; without the flag the file's value is kept.
#   --dry-run          print what would be done, change nothing (works without systemd)
#   --prefix P         where the versions go: P/versions/<version>-<digest> (one virtualenv each, installed
#                      from requirements.lock), P/current and P/previous (links); the units run P/current
#   --root DIR         install the files under DIR instead of / (image building, tests); no systemctl unless
#                      SYSTEMCTL is set. A virtualenv built there runs only from DIR (virtualenvs do not move).
#   --no-venv          do not build the version's virtualenv (P/current is managed elsewhere)
#   --no-start         install and enable, but do not start or restart the services
#   --restart-kubelet  restart kubelet so it dials the proxy (pods keep running; kubelet reconnects), then
#                      check by the proxy's count of served calls that kubelet really talks to it
#   --rollback         switch P/current back to P/previous (the version installed before) and restart the
#                      services; the units stay as they are. A second --rollback goes forward again.
#   --python PY        the interpreter the virtualenvs are made with (python3)
# SYSTEMCTL=CMD runs CMD instead of systemctl, also with --root (the tests record the steps).
# KUBELET_CHECK_TIMEOUT=60: seconds --restart-kubelet waits for kubelet's first call through the proxy.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0 prefix=/opt/koordlet-py root="" venv=1 start=1 restart_kubelet=0 python=python3
proxy_only=0 kubeconfig="" local_mode=0 rollback=0 metrics_address="" metrics_given=0
usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --proxy-only) proxy_only=1 ;;
    --kubeconfig) kubeconfig=${2:?--kubeconfig needs a file}; shift ;;
    --kubeconfig=*) kubeconfig=${1#--kubeconfig=} ;;
    --local) local_mode=1 ;;
    --metrics-bind-address) metrics_address=${2?--metrics-bind-address needs host:port}; metrics_given=1; shift ;;
    --metrics-bind-address=*) metrics_address=${1#--metrics-bind-address=}; metrics_given=1 ;;
    --prefix) prefix=${2:?--prefix needs a path}; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
    --root) root=${2:?--root needs a directory}; shift ;;
    --root=*) root=${1#--root=} ;;
    --no-venv) venv=0 ;;
    --no-start) start=0 ;;
    --restart-kubelet) restart_kubelet=1 ;;
    --rollback) rollback=1 ;;
    --python) python=${2:?--python needs an interpreter}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-baremetal: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
die2() { echo "install-baremetal: $*" >&2; exit 2; }
case "$prefix" in /*) ;; *) die2 "--prefix must be absolute" ;; esac
prefix=${prefix%/}
root=${root%/}
if [ "$proxy_only" = 1 ] && { [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ]; }; then
  die2 "--kubeconfig and --local configure koordlet.service, which --proxy-only does not install"
fi
[ -z "$kubeconfig" ] || [ "$local_mode" = 0 ] || die2 "--kubeconfig and --local exclude each other"
case "$kubeconfig" in ""|/*) ;; *) die2 "--kubeconfig must be an absolute path" ;; esac
if [ -n "$kubeconfig" ] && [ ! -r "$root$kubeconfig" ]; then
  die2 "--kubeconfig $kubeconfig: no such readable file${root:+ under $root}"
fi
if [ "$metrics_given" = 1 ] && [ -n "$metrics_address" ]; then
  # host:port, [v6]:port or :port; the proxy's own parser says the same at start, but a unit that cannot
  # start is worse than an installer that refuses.
  [[ $metrics_address =~ ^(\[[0-9a-fA-F:.]+\]|[0-9A-Za-z.-]*):([0-9]{1,5})$ ]] && [ "${BASH_REMATCH[2]}" -le 65535 ] ||
    die2 "--metrics-bind-address $metrics_address: expected host:port (127.0.0.1:9318, 0.0.0.0:9318, [::]:9318)"
fi
if [ "$rollback" = 1 ] && { [ "$proxy_only" = 1 ] || [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ] ||
    [ "$metrics_given" = 1 ] || [ "$venv" = 0 ] || [ "$restart_kubelet" = 1 ]; }; then
  die2 "--rollback switches the version only; it takes --prefix, --root, --dry-run and --no-start"
fi

log() { echo "install-baremetal: $*"; }
run() {  # run a command, or say it would be run
  if [ "$dry_run" = 1 ]; then log "would run: $*"; else "$@"; fi
}

systemctl=${SYSTEMCTL:-systemctl}
live=0  # systemd is told: on this machine, or through $SYSTEMCTL
if [ -z "$root" ] || [ -n "${SYSTEMCTL:-}" ]; then live=1; fi
if [ -z "$root" ] && [ -z "${SYSTEMCTL:-}" ]; then
  if [ ! -d /run/systemd/system ]; then
    if [ "$dry_run" = 1 ]; then
      log "note: systemd is not running here; a real run would refuse"
    else
      echo "install-baremetal: systemd is not running (no /run/systemd/system); refusing. Use --dry-run to see the plan." >&2
      exit 1
    fi
  fi
  if [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then
    echo "install-baremetal: must run as root" >&2
    exit 1
  fi
fi

base=$root$prefix
# switch_link NAME TARGET: point $base/NAME at TARGET (relative to $base) in one rename, never a missing link.
switch_link() {
  if [ "$dry_run" = 1 ]; then log "would point $base/$1 at $2"; return; fi
  ln -sfn "$2" "$base/.$1.new"
  mv -Tf "$base/.$1.new" "$base/$1"
  log "$base/$1 -> $2"
}
link_target() { readlink "$base/$1" 2>/dev/null || true; }

# restart_services: after the version changed under the units (install or rollback), restart what runs it.
restart_services() {
  local unit
  for unit in koord-runtime-proxy.service koordlet.service; do
    [ -f "$root/etc/systemd/system/$unit" ] || continue
    run "$systemctl" restart "$unit"
  done
}

# ---- --rollback ----------------------------------------------------------------------------------------
if [ "$rollback" = 1 ]; then
  current=$(link_target current) previous=$(link_target previous)
  if [ -z "$previous" ] || [ ! -x "$base/$previous/bin/python" ]; then
    echo "install-baremetal: nothing to roll back to: $base/previous is ${previous:-not there}" \
      "(it names the version installed before the current one)" >&2
    exit 1
  fi
  log "rolling back: ${current:-nothing} -> $previous"
  switch_link current "$previous"
  [ -z "$current" ] || switch_link previous "$current"
  if [ "$live" = 1 ] && [ "$start" = 1 ]; then
    restart_services
  else
    log "services not restarted (--no-start or --root): they run ${current:-the old version} until restarted"
  fi
  log "done: $base/current is $previous"
  exit 0
fi

changed=0        # a unit or the drop-in changed: daemon-reload
socket_changed=0 # the socket unit changed: systemd must make the socket again
proxy_changed=0  # the proxy's unit or environment changed: restart it
koordlet_changed=0
version_changed=0
# install_file SRC DEST MODE: copy with the prefix substituted, only when the content differs; returns 0 when it
# (would have) changed the file.
install_file() {
  local src=$1 dest=$root$2 mode=$3 tmp
  tmp=$(mktemp)
  sed "s#/opt/koordlet-py#$prefix#g" "$src" >"$tmp"
  if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then
    log "unchanged: $dest"
    rm -f "$tmp"
    return 1
  fi
  changed=1
  if [ "$dry_run" = 1 ]; then
    log "would install: $dest (mode $mode)"
    rm -f "$tmp"
    return 0
  fi
  mkdir -p "$(dirname "$dest")"
  install -m "$mode" "$tmp" "$dest"
  rm -f "$tmp"
  log "installed: $dest"
}
ensure_dir() {
  local dir=$root$1
  if [ -d "$dir" ]; then return; fi
  if [ "$dry_run" = 1 ]; then log "would create: $dir"; else mkdir -p "$dir"; log "created: $dir"; fi
}

# 1. the version's virtualenv: P/versions/<version>-<digest of the sources and the lock>, installed from the
# lock with every file's hash checked, so every node runs the same dependencies; then P/current points at it.
lock=$here/requirements.lock
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/pyproject.toml" | head -1)
digest=$(cd "$here" && {
  find wire runtimeproxy koordlet hooks -type f \( -name '*.py' -o -name '*.pyi' \) -not -path '*/__pycache__/*' |
    LC_ALL=C sort | xargs sha256sum
  sha256sum pyproject.toml requirements.lock
} | sha256sum | cut -c1-12)
version_id=$version-$digest
if [ "$venv" = 1 ]; then
  target=versions/$version_id
  dir=$base/$target
  if [ -n "$root" ]; then
    log "note: the virtualenv is built at $dir and runs from there only (virtualenvs do not move); for an" \
      "image, use --no-venv and build its virtualenv in place"
  fi
  if [ -f "$dir/.installed" ]; then
    log "unchanged: version $version_id is installed ($dir)"
  else
    log "installing version $version_id into $dir (dependencies from $lock, hashes checked)"
    if [ "$dry_run" = 0 ]; then rm -rf "$dir"; mkdir -p "$base/versions"; fi
    run "$python" -m venv "$dir"
    pip=("$dir/bin/python" -m pip install -q --disable-pip-version-check)
    # The dependencies, each file checked against the lock's sha256; then the project itself, built with the
    # lock's setuptools (no isolated build env fetching an unpinned one) and without resolving anything.
    if ! run "${pip[@]}" --require-hashes --no-deps -r "$lock" ||
       ! run "${pip[@]}" --no-deps --no-build-isolation "$here" ||
       ! run "$dir/bin/python" -m pip check -q --disable-pip-version-check ||
       ! run "$dir/bin/python" -c "import runtimeproxy.main, koordlet.main"; then
      rm -rf "$dir"
      echo "install-baremetal: installing version $version_id failed (above); $base/current is unchanged" >&2
      exit 1
    fi
    if [ "$dry_run" = 0 ]; then
      printf 'version=%s\nlock_sha256=%s\ninstalled=%s\n' "$version_id" "$(sha256sum <"$lock" | cut -c1-64)" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$dir/.installed"
    fi
  fi
  current=$(link_target current)
  if [ "$current" = "$target" ]; then
    log "unchanged: $base/current is $target"
  else
    version_changed=1
    log "version: ${current:-none} -> $target"
    switch_link current "$target"
    [ -z "$current" ] || switch_link previous "$current"
  fi
  if [ -d "$base/venv" ]; then
    log "note: $base/venv is the virtualenv of an install from before versioned installs; nothing uses it" \
      "any more (scripts/uninstall.sh --purge removes it)"
  fi
fi

# 2. units, kubelet drop-in, the proxy's environment, config dirs
install_file "$here/systemd/koord-runtime-proxy.socket" /etc/systemd/system/koord-runtime-proxy.socket 0644 &&
  socket_changed=1
install_file "$here/systemd/koord-runtime-proxy.service" /etc/systemd/system/koord-runtime-proxy.service 0644 &&
  proxy_changed=1
install_file "$here/systemd/10-koord-runtime-proxy.conf" \
  /etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf 0644 || true
ensure_dir /etc/runtime/hookserver.d

# The proxy's metrics address: the flag, else what the file says, else the unit's default.
proxy_env=$root/etc/default/koord-runtime-proxy
if [ "$metrics_given" = 0 ] && [ -f "$proxy_env" ]; then
  metrics_address=$(sed -n 's/^METRICS_BIND_ADDRESS=//p' "$proxy_env" | tail -1)
  metrics_given=$(grep -c '^METRICS_BIND_ADDRESS=' "$proxy_env" || true)
fi
[ "$metrics_given" != 0 ] || metrics_address=127.0.0.1:9318
env_tmp=$(mktemp)
cat >"$env_tmp" <<ENV
# Environment of koord-runtime-proxy.service (scripts/install-baremetal.sh --metrics-bind-address).
# Where /metrics, /healthz and /readyz listen; empty switches the endpoint off.
METRICS_BIND_ADDRESS=$metrics_address
ENV
install_file "$env_tmp" /etc/default/koord-runtime-proxy 0644 && proxy_changed=1
rm -f "$env_tmp"
log "proxy metrics: ${metrics_address:-off}"

units="koord-runtime-proxy.socket koord-runtime-proxy.service"
if [ "$proxy_only" = 1 ]; then
  # koordlet runs as the DaemonSet: a koordlet.service left from a full install would be a second agent
  # on the same socket, port and cgroups.
  if [ -f "$root/etc/systemd/system/koordlet.service" ]; then
    log "koordlet.service from an earlier full install: stopping, disabling and removing it (koordlet runs as the DaemonSet)"
    [ "$live" = 1 ] && run "$systemctl" disable --now koordlet.service
    if [ "$dry_run" = 1 ]; then log "would remove: $root/etc/systemd/system/koordlet.service"
    else rm -f "$root/etc/systemd/system/koordlet.service"; log "removed: $root/etc/systemd/system/koordlet.service"; fi
    changed=1
  fi
else
  units="$units koordlet.service"
  install_file "$here/systemd/koordlet.service" /etc/systemd/system/koordlet.service 0644 && koordlet_changed=1
  # koordlet.service must be able to run: with an API server (a kubeconfig) or in local mode. An
  # environment file that gives it neither is refused rather than left to fail and restart for ever.
  defaults=$root/etc/default/koordlet
  if [ -z "$kubeconfig" ] && [ "$local_mode" = 0 ] && [ ! -f "$defaults" ] && [ -r "$root/etc/kubernetes/kubelet.conf" ]; then
    kubeconfig=/etc/kubernetes/kubelet.conf
    log "koordlet.service uses kubelet's kubeconfig $kubeconfig (pass --kubeconfig or --local to choose)"
  fi
  if [ -f "$defaults" ]; then
    if [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ]; then
      echo "install-baremetal: $defaults exists; edit it (KUBECONFIG= or KOORDLET_ARGS=\"-local-mode ...\") instead of passing --kubeconfig/--local" >&2
      exit 2
    fi
    # shellcheck disable=SC1090
    set_kubeconfig=$( (set +u; . "$defaults" >/dev/null 2>&1; echo "${KUBECONFIG:-}") )
    set_args=$( (set +u; . "$defaults" >/dev/null 2>&1; echo "${KOORDLET_ARGS:-}") )
    if [ -z "$set_kubeconfig" ] && [[ $set_args != *local-mode* ]] && [[ $set_args != *-kubeconfig* ]]; then
      echo "install-baremetal: $defaults sets neither KUBECONFIG nor -local-mode: koordlet.service would fail to reach" \
        "an API server and restart for ever. Set KUBECONFIG=<file> or KOORDLET_ARGS=\"-local-mode\" there, or" \
        "use --proxy-only where koordlet runs as the DaemonSet." >&2
      exit 1
    fi
    log "kept: $defaults (an existing environment file is never rewritten)"
  else
    if [ -n "$kubeconfig" ]; then
      mode_lines="KUBECONFIG=$kubeconfig
KOORDLET_ARGS=\"\""
      log "koordlet.service: API server through $kubeconfig"
    else
      mode_lines="# No API server: local mode (pods from containerd's CRI, NodeSLO from the file, reports as files).
KOORDLET_ARGS=\"-local-mode -cri-endpoint=/var/run/containerd/containerd.sock -node-slo-file=/etc/koordlet/nodeslo.yaml -report-dir=/var/lib/koordlet/reports\""
      log "koordlet.service: no kubeconfig found (/etc/kubernetes/kubelet.conf) and none given: local mode"
    fi
    if [ "$dry_run" = 1 ]; then
      log "would create: $defaults"
    else
      mkdir -p "$root/etc/default"
      cat >"$defaults" <<DEFAULTS
# Environment of koordlet.service (scripts/install-baremetal.sh). NODE_NAME defaults to the host name.
#NODE_NAME=
$mode_lines
DEFAULTS
      log "created: $defaults"
    fi
  fi
fi

# An EnvironmentFile setting KUBELET_EXTRA_ARGS overrides the drop-in's Environment=.
for f in "$root/etc/default/kubelet" "$root/etc/sysconfig/kubelet"; do
  if [ -f "$f" ] && grep -q '^KUBELET_EXTRA_ARGS=' "$f" && ! grep -q 'koord-runtimeproxy' "$f"; then
    log "WARNING: $f sets KUBELET_EXTRA_ARGS and wins over the drop-in; add" \
      "--container-runtime-endpoint=unix:///var/run/koord-runtimeproxy/runtimeproxy.sock to it"
  fi
done

# 3. systemd
if [ "$live" = 0 ]; then
  log "files under $root; skipping systemctl (--root)"
  exit 0
fi
if [ "$changed" = 1 ]; then
  run "$systemctl" daemon-reload
else
  log "no unit changed; no daemon-reload"
fi
# shellcheck disable=SC2086
run "$systemctl" enable $units
if [ "$start" = 0 ]; then
  log "not started (--no-start): the proxy and koordlet run the old version (if any) until restarted"
  log "done"
  exit 0
fi

# The proxy. Its socket is made once and kept: a restart of the service fails no call. Only a new or changed
# socket unit makes systemd create the socket again, after the proxy of an earlier install (which bound the
# path itself) stopped: systemd refuses to start a socket unit while its service runs.
if [ "$socket_changed" = 1 ]; then
  log "the proxy's socket unit is new or changed: stopping the proxy and making its socket again (kubelet's" \
    "calls fail until the socket is back, a moment; later version changes restart the proxy without this)"
  run "$systemctl" stop koord-runtime-proxy.service
  run "$systemctl" restart koord-runtime-proxy.socket
  run "$systemctl" start koord-runtime-proxy.service
elif [ "$version_changed" = 1 ] || [ "$proxy_changed" = 1 ]; then
  why=$([ "$version_changed" = 1 ] && echo "version $version_id" || echo "its unit or environment changed")
  log "restarting the proxy ($why); calls wait in its socket's backlog meanwhile"
  run "$systemctl" start koord-runtime-proxy.socket
  run "$systemctl" restart koord-runtime-proxy.service
else
  run "$systemctl" start koord-runtime-proxy.socket koord-runtime-proxy.service
fi
if [ "$proxy_only" = 0 ]; then
  if [ "$version_changed" = 1 ] || [ "$koordlet_changed" = 1 ]; then
    run "$systemctl" restart koordlet.service
  else
    run "$systemctl" start koordlet.service
  fi
fi

# Old versions: the current and the previous one stay (the running processes and --rollback use them).
if [ "$venv" = 1 ] && [ -d "$base/versions" ]; then
  keep_current=$(link_target current) keep_previous=$(link_target previous)
  for old in "$base"/versions/*/; do
    old=versions/$(basename "$old")
    [ "$old" = "$keep_current" ] || [ "$old" = "$keep_previous" ] || [ ! -e "$base/$old" ] && continue
    if [ "$dry_run" = 1 ]; then log "would remove: $base/$old"; else rm -rf "${base:?}/$old"; log "removed: $base/$old"; fi
  done
fi

# 4. kubelet onto the proxy, and proof that it talks to it: the proxy's own count of served calls must grow.
served_calls() {  # the proxy's koord_runtimeproxy_calls_served_total, or nothing when /metrics cannot be read
  local py=$base/current/bin/python
  [ -x "$py" ] || py=$python
  "$py" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as answer:
    for line in answer.read().decode().splitlines():
        if line.startswith("koord_runtimeproxy_calls_served_total "):
            print(int(float(line.split()[1])))
PY
}
if [ "$restart_kubelet" = 0 ]; then
  log "kubelet not restarted: run 'systemctl restart kubelet' (or pass --restart-kubelet) to switch it to the proxy"
  log "done"
  exit 0
fi
if [ -z "$metrics_address" ]; then
  run "$systemctl" restart kubelet.service
  log "WARNING: the proxy's metrics are off (--metrics-bind-address ''): cannot check that kubelet talks to it"
  log "done"
  exit 0
fi
metrics_host=${metrics_address%:*} metrics_port=${metrics_address##*:}
case "$metrics_host" in ""|0.0.0.0) metrics_host=127.0.0.1 ;; "[::]") metrics_host="[::1]" ;; esac
url=http://$metrics_host:$metrics_port/metrics
if [ "$dry_run" = 1 ]; then
  log "would run: $systemctl restart kubelet.service"
  log "would check that koord_runtimeproxy_calls_served_total at $url grows within ${KUBELET_CHECK_TIMEOUT:-60}s"
  log "done"
  exit 0
fi
before=$(served_calls "$url")
if [ -z "$before" ]; then
  echo "install-baremetal: the proxy's metrics at $url do not answer; kubelet was NOT restarted. Check" \
    "'systemctl status koord-runtime-proxy' and 'journalctl -u koord-runtime-proxy'." >&2
  exit 1
fi
"$systemctl" restart kubelet.service
started=$(date +%s)
deadline=$((started + ${KUBELET_CHECK_TIMEOUT:-60}))
while :; do
  now_served=$(served_calls "$url")
  if [ -n "$now_served" ] && [ "$now_served" -gt "$before" ]; then
    log "kubelet talks to the proxy: $((now_served - before)) CRI call(s) served within $(( $(date +%s) - started ))s" \
      "of kubelet's restart"
    break
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    {
      echo "install-baremetal: ERROR: kubelet made no CRI call through the proxy within ${KUBELET_CHECK_TIMEOUT:-60}s"
      echo "  of its restart (koord_runtimeproxy_calls_served_total at $url stayed at $before). Check:"
      echo "  - systemctl cat kubelet.service: the drop-in 10-koord-runtime-proxy.conf is there and KUBELET_EXTRA_ARGS"
      echo "    reaches kubelet's command line (ps -o args= -C kubelet shows --container-runtime-endpoint=...runtimeproxy.sock);"
      echo "  - /etc/default/kubelet or /etc/sysconfig/kubelet setting KUBELET_EXTRA_ARGS wins over the drop-in;"
      echo "  - containerRuntimeEndpoint: in /var/lib/kubelet/config.yaml names the proxy's socket, or nothing;"
      echo "  - systemctl status kubelet; journalctl -u kubelet -n 50."
      echo "  scripts/uninstall.sh puts kubelet back on containerd."
    } >&2
    exit 1
  fi
  sleep 1
done
log "done"
