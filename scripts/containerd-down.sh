#!/usr/bin/env bash
# containerd-down.sh — stop the containerd started by containerd-up.sh and clean up after it.
# Every process is ended by a PID that was saved to a file (containerd.pid, and the shim.pid /
# init.pid files containerd's runc-v2 shims keep in the state dir) — never by process name.
# Idempotent: running it when nothing is up exits 0.
#   CTRD_RUN, CTRD_ROOT, CTRD_BRIDGE  as in containerd-up.sh
#   CTRD_KEEP_ROOT=1                  keep $CTRD_ROOT (image content; makes the next up ~0.1 s faster)
#   CTRD_CGROUP_TOPS="koordlet-py kubepods"     top-level cgroup dirs to prune (empty dirs only, depth-first)
set -uo pipefail

RUN=${CTRD_RUN:-/run/koordlet-py/containerd}
ROOT=${CTRD_ROOT:-/var/lib/koordlet-py/containerd}
BRIDGE=${CTRD_BRIDGE:-kpytest0}
TOPS=${CTRD_CGROUP_TOPS:-koordlet-py kubepods}
SOCK=$RUN/containerd.sock
PIDFILE=$RUN/containerd.pid
CONF=$RUN/config.toml
log() { echo "containerd-down: $*" >&2; }

pid_is() {  # pid_is PID PATTERN: PID alive and its cmdline contains PATTERN
  local c; [ -n "$1" ] && [ -d "/proc/$1" ] && c=$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null) && [[ $c == *"$2"* ]]
}
gone() { [ ! -d "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }  # zombies count as gone
wait_gone() { for _ in $(seq 1 "${2:-50}"); do gone "$1" && return 0; sleep 0.1; done; return 1; }

TASKDIR=$RUN/state/io.containerd.runtime.v2.task
GRACEFUL=
# Shim sockets named in our own bundles: the "address" file (1.6, 1.7) or bootstrap.json's "address" (2.x).
shim_socks() {
  { cat "$TASKDIR"/*/*/address 2>/dev/null; echo
    cat "$TASKDIR"/*/*/bootstrap.json 2>/dev/null | grep -o '"address":"[^"]*"' | cut -d'"' -f4
  } | sed 's|^unix://||' | grep -v '^$' | sort -u
}
SHIM_SOCKS=$(shim_socks)
# Shim PIDs, found through those sockets (1.6 keeps no shim.pid); collected first, while the shims still listen.
shim_pids() {
  local sock
  for sock in $SHIM_SOCKS; do
    ss -xlpn 2>/dev/null | awk -v s="$sock" '$5 == s' | grep -o 'pid=[0-9]*' | cut -d= -f2
  done | sort -u
}
SHIMS=$(shim_pids)

# 1. Graceful: while containerd answers, SIGKILL every task and delete it (a shim exits when its
#    last task is deleted).
if [ -S "$SOCK" ] && timeout 5 ctr -a "$SOCK" version >/dev/null 2>&1; then
  for ns in $(timeout 5 ctr -a "$SOCK" namespaces ls -q 2>/dev/null); do
    ids=$(timeout 5 ctr -a "$SOCK" -n "$ns" tasks ls -q 2>/dev/null)
    [ -n "$ids" ] || continue
    log "killing $(echo "$ids" | wc -l) task(s) in namespace $ns"
    for id in $ids; do timeout 5 ctr -a "$SOCK" -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1; done
    for id in $ids; do timeout 10 ctr -a "$SOCK" -n "$ns" tasks delete -f "$id" >/dev/null 2>&1; done
  done
  # container records too, so that a kept root (CTRD_KEEP_ROOT=1) restarts with no stale pods
  for ns in $(timeout 5 ctr -a "$SOCK" namespaces ls -q 2>/dev/null); do
    ids=$(timeout 5 ctr -a "$SOCK" -n "$ns" containers ls -q 2>/dev/null)
    [ -z "$ids" ] || timeout 20 ctr -a "$SOCK" -n "$ns" containers delete $ids >/dev/null 2>&1
  done
  GRACEFUL=1
fi
# Any container process still alive (containerd was already dead): its saved init.pid.
for f in "$TASKDIR"/*/*/init.pid; do
  [ -f "$f" ] || continue; p=$(cat "$f" 2>/dev/null)
  [ -n "$p" ] && [ -d "/proc/$p" ] && kill -KILL "$p" 2>/dev/null
done

# 2. Stop containerd (SIGTERM, then SIGKILL after 10 s).
if [ -f "$PIDFILE" ]; then
  p=$(cat "$PIDFILE")
  if pid_is "$p" "containerd --config $CONF"; then
    log "stopping containerd pid $p"
    kill -TERM "$p" 2>/dev/null; wait_gone "$p" 100 || { kill -KILL "$p" 2>/dev/null; wait_gone "$p" 20; }
  fi
  rm -f "$PIDFILE"
fi

# 3. Shims still alive (they outlive containerd by design): the PIDs collected above, checked to be
#    a shim of our socket.
for p in $SHIMS; do
  if pid_is "$p" "-address $SOCK"; then kill -KILL "$p" 2>/dev/null; wait_gone "$p" 20; fi
done
for s in $SHIM_SOCKS; do rm -f "$s"; done

# 4. Unmount everything under our dirs (rootfs overlays, sandbox /dev/shm, pod netns), deepest first.
for base in "$RUN" "$ROOT"; do
  findmnt -rn -o TARGET 2>/dev/null | grep -E "^$base(/|$)" | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
done

# 5. Network: the isolated bridge (veths die with their netns).
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE" 2>/dev/null

# 6. Prune empty cgroup dirs left under the given tops (runc creates parents, nobody removes them): in
#    every v1 hierarchy, or in the one unified hierarchy on cgroup v2.
if [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then hierarchies=/sys/fs/cgroup/
else hierarchies=$(printf '%s ' /sys/fs/cgroup/*/); fi
# A cgroup whose last process was just killed stays busy a moment after (seconds under emulation) while the
# kernel frees it: one with no process left is retried, bounded (10 s); one with processes (another session's
# pods under the same top) is left at once.
for _ in $(seq 1 50); do
  busy=
  for top in $TOPS; do
    for h in $hierarchies; do
      d=$h$top; [ -d "$d" ] || continue
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
      [ -d "$d" ] || continue
      if [ -z "$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)" ]; then busy+=" $d"; fi
    done
  done
  [ -n "$busy" ] || break
  sleep 0.2
done
for d in $busy; do log "cgroup $d could not be removed (no process inside, still busy after 10 s)"; done

# 7. Files.
rm -rf "$RUN/state" "$RUN/runc" "$RUN"/runc-* "$RUN/cni-ipam" "$RUN/cni" "$SOCK" "$SOCK.ttrpc"
if [ -n "${CTRD_KEEP_ROOT:-}" ] && [ -n "$GRACEFUL" ]; then :; else rm -rf "$ROOT"; fi  # kept only if cleaned via API
rmdir /run/containerd/s /run/containerd 2>/dev/null   # shim sockets' fixed home; only if empty
log "down"
exit 0
