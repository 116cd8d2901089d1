#!/usr/bin/env bash
# Install koordlet-py on a bare-metal (systemd) node: a virtualenv with the package, the
# koord-runtime-proxy and koordlet units, and the kubelet drop-in that points kubelet at the proxy.
# Idempotent: files are only rewritten when their content differs, systemd is reloaded only then.
#
#   scripts/install-baremetal.sh [--dry-run] [--prefix /opt/koordlet-py] [--root DIR] [--no-venv]
#                                [--no-start] [--restart-kubelet] [--python python3]
#
#   --dry-run          print what would be done, change nothing (works without systemd)
#   --prefix P         where the virtualenv goes (P/venv); the units' ExecStart follow it
#   --root DIR         install the files under DIR instead of / (image building); no systemctl
#   --no-venv          do not create/update the virtualenv (it is managed elsewhere)
#   --no-start         install and enable, but do not start or restart the services
#   --restart-kubelet  restart kubelet so it dials the proxy (pods keep running; kubelet reconnects)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0 prefix=/opt/koordlet-py root="" venv=1 start=1 restart_kubelet=0 python=python3
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
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
install_file "$here/systemd/koordlet.service" /etc/systemd/system/koordlet.service 0644
install_file "$here/systemd/10-koord-runtime-proxy.conf" \
  /etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf 0644
ensure_dir /etc/runtime/hookserver.d
if [ ! -f "$root/etc/default/koordlet" ]; then
  if [ "$dry_run" = 1 ]; then
    log "would create: $root/etc/default/koordlet"
  else
    mkdir -p "$root/etc/default"
    cat >"$root/etc/default/koordlet" <<'DEFAULTS'
# Environment of koordlet.service. NODE_NAME defaults to the host name (%H in the unit).
#NODE_NAME=
#KUBECONFIG=/etc/kubernetes/kubelet.conf
KOORDLET_ARGS=""
DEFAULTS
    log "created: $root/etc/default/koordlet"
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
run systemctl enable koord-runtime-proxy.service koordlet.service
if [ "$start" = 1 ]; then
  if [ "$changed" = 1 ]; then
    run systemctl restart koord-runtime-proxy.service koordlet.service
  else
    run systemctl start koord-runtime-proxy.service koordlet.service
  fi
  if [ "$restart_kubelet" = 1 ]; then
    run systemctl restart kubelet.service
  else
    log "kubelet not restarted: run 'systemctl restart kubelet' (or pass --restart-kubelet) to switch it to the proxy"
  fi
fi
log "done"
