#!/usr/bin/env bash
# v2-guest.sh — runs INSIDE the cgroup v2 VM booted by scripts/v2-stage.sh (never on the host): checks
# that this is the real unified hierarchy, gives containerd a tmpfs root (the guest's /var is an overlay
# on 9p, where the overlayfs snapshotter cannot mount), and runs the tests marked `cgroupv2` as root.
# Writes its exit code to $KPY_V2_OUT/rc, so the host can tell a finished run from a guest that died.
#   KPY_V2_OUT   a dir shared read-write with the host (junit.xml, rc)
#   KPY_V2_MODE  tests (default) | bench (KPY_V2_BENCH's --v2-guest part, default bench/qos_reaction.py)
#   KPY_VENV     the virtualenv to run (default: the checkout's .venv; make test-latest passes its own)
set -uo pipefail
echo   # the serial console can eat the guest's first line
out=${KPY_V2_OUT:?KPY_V2_OUT not set}
mode=${KPY_V2_MODE:-tests}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${KPY_VENV:-$here/.venv}/bin/python
log() { echo "v2-guest: $*" >&2; }
finish() { echo "$1" > "$out/rc"; exit "$1"; }

[ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ] || { log "/sys/fs/cgroup is not cgroup2"; finish 1; }
# Seconds since the guest's kernel started: where an emulated guest's time goes (boot, Python, the tests).
uptime_s() { cut -d' ' -f1 /proc/uptime; }
log "kernel $(uname -r), $(nproc) CPUs, controllers: $(cat /sys/fs/cgroup/cgroup.controllers); booted in $(uptime_s) s"
[ "$(id -u)" = 0 ] || { log "not root in the guest"; finish 1; }
# Only in a guest booted by v2-stage.sh (virtme-ng's init, or kpy_v2_guest=1 with systemd as PID 1): it
# mounts a tmpfs over a host path and would do so on a host too.
grep -qE 'virtme|kpy_v2_guest=1' /proc/cmdline || { log "not a v2-stage guest (see /proc/cmdline); refusing to run"; finish 1; }
log "PID 1: $(cat /proc/1/comm), cgroup driver for the pod story: ${KPY_CGROUP_DRIVER:-cgroupfs}"
mkdir -p /var/lib/koordlet-py /run/koordlet-py
mount -t tmpfs -o mode=0700 koordlet-py-v2 /var/lib/koordlet-py || { log "cannot mount a tmpfs for containerd"; finish 1; }

# KPY_KEEP_LOGS: each containerd the tests start leaves its log here when it is removed (the guest's /run goes
# with the guest).
export PYTHONDONTWRITEBYTECODE=1 KPY_V2_GUEST=1 HOME=/tmp KPY_KEEP_LOGS="$out"
cd "$here" || finish 1
case "$mode" in
  tests)
    # Only the modules that mark tests cgroupv2: importing the whole tree under emulation to deselect the
    # rest would cost ~100 s. A test marked some other way (a conftest hook) is still found with args.
    # -v: one line per test, so a slow or stuck test shows on the console (the systemd guest logs lines).
    # KPY_V2_SKIP: modules another guest runs, space-separated (the pod story and koordlet as an NRI plugin run
    # in the systemd guest, on the stack a current node runs; running them here too would cost the stage minutes
    # of emulation).
    if [ $# -eq 0 ]; then
      skip=$(tr ' ' '\n' <<< "${KPY_V2_SKIP:-none}")
      mapfile -t files < <(grep -rlE --include='test_*.py' 'mark\.cgroupv2|BOTH_VERSIONS' tests | grep -vxF "$skip" | sort)
      [ ${#files[@]} -gt 0 ] || { log "no module marks a test cgroupv2"; finish 1; }
      set -- "${files[@]}"
    fi
    # No hypothesis plugin: no cgroupv2 test is a property test, and loading it costs ~30 s under emulation.
    # faulthandler_timeout: a test still running after 240 s prints every thread's stack (the run goes on), so a
    # guest that hangs says where before the host's V2_TIMEOUT ends it. timeout=900 (pyproject's 300 on the host):
    # a session's first test also pays the session's setup (containerd started in the guest), and a guest beside
    # the host stage and the other guest gets a small share of the cores; a test's own timeout mark still holds.
    log "pytest starts at $(uptime_s) s"
    "$py" -m pytest -v -rs -p no:cacheprovider -p no:hypothesispytest -m cgroupv2 -o junit_family=xunit1 \
      -o faulthandler_timeout=240 -o timeout=900 --junitxml="$out/junit.xml" "$@"
    rc=$?
    log "pytest done at $(uptime_s) s"
    # The tests remove every cgroup they made (containerd-down.sh prunes runc's parents): on the real v2
    # hierarchy, check that nothing of ours is left.
    left=$(find /sys/fs/cgroup -maxdepth 1 -type d -name 'koordlet-py*' | sort)
    if [ -n "$left" ]; then
      log "cgroup dirs left behind by the tests: $(echo $left)"; [ "$rc" != 0 ] || rc=1
    fi
    finish "$rc" ;;
  bench)
    "$py" "${KPY_V2_BENCH:-bench/qos_reaction.py}" --v2-guest "$@"
    finish $? ;;
  *) log "unknown mode $mode"; finish 2 ;;
esac
