#!/usr/bin/env bash
# uninstall.sh — take koordlet-py off a node that scripts/install-baremetal.sh set up, in the order that
# never leaves kubelet without a runtime:
#   1. the one change the install made where kubelet reads its runtime endpoint (its config file's
#      containerRuntimeEndpoint, KUBELET_EXTRA_ARGS in /etc/default/kubelet or /etc/sysconfig/kubelet, or the
#      drop-in's) is put back as it was, the kubelet drop-in goes and systemd is reloaded;
#   2. kubelet is restarted on containerd's own socket (running pods keep running; kubelet reconnects);
#   3. only then the proxy and its socket are stopped and disabled, and koordlet.service (full installs) too;
#   4. the units go; with --purge also the installed versions, the environment files and the proxy's checkpoint.
# It refuses to stop the proxy while something else still points kubelet at it (its config file or
# /etc/default/kubelet, other than the install's own recorded change), or when the line the install wrote was
# changed since: fix that first, or kubelet would lose its runtime.
#
#   scripts/uninstall.sh [--dry-run] [--root DIR] [--prefix /opt/koordlet-py] [--purge]
#
#   --dry-run   print the steps, change nothing (works without systemd)
#   --root DIR  remove the files under DIR instead of / (tests, images); no systemctl
#   --prefix P  the install's prefix (P/versions, P/current, P/previous), as given to install-baremetal.sh
#   --purge     also remove P/versions, P/current, P/previous (and P/venv of an older install),
#               /etc/default/koordlet, /etc/default/koord-runtime-proxy, /var/lib/koord-runtimeproxy, koordlet's
#               identity (/etc/koordlet/kubeconfig, /var/lib/koordlet/token; the service account and its RBAC stay
#               in the cluster: kubectl delete -k deploy/baremetal/ once no bare-metal node is left) and the rest
#               of koordlet's directories (/var/lib/koordlet: local mode's reports, /var/log/koordlet: the audit
#               log, /run/koordlet), the socket's /run/koord-runtimeproxy, the empty /etc/koordlet and
#               /etc/runtime/hookserver.d
# SYSTEMCTL=CMD runs CMD instead of systemctl, also with --root (the tests record the order of the steps).
set -euo pipefail

