#!/usr/bin/env bash
# Install koordlet-py on a node with systemd: a virtualenv with the package, the koord-runtime-proxy
# unit and the kubelet drop-in that points kubelet at the proxy, and (unless --proxy-only) koordlet's
# own unit. Idempotent: files are only rewritten when their content differs, systemd is reloaded only
# then. scripts/uninstall.sh takes it all off again, the proxy off kubelet's path first.
#
#   scripts/install-baremetal.sh [--proxy-only] [--kubeconfig FILE | --local] [--dry-run]
#       [--prefix /opt/koordlet-py] [--root DIR] [--no-venv] [--no-start] [--restart-kubelet] [--python python3]
#
#   --proxy-only       only the proxy and the kubelet drop-in: for clusters where koordlet runs as the
#                      DaemonSet (Helm chart or deploy/). A koordlet.service of an earlier full install is
#                      stopped, disabled and removed, so a node never runs two koordlets.
#   --kubeconfig FILE  koordlet.service reaches the API server with FILE (default: /etc/kubernetes/kubelet.conf
#                      when it exists, else local mode)
#   --local            koordlet.service in local mode: no API server; pods from containerd's CRI, NodeSLO
#                      from /etc/koordlet/nodeslo.yaml, reports under /var/lib/koordlet/reports
#   --dry-run          print what would be done, change nothing (works without systemd)
#   --prefix P         where the virtualenv goes (P/venv); the units' ExecStart follow it
#   --root DIR         install the files under DIR instead of / (image building, tests); no systemctl
#   --no-venv          do not create/update the virtualenv (it is managed elsewhere)
#   --no-start         install and enable, but do not start or restart the services
#   --restart-kubelet  restart kubelet so it dials the proxy (pods keep running; kubelet reconnects)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0 prefix=/opt/koordlet-py root="" venv=1 start=1 restart_kubelet=0 python=python3
proxy_only=0 kubeconfig="" local_mode=0
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --proxy-only) proxy_only=1 ;;
    --kubeconfig) kubeconfig=${2:?--kubeconfig needs a file}; shift ;;
    --kubeconfig=*) kubeconfig=${1#--kubeconfig=} ;;
    --local) local_mode=1 ;;
    --prefix) prefix=${2:?--prefix needs a path}; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
    --root) root=${2:?--root needs a directory}; shift ;;
    --root=*) root=${1#--root=} ;;
    --no-venv) venv=0 ;;
    --no-start) start=0 ;;
    --restart-kubelet) restart_kubelet=1 ;;
    --python) python=${2:?--python needs an interpreter}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-baremetal: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$prefix" in /*) ;; *) echo "install-baremetal: --prefix must be absolute" >&2; exit 2 ;; esac
root=${root%/}
if [ "$proxy_only" = 1 ] && { [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ]; }; then
  echo "install-baremetal: --kubeconfig and --local configure koordlet.service, which --proxy-only does not install" >&2
  exit 2
fi
if [ -n "$kubeconfig" ] && [ "$local_mode" = 1 ]; then
  echo "install-baremetal: --kubeconfig and --local exclude each other" >&2
  exit 2
fi
case "$kubeconfig" in ""|/*) ;; *) echo "install-baremetal: --kubeconfig must be an absolute path" >&2; exit 2 ;; esac
if [ -n "$kubeconfig" ] && [ ! -r "$root$kubeconfig" ]; then
  echo "install-baremetal: --kubeconfig $kubeconfig: no such readable file${root:+ under $root}" >&2
  exit 2
fi
if [ -n "$root" ] && [ "$venv" = 1 ]; then
  echo "install-baremetal: --root needs --no-venv (a virtualenv is not relocatable; build it in place)" >&2
  exit 2
fi

log() { echo "install-baremetal: $*"; }
run() {  # run a command, or say it would be run
  if [ "$dry_run" = 1 ]; then log "would run: $*"; else "$@"; fi
}

live=0  # operating on this machine's systemd (not --root)
if [ -z "$root" ]; then
  live=1
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

changed=0
# install_file SRC DEST MODE: copy with the prefix substituted, only when the content differs.
install_file() {
  local src=$1 dest=$root$2 mode=$3 tmp
  tmp=$(mktemp)
  sed "s#/opt/koordlet-py#$prefix#g" "$src" >"$tmp"
  if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then
    log "unchanged: $dest"
    rm -f "$tmp"
    return
  fi
  changed=1
  if [ "$dry_run" = 1 ]; then
    log "would install: $dest (mode $mode)"
    rm -f "$tmp"
    return
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

# 1. the virtualenv with the package (console scripts koord-runtime-proxy and koordlet)
venv_dir=$root$prefix/venv
if [ "$venv" = 1 ]; then
  if [ ! -x "$venv_dir/bin/python" ]; then
    run "$python" -m venv "$venv_dir"
  fi
  run "$venv_dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$here"
fi

# 2. units, kubelet drop-in, config dirs
install_file "$here/systemd/koord-runtime-proxy.service" /etc/systemd/system/koord-runtime-proxy.service 0644
install_file "$here/systemd/10-koord-runtime-proxy.conf" \
  /etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf 0644
ensure_dir /etc/runtime/hookserver.d
units="koord-runtime-proxy.service"
if [ "$proxy_only" = 1 ]; then
  # koordlet runs as the DaemonSet: a koordlet.service left from a full install would be a second agent
  # on the same socket, port and cgroups.
  if [ -f "$root/etc/systemd/system/koordlet.service" ]; then
    log "koordlet.service from an earlier full install: stopping, disabling and removing it (koordlet runs as the DaemonSet)"
    [ "$live" = 1 ] && run systemctl disable --now koordlet.service
    if [ "$dry_run" = 1 ]; then log "would remove: $root/etc/systemd/system/koordlet.service"
    else rm -f "$root/etc/systemd/system/koordlet.service"; log "removed: $root/etc/systemd/system/koordlet.service"; fi
    changed=1
  fi
else
  units="$units koordlet.service"
  install_file "$here/systemd/koordlet.service" /etc/systemd/system/koordlet.service 0644
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
  run systemctl daemon-reload
else
  log "no unit changed; no daemon-reload"
fi
# shellcheck disable=SC2086
run systemctl enable $units
if [ "$start" = 1 ]; then
  # shellcheck disable=SC2086
  if [ "$changed" = 1 ]; then
    run systemctl restart $units
  else
    run systemctl start $units
  fi
  if [ "$restart_kubelet" = 1 ]; then
    run systemctl restart kubelet.service
  else
    log "kubelet not restarted: run 'systemctl restart kubelet' (or pass --restart-kubelet) to switch it to the proxy"
  fi
fi
log "done"
