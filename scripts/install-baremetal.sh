#!/usr/bin/env bash
# Install koordlet-py on a node with systemd: the version (its own virtualenv, or the image's root tree with
# --rootfs), the koord-runtime-proxy socket and service units, kubelet pointed at the proxy (in the one place
# kubelet reads its runtime endpoint from: scripts/kubelet-endpoint.sh), and (unless --proxy-only) koordlet's own
# unit. Idempotent: files are only rewritten when their content differs, systemd is reloaded only then, and a
# version already installed is not built again. scripts/uninstall.sh takes it all off again, the proxy off
# kubelet's path first.
#
#   scripts/install-baremetal.sh [--proxy-only] [--admin-kubeconfig FILE | --kubeconfig FILE | --local]
#       [--node-name NAME] [--token-duration 168h] [--metrics-bind-address ADDR]
#       [--rootfs FILE | --no-venv | --python python3] [--dry-run] [--prefix /opt/koordlet-py] [--root DIR]
#       [--no-start] [--restart-kubelet]
#   scripts/install-baremetal.sh --rollback [--prefix /opt/koordlet-py] [--root DIR] [--dry-run] [--no-start]
#
# Two ways to install a version:
#   (default)          a virtualenv built on the node from requirements.lock: needs Python >= 3.11 with venv
#                      and a package index (PyPI or a mirror) on the node
#   --rootfs FILE      the image's root tree, FILE from `make image` (out/image/koordlet-py-<version>.rootfs.tar.gz):
#                      unpacked as it is (P/versions/<id>/root), the units run the tree's own Python inside it
#                      (RootDirectory=P/versions/<id>/root), so the node needs no Python and no index, only systemd
#                      (RootDirectory=, MountAPIVFS=, BindPaths=: 233 and later; started by 252 in the systemd
#                      guest: tests/deploy/test_root_tree_systemd_v2.py), tar and gzip
#   --proxy-only       only the proxy and the kubelet drop-in: for clusters where koordlet runs as the
#                      DaemonSet (Helm chart or deploy/). A koordlet.service of an earlier full install is
#                      stopped, disabled and removed, so a node never runs two koordlets.
#   --admin-kubeconfig FILE
#                      koordlet runs as a service account of its own, koordinator-system/koordlet-py-baremetal, not
#                      as the node. With FILE's credentials (the operator's, e.g. kubeadm's /etc/kubernetes/admin.conf;
#                      used here only, never stored) the installer applies deploy/baremetal/ (the account, koordlet's
#                      ClusterRole and binding, the right to renew its own token), asks the TokenRequest API for a
#                      token bound to this node's Node object and expiring after --token-duration, and writes
#                      /etc/koordlet/kubeconfig and the token /var/lib/koordlet/token; koordlet renews the token
#                      before it expires (koordlet/credentials.py) and shows kubelet the same token. Needs kubectl
#                      (KUBECTL=/path/to/kubectl) and the node joined (its Node there). Run it again to start afresh,
#                      e.g. after the token expired while koordlet was stopped.
#   --node-name NAME   the node's name where it is not the host name (the token's Node, koordlet's NODE_NAME)
#   --token-duration D the token's lifetime (168h; also 90m, 3600s); koordlet renews it at 80 %
#   --kubeconfig FILE  koordlet.service reaches the API server with FILE, an identity you made (a service account's
#                      kubeconfig, or one with a client certificate). Not kubelet's /etc/kubernetes/kubelet.conf: that
#                      is the node (system:node:<name>), whom RBAC and the Node authorizer give no NodeSLO,
#                      NodeMetric, Device or NodeResourceTopology
#   --local            koordlet.service in local mode (the default without --admin-kubeconfig or --kubeconfig): no
#                      API server; pods from containerd's CRI, NodeSLO from /etc/koordlet/nodeslo.yaml, reports
#                      under /var/lib/koordlet/reports
#   --metrics-bind-address ADDR
#                      where the proxy serves /metrics, /healthz and /readyz (default 127.0.0.1:9318, this
#                      node only): the node's IP (10.0.0.5:9318) or 0.0.0.0:9318 for Prometheus to scrape it
#                      (deploy/prometheus/runtime-proxy-scrape.yaml scrapes port 9318 of each node's address).
#                      Written to /etc/default/koord-runtime-proxy; without the flag the file's value is kept.
#   --dry-run          print what would be done, change nothing (works without systemd)
#   --prefix P         where the versions go: P/versions/<version>-<digest> (one virtualenv or root tree each),
#                      P/current and P/previous (links); the units run P/current
#   --root DIR         install the files under DIR instead of / (image building, tests); no systemctl unless
#                      SYSTEMCTL is set. A virtualenv built there runs only from DIR (virtualenvs do not move).
#   --no-venv          do not build the version's virtualenv (P/current is managed elsewhere)
#   --no-start         install and enable, but do not start or restart the services
#   --restart-kubelet  restart kubelet so it dials the proxy (pods keep running; kubelet reconnects), then
#                      check by the proxy's count of served calls that kubelet really talks to it
#   --rollback         switch P/current back to P/previous (the version installed before) and restart the
#                      services; the units stay (so both must be virtualenvs, or both root trees; a root tree's
#                      drop-ins are rendered again, their RootDirectory= naming the version's own directory).
#                      A second --rollback goes forward again.
#   --python PY        the interpreter the virtualenvs are made with (python3)
# SYSTEMCTL=CMD runs CMD instead of systemctl, also with --root (the tests record the steps).
# KUBELET_CHECK_TIMEOUT=60: seconds --restart-kubelet waits for kubelet's first call through the proxy.
# START_TIMEOUT=300: seconds a start or restart of the proxy or koordlet may take before the installer gives up.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0 prefix=/opt/koordlet-py root="" venv=1 start=1 restart_kubelet=0 python=python3
proxy_only=0 kubeconfig="" local_mode=0 rollback=0 metrics_address="" metrics_given=0 rootfs="" python_given=0
admin_kubeconfig="" node_name="" token_duration=168h
usage() { sed -n '2,66p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --proxy-only) proxy_only=1 ;;
    --kubeconfig) kubeconfig=${2:?--kubeconfig needs a file}; shift ;;
    --kubeconfig=*) kubeconfig=${1#--kubeconfig=} ;;
    --local) local_mode=1 ;;
    --admin-kubeconfig) admin_kubeconfig=${2:?--admin-kubeconfig needs a file}; shift ;;
    --admin-kubeconfig=*) admin_kubeconfig=${1#--admin-kubeconfig=} ;;
    --node-name) node_name=${2:?--node-name needs a name}; shift ;;
    --node-name=*) node_name=${1#--node-name=} ;;
    --token-duration) token_duration=${2:?--token-duration needs a duration}; shift ;;
    --token-duration=*) token_duration=${1#--token-duration=} ;;
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
    --python) python=${2:?--python needs an interpreter}; python_given=1; shift ;;
    --rootfs) rootfs=${2:?--rootfs needs a file}; shift ;;
    --rootfs=*) rootfs=${1#--rootfs=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-baremetal: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
die2() { echo "install-baremetal: $*" >&2; exit 2; }
case "$prefix" in /*) ;; *) die2 "--prefix must be absolute" ;; esac
prefix=${prefix%/}
root=${root%/}
if [ "$proxy_only" = 1 ] && { [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ] || [ -n "$admin_kubeconfig" ]; }; then
  die2 "--admin-kubeconfig, --kubeconfig and --local configure koordlet.service, which --proxy-only does not install"
fi
[ -z "$kubeconfig" ] || [ "$local_mode" = 0 ] || die2 "--kubeconfig and --local exclude each other"
if [ -n "$admin_kubeconfig" ]; then
  [ -z "$kubeconfig" ] && [ "$local_mode" = 0 ] || die2 "--admin-kubeconfig makes koordlet's kubeconfig: no --kubeconfig, no --local"
  [ -r "$admin_kubeconfig" ] || die2 "--admin-kubeconfig $admin_kubeconfig: no such readable file"
  [[ $token_duration =~ ^([0-9]+)(h|m|s)$ ]] || die2 "--token-duration $token_duration: a duration as 168h, 90m, 3600s"
  unit_s=1
  [ "${BASH_REMATCH[2]}" != h ] || unit_s=3600
  [ "${BASH_REMATCH[2]}" != m ] || unit_s=60
  token_seconds=$(( BASH_REMATCH[1] * unit_s ))
fi
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
if [ "$rollback" = 1 ] && { [ "$proxy_only" = 1 ] || [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ] || [ -n "$admin_kubeconfig" ] ||
    [ "$metrics_given" = 1 ] || [ "$venv" = 0 ] || [ "$restart_kubelet" = 1 ] || [ -n "$rootfs" ]; }; then
  die2 "--rollback switches the version only; it takes --prefix, --root, --dry-run and --no-start"
fi
if [ -n "$rootfs" ]; then
  { [ "$venv" = 1 ] && [ "$python_given" = 0 ]; } || die2 "--rootfs installs the image's root tree: no --no-venv, no --python"
  [ -f "$rootfs" ] && [ -r "$rootfs" ] || die2 "--rootfs $rootfs: no such readable file"
  case "$kubeconfig" in
    ""|/etc/kubernetes/*|/etc/koordlet/*|/var/lib/kubelet/*) ;;
    *) die2 "--kubeconfig $kubeconfig: with --rootfs koordlet sees the host's /etc/kubernetes, /etc/koordlet and" \
         "/var/lib/kubelet only (systemd/koordlet-root-tree.conf); put it there" ;;
  esac
fi

log() { echo "install-baremetal: $*"; }
run() {  # run a command, or say it would be run
  if [ "$dry_run" = 1 ]; then log "would run: $*"; else "$@"; fi
}

systemctl=${SYSTEMCTL:-systemctl}
start_timeout=${START_TIMEOUT:-300}
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
# shellcheck source=scripts/kubelet-endpoint.sh
. "$here/scripts/kubelet-endpoint.sh"
# The drop-ins that run a service in the version's root tree (--rootfs): their presence is how the units run.
TREE_DROP_INS=(/etc/systemd/system/koord-runtime-proxy.service.d/50-root-tree.conf
               /etc/systemd/system/koordlet.service.d/50-root-tree.conf)
# switch_link NAME TARGET: point $base/NAME at TARGET (relative to $base) in one rename, never a missing link.
switch_link() {
  if [ "$dry_run" = 1 ]; then log "would point $base/$1 at $2"; return; fi
  ln -sfn "$2" "$base/.$1.new"
  mv -Tf "$base/.$1.new" "$base/$1"
  log "$base/$1 -> $2"
}
link_target() { readlink "$base/$1" 2>/dev/null || true; }
# kind_of DIR: what a version is: "tree" (the image's root tree, in DIR/root), "venv" (a virtualenv), or nothing.
kind_of() {
  if [ -x "$1/root/opt/koordlet-py/bin/python" ]; then echo tree
  elif [ -x "$1/bin/python" ]; then echo venv; fi
}
# The kind the installed units run: the root-tree drop-in of the proxy is there, or not.
units_kind() { if [ -f "$root${TREE_DROP_INS[0]}" ]; then echo tree; else echo venv; fi; }
kind_name() { if [ "$1" = tree ]; then echo "a root tree (--rootfs)"; else echo "a virtualenv"; fi; }

# restart_services: after the version changed under the units (install or rollback), restart what runs it.
# start_units VERB UNIT...: systemctl start/restart, bounded. systemctl waits for the start job, and the job of a unit
# that fails while starting and restarts by itself (Restart=always, no start limit: the proxy on a node whose
# containerd is down, or whose tree cannot run) never ends: the installer would wait for ever, saying nothing.
start_units() {
  if [ "$dry_run" = 1 ]; then log "would run: $systemctl $*"; return 0; fi
  local rc=0
  timeout "$start_timeout" "$systemctl" "$@" || rc=$?
  [ "$rc" = 0 ] && return 0
  local units=("${@:2}")
  if [ "$rc" = 124 ]; then
    log "ERROR: '$systemctl $*' did not finish within ${start_timeout}s (START_TIMEOUT): ${units[*]} keeps failing" \
      "while it starts; 'systemctl status ${units[*]}' and 'journalctl -u ${units[0]}' say why" >&2
  else
    log "ERROR: '$systemctl $*' failed (exit $rc); 'journalctl -u ${units[0]}' says why" >&2
  fi
  exit 1
}

restart_services() {
  local unit
  for unit in koord-runtime-proxy.service koordlet.service; do
    [ -f "$root/etc/systemd/system/$unit" ] || continue
    start_units restart "$unit"
  done
}

changed=0        # a unit or the drop-in changed: daemon-reload
socket_changed=0 # the socket unit changed: systemd must make the socket again
proxy_changed=0  # the proxy's unit or environment changed: restart it
koordlet_changed=0
version_changed=0
# install_file SRC DEST MODE [SED ARGS...]: copy with the prefix substituted (and the sed expressions given), only
# when the content differs; returns 0 when it (would have) changed the file.
install_file() {
  local src=$1 dest=$root$2 mode=$3 tmp
  shift 3
  tmp=$(mktemp)
  sed -e "s#/opt/koordlet-py#$prefix#g" "$@" "$src" >"$tmp"
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
# remove_file DEST: remove a file the install no longer wants; returns 0 when it was (would have been) there.
remove_file() {
  [ -e "$root$1" ] || return 1
  changed=1
  if [ "$dry_run" = 1 ]; then log "would remove: $root$1"; else rm -f "$root$1"; log "removed: $root$1"; fi
}
ensure_dir() {
  local dir=$root$1
  if [ -d "$dir" ]; then return; fi
  if [ "$dry_run" = 1 ]; then log "would create: $dir"; else mkdir -p "$dir"; log "created: $dir"; fi
}
# tree_root_sed TARGET: the sed expression that points a root-tree drop-in's RootDirectory= at P/TARGET/root itself,
# every link on the way resolved, never at P/current/root. systemd (252) makes the tree read-only (ProtectSystem=) by
# remounting each mount it finds below RootDirectory= in /proc/self/mountinfo, which names them by their real path;
# through a link it finds none, retries, and gives up: "Failed to re-mount '...current/root/' and its submounts:
# Device or resource busy", exit 226/NAMESPACE, restarted for ever. So each switch of P/current renders them again.
tree_root_sed() {
  local dir=$prefix/$1/root
  if [ -z "$root" ] && [ -d "$dir" ]; then dir=$(realpath -e "$dir"); fi
  echo "s#^RootDirectory=.*#RootDirectory=$dir#"
}

# ---- --rollback ----------------------------------------------------------------------------------------
if [ "$rollback" = 1 ]; then
  current=$(link_target current) previous=$(link_target previous)
  previous_kind=$([ -z "$previous" ] || kind_of "$base/$previous")
  if [ -z "$previous_kind" ]; then
    echo "install-baremetal: nothing to roll back to: $base/previous is ${previous:-not there}" \
      "(it names the version installed before the current one)" >&2
    exit 1
  fi
  if [ "$previous_kind" != "$(units_kind)" ]; then
    echo "install-baremetal: $base/previous ($previous) is $(kind_name "$previous_kind") and the units run" \
      "$(kind_name "$(units_kind)"): install that version again instead (it is kept, so nothing is built or" \
      "unpacked again)" >&2
    exit 1
  fi
  log "rolling back: ${current:-nothing} -> $previous"
  switch_link current "$previous"
  [ -z "$current" ] || switch_link previous "$current"
  if [ "$previous_kind" = tree ]; then  # the drop-ins name the version's own root (tree_root_sed)
    for drop_in in "${TREE_DROP_INS[@]}"; do
      [ -f "$root$drop_in" ] || continue
      template=$here/systemd/koord-runtime-proxy-root-tree.conf
      [[ $drop_in != */koordlet.service.d/* ]] || template=$here/systemd/koordlet-root-tree.conf
      install_file "$template" "$drop_in" 0644 -e "$(tree_root_sed "$previous")" || true
    done
  fi
  if [ "$live" = 1 ] && [ "$start" = 1 ]; then
    [ "$changed" = 0 ] || run "$systemctl" daemon-reload
    restart_services
  else
    [ "$changed" = 0 ] || [ "$live" = 0 ] || run "$systemctl" daemon-reload
    log "services not restarted (--no-start or --root): they run ${current:-the old version} until restarted"
  fi
  log "done: $base/current is $previous"
  exit 0
fi

# 0. kubelet: the one place it reads its runtime endpoint from (scripts/kubelet-endpoint.sh), planned before anything
# changes (a layout no single change can serve is refused here); the drop-in carries the endpoint only when it is
# that place.
if ! ke_plan || ! ke_check_record; then
  echo "install-baremetal: cannot point kubelet at the proxy: $ke_error. Nothing was changed." >&2
  exit 1
fi
drop_in_sed=()
[ "$ke_place" = drop-in ] || drop_in_sed=(-e '/^Environment="KUBELET_EXTRA_ARGS=/d')

# 0b. koordlet's own identity (--admin-kubeconfig), before anything on the node changes: the account and its RBAC
# (deploy/baremetal/), a token bound to this node's Node and expiring, and a kubeconfig naming the token's file.
IDENTITY_KUBECONFIG=/etc/koordlet/kubeconfig
IDENTITY_TOKEN=/var/lib/koordlet/token
IDENTITY_ACCOUNT=koordlet-py-baremetal IDENTITY_NAMESPACE=koordinator-system
identity_changed=0
if [ -n "$admin_kubeconfig" ]; then
  kubectl=${KUBECTL:-kubectl}
  command -v "$kubectl" >/dev/null ||
    { echo "install-baremetal: --admin-kubeconfig needs kubectl (on PATH, or KUBECTL=/path/to/kubectl)" >&2; exit 1; }
  node=${node_name:-$(hostname)}
  kc() { "$kubectl" --kubeconfig "$admin_kubeconfig" "$@"; }
  # The TokenRequest as JSON (what `kubectl create token` asks, in the API's own form): this account, this Node.
  token_uri=/api/v1/namespaces/$IDENTITY_NAMESPACE/serviceaccounts/$IDENTITY_ACCOUNT/token
  token_request='{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":'
  token_request+="$token_seconds"',"boundObjectRef":{"kind":"Node","apiVersion":"v1","name":"'"$node"'"}}}'
  if [ "$dry_run" = 1 ]; then
    log "would run: $kubectl --kubeconfig $admin_kubeconfig apply -k $here/deploy/baremetal"
    log "would run: $kubectl --kubeconfig $admin_kubeconfig create --raw $token_uri -f <(echo '$token_request')"
    log "would write: $root$IDENTITY_KUBECONFIG and $root$IDENTITY_TOKEN (mode 0600)"
  else
    kc apply -k "$here/deploy/baremetal" >/dev/null ||
      { echo "install-baremetal: applying deploy/baremetal/ with $admin_kubeconfig failed (above). Nothing on this node was changed." >&2; exit 1; }
    log "applied deploy/baremetal/: service account $IDENTITY_NAMESPACE/$IDENTITY_ACCOUNT and its RBAC"
    request_file=$(mktemp)
    printf '%s' "$token_request" >"$request_file"
    answer=$(kc create --raw "$token_uri" -f "$request_file") || answer=""
    rm -f "$request_file"
    if ! [[ $answer =~ \"token\":[[:space:]]*\"([A-Za-z0-9._-]+)\" ]]; then
      echo "install-baremetal: no token for $IDENTITY_NAMESPACE/$IDENTITY_ACCOUNT bound to Node $node (above): is the" \
        "node joined (kubelet registers its Node), and is its name $node (--node-name)? Nothing on this node was changed." >&2
      exit 1
    fi
    token=${BASH_REMATCH[1]}
    server=$(kc config view --raw --minify --flatten -o 'jsonpath={.clusters[0].cluster.server}')
    ca=$(kc config view --raw --minify --flatten -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
    identity_tmp=$(mktemp)
    cat >"$identity_tmp" <<KUBECONFIG
# koordlet's identity on this node (scripts/install-baremetal.sh --admin-kubeconfig): the service account
# $IDENTITY_NAMESPACE/$IDENTITY_ACCOUNT; its token, bound to Node $node, is $IDENTITY_TOKEN, which koordlet
# renews before it expires.
apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: $server
${ca:+    certificate-authority-data: $ca
}users:
- name: $IDENTITY_ACCOUNT
  user:
    tokenFile: $IDENTITY_TOKEN
contexts:
- name: koordlet
  context:
    cluster: cluster
    user: $IDENTITY_ACCOUNT
current-context: koordlet
KUBECONFIG
    mkdir -p "$root/etc/koordlet" "$root/var/lib/koordlet"
    if ! cmp -s "$identity_tmp" "$root$IDENTITY_KUBECONFIG"; then identity_changed=1; fi
    install -m 0600 "$identity_tmp" "$root$IDENTITY_KUBECONFIG"
    rm -f "$identity_tmp"
    (umask 077; printf '%s\n' "$token" >"$root$IDENTITY_TOKEN.new")
    mv -f "$root$IDENTITY_TOKEN.new" "$root$IDENTITY_TOKEN"
    log "koordlet's identity: $root$IDENTITY_KUBECONFIG, token $root$IDENTITY_TOKEN (bound to Node $node," \
      "$token_duration; koordlet renews it)"
  fi
  kubeconfig=$IDENTITY_KUBECONFIG
fi

# 1. the version: P/versions/<version>-<digest>, then P/current points at it.
target=""
if [ -n "$rootfs" ]; then
  # The image's root tree, named after the tar's sha256: unpacked whole (owners and modes as in the image) into
  # P/versions/<id>/root, checked to run koordlet and the proxy with its own Python (chroot) before anything points at
  # it. The units' RootDirectory= is P/current/root: systemd mounts the root onto itself without following a link in
  # its last component, so the link that switches versions is the one before it.
  digest=$(sha256sum <"$rootfs" | cut -c1-12)
  installed=""
  for dir in "$base"/versions/*-"$digest"; do [ -f "$dir/.installed" ] && installed=$dir; done
  if [ -n "$installed" ]; then
    target=versions/${installed##*/}
    log "unchanged: version ${installed##*/} is installed ($installed)"
  elif [ "$dry_run" = 1 ]; then
    target="versions/<version>-$digest"
    log "would unpack $rootfs into $base/$target and check that its own Python runs koordlet and the proxy"
  else
    incoming=$base/versions/.incoming-$digest
    rm -rf "$incoming"
    mkdir -p "$incoming/root"
    log "unpacking $rootfs into $incoming/root"
    failed() {
      rm -rf "$incoming"
      echo "install-baremetal: $*; $base/current is unchanged" >&2
      exit 1
    }
    tar -C "$incoming/root" --numeric-owner --same-owner -xpf "$rootfs" || failed "unpacking $rootfs failed (above)"
    tree_dir=$incoming/root
    dist=$(compgen -G "$tree_dir/opt/koordlet-py/lib/python3*/site-packages/koordlet_py-*.dist-info" | head -1 || true)
    if [ -z "$dist" ] || [ "$(kind_of "$incoming")" != tree ] || [ ! -x "$tree_dir/opt/koordlet-py/bin/koordlet" ] ||
       [ ! -x "$tree_dir/opt/koordlet-py/bin/koord-runtime-proxy" ]; then
      failed "$rootfs is not koordlet-py's root tree (no /opt/koordlet-py with koordlet-py installed in it;" \
        "make image writes it as out/image/koordlet-py-<version>.rootfs.tar.gz)"
    fi
    env -i "$(command -v chroot)" "$tree_dir" /opt/koordlet-py/bin/python -c "import runtimeproxy.main, koordlet.main" ||
      failed "the root tree's Python cannot import koordlet and the proxy (above)"
    version=${dist##*/koordlet_py-}
    version=${version%.dist-info}
    target=versions/$version-$digest
    rm -rf "${base:?}/$target"
    mv "$incoming" "$base/$target"
    printf 'version=%s\nkind=tree\nrootfs_sha256=%s\ninstalled=%s\n' "$version-$digest" \
      "$(sha256sum <"$rootfs" | cut -c1-64)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$base/$target/.installed"
    log "installed version $version-$digest: $base/$target"
  fi
elif [ "$venv" = 1 ]; then
  # A virtualenv named after the sources and the lock, installed from the lock with every file's hash checked, so
  # every node runs the same dependencies.
  lock=$here/requirements.lock
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/pyproject.toml" | head -1)
  digest=$(cd "$here" && {
    find wire runtimeproxy koordlet hooks -type f \( -name '*.py' -o -name '*.pyi' \) -not -path '*/__pycache__/*' |
      LC_ALL=C sort | xargs sha256sum
    sha256sum pyproject.toml requirements.lock
  } | sha256sum | cut -c1-12)
  version_id=$version-$digest
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
      printf 'version=%s\nkind=venv\nlock_sha256=%s\ninstalled=%s\n' "$version_id" \
        "$(sha256sum <"$lock" | cut -c1-64)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$dir/.installed"
    fi
  fi
fi
if [ -n "$target" ]; then
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

# 2. units, kubelet drop-in, the proxy's environment, config dirs. Root-tree versions run the tree's
# /opt/koordlet-py/bin in it (the drop-ins add RootDirectory= and what the services reach on the host).
tree=0
if [ -n "$rootfs" ] || { [ "$venv" = 0 ] && [ "$(units_kind)" = tree ]; }; then tree=1; fi
unit_sed=()
[ "$tree" = 0 ] || unit_sed=(-e "/^ExecStart=/s#=$prefix/current/bin/#=/opt/koordlet-py/bin/#")
install_file "$here/systemd/koord-runtime-proxy.socket" /etc/systemd/system/koord-runtime-proxy.socket 0644 &&
  socket_changed=1
install_file "$here/systemd/koord-runtime-proxy.service" /etc/systemd/system/koord-runtime-proxy.service 0644 \
  "${unit_sed[@]}" && proxy_changed=1
if [ "$tree" = 1 ]; then
  install_file "$here/systemd/koord-runtime-proxy-root-tree.conf" "${TREE_DROP_INS[0]}" 0644 \
    -e "$(tree_root_sed "${target:-$(link_target current)}")" && proxy_changed=1
else
  remove_file "${TREE_DROP_INS[0]}" && proxy_changed=1
fi
install_file "$here/systemd/10-koord-runtime-proxy.conf" "$KE_DROP_IN" 0644 "${drop_in_sed[@]}" || true
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
    remove_file /etc/systemd/system/koordlet.service || true
  fi
  remove_file "${TREE_DROP_INS[1]}" || true
else
  units="$units koordlet.service"
  install_file "$here/systemd/koordlet.service" /etc/systemd/system/koordlet.service 0644 "${unit_sed[@]}" &&
    koordlet_changed=1
  [ "$identity_changed" = 0 ] || koordlet_changed=1
  if [ "$tree" = 1 ]; then
    install_file "$here/systemd/koordlet-root-tree.conf" "${TREE_DROP_INS[1]}" 0644 \
      -e "$(tree_root_sed "${target:-$(link_target current)}")" && koordlet_changed=1
  else
    remove_file "${TREE_DROP_INS[1]}" && koordlet_changed=1
  fi
  # koordlet.service must be able to run: with an API server (a kubeconfig) or in local mode. An
  # environment file that gives it neither is refused rather than left to fail and restart for ever.
  defaults=$root/etc/default/koordlet
  if [ -z "$kubeconfig" ] && [ "$local_mode" = 0 ] && [ ! -f "$defaults" ] && [ -r "$root/etc/kubernetes/kubelet.conf" ]; then
    log "note: kubelet's kubeconfig is there but not used: it is the node (system:node:<name>), whom RBAC and the" \
      "Node authorizer give no NodeSLO, NodeMetric, Device or NodeResourceTopology; --admin-kubeconfig gives" \
      "koordlet an identity of its own"
  fi
  if [ -f "$defaults" ]; then
    # shellcheck disable=SC1090
    set_kubeconfig=$( (set +u; . "$defaults" >/dev/null 2>&1; echo "${KUBECONFIG:-}") )
    set_args=$( (set +u; . "$defaults" >/dev/null 2>&1; echo "${KOORDLET_ARGS:-}") )
    if { [ -n "$kubeconfig" ] || [ "$local_mode" = 1 ]; } &&
       ! { [ -n "$admin_kubeconfig" ] && [ "$set_kubeconfig" = "$IDENTITY_KUBECONFIG" ]; }; then
      echo "install-baremetal: $defaults exists; edit it (KUBECONFIG= or KOORDLET_ARGS=\"-local-mode ...\") instead of passing --admin-kubeconfig/--kubeconfig/--local" >&2
      exit 2
    fi
    if [ -z "$set_kubeconfig" ] && [[ $set_args != *local-mode* ]] && [[ $set_args != *-kubeconfig* ]]; then
      echo "install-baremetal: $defaults sets neither KUBECONFIG nor -local-mode: koordlet.service would fail to reach" \
        "an API server and restart for ever. Set KUBECONFIG=<file> or KOORDLET_ARGS=\"-local-mode\" there, or" \
        "use --proxy-only where koordlet runs as the DaemonSet." >&2
      exit 1
    fi
    log "kept: $defaults (an existing environment file is never rewritten)"
  else
    if [ -n "$admin_kubeconfig" ]; then
      mode_lines="KUBECONFIG=$kubeconfig
# kubelet's /pods with the same token (TokenReview): the service account's get nodes/pods
KOORDLET_ARGS=\"-kubelet-token-file=$IDENTITY_TOKEN\""
      log "koordlet.service: API server and kubelet as $IDENTITY_NAMESPACE/$IDENTITY_ACCOUNT ($kubeconfig)"
    elif [ -n "$kubeconfig" ]; then
      mode_lines="KUBECONFIG=$kubeconfig
KOORDLET_ARGS=\"\""
      log "koordlet.service: API server through $kubeconfig"
    else
      mode_lines="# No API server: local mode (pods from containerd's CRI, NodeSLO from the file, reports as files).
KOORDLET_ARGS=\"-local-mode -cri-endpoint=/var/run/containerd/containerd.sock -node-slo-file=/etc/koordlet/nodeslo.yaml -report-dir=/var/lib/koordlet/reports\""
      log "koordlet.service: no --admin-kubeconfig or --kubeconfig given: local mode"
    fi
    node_line="#NODE_NAME="
    [ -z "$node_name" ] || node_line="NODE_NAME=$node_name"
    if [ "$dry_run" = 1 ]; then
      log "would create: $defaults"
    else
      mkdir -p "$root/etc/default"
      cat >"$defaults" <<DEFAULTS
# Environment of koordlet.service (scripts/install-baremetal.sh). NODE_NAME defaults to the host name.
$node_line
$mode_lines
DEFAULTS
      log "created: $defaults"
    fi
  fi
fi

# kubelet's endpoint, now that the drop-in is in place: the planned change and its record (uninstall puts it back).
if ! ke_apply; then
  echo "install-baremetal: $ke_error" >&2
  exit 1
fi

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
  start_units restart koord-runtime-proxy.socket
  start_units start koord-runtime-proxy.service
elif [ "$version_changed" = 1 ] || [ "$proxy_changed" = 1 ]; then
  why=$([ "$version_changed" = 1 ] && echo "version ${target#versions/}" || echo "its unit or environment changed")
  log "restarting the proxy ($why); calls wait in its socket's backlog meanwhile"
  start_units start koord-runtime-proxy.socket
  start_units restart koord-runtime-proxy.service
else
  start_units start koord-runtime-proxy.socket koord-runtime-proxy.service
fi
if [ "$proxy_only" = 0 ]; then
  if [ "$version_changed" = 1 ] || [ "$koordlet_changed" = 1 ]; then
    start_units restart koordlet.service
  else
    start_units start koordlet.service
  fi
fi

# Old versions: the current and the previous one stay (the running processes and --rollback use them).
if [ -n "$target" ] && [ -d "$base/versions" ]; then
  keep_current=$(link_target current) keep_previous=$(link_target previous)
  for old in "$base"/versions/*/; do
    old=versions/$(basename "$old")
    [ "$old" = "$keep_current" ] || [ "$old" = "$keep_previous" ] || [ ! -e "$base/$old" ] && continue
    if [ "$dry_run" = 1 ]; then log "would remove: $base/$old"; else rm -rf "${base:?}/$old"; log "removed: $base/$old"; fi
  done
fi

# 4. kubelet onto the proxy, and proof that it talks to it: the proxy's own count of served calls must grow.
# served_calls HOST PORT: the proxy's koord_runtimeproxy_calls_served_total, or nothing when /metrics does not answer
# (bash's /dev/tcp: no Python or curl on the node needed).
served_calls() {
  timeout 10 bash -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n" "$1" >&3
    while IFS= read -r line <&3; do
      line=${line%"$3"}
      case $line in "koord_runtimeproxy_calls_served_total "*) value=${line#* }; echo "${value%%.*}" ;; esac
    done' served "$1" "$2" $'\r' 2>/dev/null || true
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
case "$metrics_host" in ""|0.0.0.0) metrics_host=127.0.0.1 ;; "[::]") metrics_host="::1" ;; esac
metrics_host=${metrics_host#[}
metrics_host=${metrics_host%]}
url=http://$metrics_address/metrics
if [ "$dry_run" = 1 ]; then
  log "would run: $systemctl restart kubelet.service"
  log "would check that koord_runtimeproxy_calls_served_total at $url grows within ${KUBELET_CHECK_TIMEOUT:-60}s"
  log "done"
  exit 0
fi
before=$(served_calls "$metrics_host" "$metrics_port")
if [ -z "$before" ]; then
  echo "install-baremetal: the proxy's metrics at $url do not answer; kubelet was NOT restarted. Check" \
    "'systemctl status koord-runtime-proxy' and 'journalctl -u koord-runtime-proxy'." >&2
  exit 1
fi
"$systemctl" restart kubelet.service
started=$(date +%s)
deadline=$((started + ${KUBELET_CHECK_TIMEOUT:-60}))
while :; do
  now_served=$(served_calls "$metrics_host" "$metrics_port")
  if [ -n "$now_served" ] && [ "$now_served" -gt "$before" ]; then
    log "kubelet talks to the proxy: $((now_served - before)) CRI call(s) served within $(( $(date +%s) - started ))s" \
      "of kubelet's restart"
    break
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    {
      echo "install-baremetal: ERROR: kubelet made no CRI call through the proxy within ${KUBELET_CHECK_TIMEOUT:-60}s"
      echo "  of its restart (koord_runtimeproxy_calls_served_total at $url stayed at $before). The endpoint was"
      echo "  set in $ke_file ($ke_place: $ke_note). Check:"
      echo "  - ps -o args= -C kubelet: its --container-runtime-endpoint and --config;"
      echo "  - systemctl cat kubelet.service: the drop-in 10-koord-runtime-proxy.conf is there; an EnvironmentFile"
      echo "    (/etc/default/kubelet, /etc/sysconfig/kubelet) setting KUBELET_EXTRA_ARGS wins over its Environment=;"
      echo "  - containerRuntimeEndpoint: in kubelet's config file (/var/lib/kubelet/config.yaml) names the proxy's socket;"
      echo "  - systemctl status kubelet; journalctl -u kubelet -n 50."
      echo "  scripts/uninstall.sh puts kubelet back on containerd."
    } >&2
    exit 1
  fi
  sleep 1
done
log "done"