dry_run=0 root="" prefix=/opt/koordlet-py purge=0
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --root) root=${2:?--root needs a directory}; shift ;;
    --root=*) root=${1#--root=} ;;
    --prefix) prefix=${2:?--prefix needs a path}; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
    --purge) purge=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "uninstall: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$prefix" in /*) ;; *) echo "uninstall: --prefix must be absolute" >&2; exit 2 ;; esac
root=${root%/}
log() { echo "uninstall: $*"; }
run() { if [ "$dry_run" = 1 ]; then log "would run: $*"; else "$@"; fi; }
remove() {  # remove files or dirs that exist
  local path
  for path in "$@"; do
    [ -e "$root$path" ] || continue
    if [ "$dry_run" = 1 ]; then log "would remove: $root$path"; else rm -rf -- "$root$path"; log "removed: $root$path"; fi
  done
}

systemctl=${SYSTEMCTL:-systemctl}
live=0  # systemd is told: on this machine, or through $SYSTEMCTL
[ -z "$root" ] || [ -n "${SYSTEMCTL:-}" ] && live=1
if [ -z "$root" ]; then
  if [ ! -d /run/systemd/system ] && [ "$dry_run" = 0 ] && [ -z "${SYSTEMCTL:-}" ]; then
    echo "uninstall: systemd is not running (no /run/systemd/system); refusing. Use --dry-run to see the plan." >&2
    exit 1
  fi
  if [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then echo "uninstall: must run as root" >&2; exit 1; fi
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/kubelet-endpoint.sh
. "$here/kubelet-endpoint.sh"
PROXY_SOCKET=/var/run/koord-runtimeproxy/runtimeproxy.sock
DROP_IN=$KE_DROP_IN

# 0. Nothing but the install's own recorded change may still send kubelet to the proxy once that is put back, and
# that change must still be as the install wrote it.
ours_file="" ours_line=""
if ke_recorded && [ "$ke_place" != drop-in ]; then
  ours_file=$ke_file ours_line=$ke_after
  if [ -f "$root$ke_file" ] && ! grep -qxF -- "$ke_after" "$root$ke_file" && grep -q koord-runtimeproxy "$root$ke_file"; then
    echo "uninstall: $root$ke_file: the line the install wrote ('$ke_after') was changed since; set containerd's" \
      "socket there by hand (it said '${ke_before:-nothing}'), then run this again. Nothing was changed." >&2
    exit 1
  fi
fi
still=()
for f in /var/lib/kubelet/config.yaml /etc/kubernetes/kubelet.conf.d/*.conf /etc/default/kubelet /etc/sysconfig/kubelet \
    ${ours_file:+"$ours_file"}; do
  [ -f "$root$f" ] || continue
  [[ " ${still[*]} " != *" $root$f "* ]] || continue
  if [ "$f" = "$ours_file" ]; then
    [ "$(grep -vxF -- "$ours_line" "$root$f" | grep -c 'koord-runtimeproxy' || true)" = 0 ] || still+=("$root$f")
  else
    grep -q 'koord-runtimeproxy' "$root$f" && still+=("$root$f")
  fi
done
if [ ${#still[@]} -gt 0 ]; then
  echo "uninstall: ${still[*]} still point(s) kubelet at $PROXY_SOCKET; set containerd's socket" \
    "(unix:///run/containerd/containerd.sock) there first, then run this again. Nothing was changed." >&2
  exit 1
fi

# 1. the install's change where kubelet reads its endpoint, put back; then the drop-in
ke_revert || { echo "uninstall: $ke_error" >&2; exit 1; }
remove "$DROP_IN"
# kubelet.service.d in /etc, once empty: the install made it (kubeadm's packages put their drop-in under /usr/lib)
[ ! -d "$root${DROP_IN%/*}" ] || [ -n "$(ls -A "$root${DROP_IN%/*}")" ] || remove "${DROP_IN%/*}"
if [ "$live" = 1 ]; then
  run "$systemctl" daemon-reload
  if [ "$dry_run" = 0 ] && "$systemctl" show kubelet.service --property=Environment --value 2>/dev/null |
      grep -q koord-runtimeproxy; then
    echo "uninstall: kubelet.service still gets the proxy's endpoint from another drop-in" \
      "(systemctl cat kubelet.service); the proxy keeps running. Remove that setting and run this again." >&2
    exit 1
  fi
  # 2. kubelet back on containerd
  if "$systemctl" list-unit-files kubelet.service >/dev/null 2>&1 || [ "$dry_run" = 1 ]; then
    run "$systemctl" restart kubelet.service
    if [ "$dry_run" = 0 ]; then
      for _ in $(seq 1 60); do "$systemctl" is-active --quiet kubelet.service && break; sleep 1; done
      "$systemctl" is-active --quiet kubelet.service ||
        log "WARNING: kubelet.service is not active after its restart (journalctl -u kubelet); the proxy is stopped anyway"
    fi
  fi
  # 3. the proxy (and a full install's koordlet), now that nothing dials it; its socket last (stopping it
  # removes the socket file)
  for unit in koordlet.service koord-runtime-proxy.service koord-runtime-proxy.socket; do
    if [ -f "$root/etc/systemd/system/$unit" ]; then run "$systemctl" disable --now "$unit"; fi
  done
fi

# 4. the units and, with --purge, what the install left for a reinstall
remove /etc/systemd/system/koordlet.service /etc/systemd/system/koord-runtime-proxy.service \
  /etc/systemd/system/koord-runtime-proxy.socket
# the drop-ins of a root-tree install (--rootfs), and their directories once empty
for unit in koord-runtime-proxy.service koordlet.service; do
  remove "/etc/systemd/system/$unit.d/50-root-tree.conf"
  dir=/etc/systemd/system/$unit.d
  [ ! -d "$root$dir" ] || [ -n "$(ls -A "$root$dir")" ] || remove "$dir"
done
[ "$live" = 1 ] && run "$systemctl" daemon-reload
if [ "$purge" = 1 ]; then
  remove "$prefix/current" "$prefix/previous" "$prefix/versions" "$prefix/venv" /etc/default/koordlet \
    /etc/default/koord-runtime-proxy /var/lib/koord-runtimeproxy /etc/koordlet/kubeconfig /var/lib/koordlet/token \
    /var/lib/koordlet /var/log/koordlet /run/koordlet /run/koord-runtimeproxy
  [ -d "$root/etc/koordlet" ] && [ -z "$(ls -A "$root/etc/koordlet")" ] && remove /etc/koordlet
  [ -d "$root$prefix" ] && [ -z "$(ls -A "$root$prefix")" ] && remove "$prefix"
  [ -d "$root/etc/runtime/hookserver.d" ] && [ -z "$(ls -A "$root/etc/runtime/hookserver.d")" ] &&
    remove /etc/runtime/hookserver.d
  [ -d "$root/etc/runtime" ] && [ -z "$(ls -A "$root/etc/runtime")" ] && remove /etc/runtime
else
  log "kept: $prefix (the installed versions), /etc/default/koordlet, /etc/default/koord-runtime-proxy," \
    "/var/lib/koord-runtimeproxy (--purge removes them)"
fi
log "done: kubelet talks to containerd directly"
