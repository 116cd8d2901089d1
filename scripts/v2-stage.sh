#!/usr/bin/env bash
# v2-stage.sh — the cgroup v2 stage of the test command: boot Debian's own kernel in a qemu VM
# (virtme-ng, the host's root shared read-only) and run, inside it as root on the real unified cgroup
# v2, every test marked `cgroupv2` (scripts/v2-guest.sh). Fails when any test fails in the guest, when
# a test is skipped there for any reason but a missing kernel feature, and when the guest does not
# finish in time; the guest's output is shown as it runs.
#
#   bash scripts/v2-stage.sh [pytest args...]       (make v2-check)
#
# Knobs (environment):
#   V2_CPUS=4            vCPUs (4 so the cpuset-suppress shrink is visible)
#   V2_MEMORY=4G         guest memory
#   V2_TIMEOUT=1200      seconds before a guest is killed (boot, tests, and the wait for the host; each guest
#                        measures ~10 min alone)
#   V2_KERNEL=           a kernel image; default: the newest /boot/vmlinuz-*
#   V2_OUT=out/v2        results: <driver>/{junit.xml,rc,guest.log,wall_seconds}; the guests write there
#   V2_DRIVERS="systemd cgroupfs"   the guests to boot, one after the other, in this order: systemd (systemd as
#                        PID 1: the pod story, NRI and the hook plugins on kubelet's systemd layout, the proxy restarted
#                        by systemctl; on request, kubelet's endpoint set by the installer and read by a kubelet
#                        systemd starts, and the proxy and koordlet run from the image's root tree) and cgroupfs
#                        (virtme-ng's init; every cgroupv2 test but those, which it runs only when it boots alone, and
#                        those that need systemd, never)
#   V2_MODE=tests        or `bench`: run a benchmark's --v2-guest part in the cgroupfs guest (make bench-v2)
#   V2_BENCH=bench/qos_reaction.py   the benchmark V2_MODE=bench runs (its other arguments: this script's)
#   V2_HUGEPAGES=64      2 MiB huge pages the cgroupfs guest reserves at boot (kernel command line)
#   V2_DISK_MB=64        size of the sparse disk attached to the cgroupfs guest (blkio tests; BE page cache in benches)
#   V2_NUMA=2            NUMA nodes of the cgroupfs guest (qemu -numa through vng --numa): V2_CPUS and V2_MEMORY
#                        split evenly between them (each must divide); 1 boots it without NUMA
#   V2_WAIT_FOR_HOST=    1: the VM runs beside the host stage (scripts/test-all.sh), and the guests' tests marked
#                        alone wait until $V2_OUT/host-done exists (the host's stages beside it are done;
#                        tests/support/v2guest.py); the gate (scripts/v2-gate.sh) gives each guest its turn in its
#                        own results dir.
#   V2_NICE=0            the VM's niceness, of its processes and of their autogroup (the kernel's per-session
#                        group, which is what competes with other sessions for the CPUs when autogroup is on):
#                        scripts/test-all.sh runs the VM beside the host stage with 10, so that the host tests
#                        keep the cores they need and the VM takes the rest
# Installs what it needs: Debian qemu-system-x86 and linux-image-amd64 (apt-get); virtme-ng is pinned in
# requirements-dev.lock and installed by make deps. Needs root.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$here/.venv}
cpus=${V2_CPUS:-4}
memory=${V2_MEMORY:-4G}
limit=${V2_TIMEOUT:-1200}
mode=${V2_MODE:-tests}
numa=${V2_NUMA:-2}
nice=${V2_NICE:-0}
# The systemd guest first: its long tests (the proxy restarted by systemd, NRI) need no quiet host, so beside the host
# stage they use the time its tests leave; the cgroupfs guest's are mostly CPU suppression, marked alone.
drivers=${V2_DRIVERS:-systemd cgroupfs}
out=${V2_OUT:-$here/out/v2}
log() { echo "v2-stage: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (the guest's cgroup v2 is written as root)"
[ -x "$venv/bin/python" ] || die "no virtualenv at $venv (run: make deps)"

# ---- install -------------------------------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
compgen -G "/boot/vmlinuz-*" >/dev/null || need+=(linux-image-amd64)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  aptlog=/tmp/koordlet-py-apt-v2.log
  apt-get install -y -q --no-install-recommends "${need[@]}" >"$aptlog" 2>&1 || {
    apt-get update -q >>"$aptlog" 2>&1
    apt-get install -y -q --no-install-recommends "${need[@]}" >>"$aptlog" 2>&1 ||
      { tail -20 "$aptlog" >&2; die "apt-get install failed"; }
  }
fi
[ -x "$venv/bin/vng" ] || die "no vng in $venv: virtme-ng comes with requirements-dev.lock (run: make deps)"
mkdir -p "$out"
# The guests' containerd (tests/support/containerd.py's default generation) and the runc 1.3 its sessions add as the
# runtime handler runc-1.3 are fetched here: the VM has no network.
CTRD_VERSION=2.1 CTRD_RUNC_HANDLERS=1.3 CTRD_FETCH_ONLY=1 CTRD_RUN="$out/.fetch" bash "$here/scripts/containerd-up.sh" ||
  die "could not fetch containerd 2.1 and runc 1.3 for the guests"
# --numa SIZE,cpus=FIRST-LAST per node: the CPUs and the memory split evenly (tests/koordlet/metricsadvisor/test_numa.py).
numa_opts=()
if [ "$numa" -gt 1 ]; then
  mem_value=${memory%[GMgm]} mem_unit=${memory##*[0-9]}
  [[ $mem_value =~ ^[0-9]+$ && -n $mem_unit ]] || die "V2_NUMA needs V2_MEMORY as <number>G or <number>M, got $memory"
  [ $((cpus % numa)) = 0 ] && [ $((mem_value % numa)) = 0 ] ||
    die "V2_NUMA=$numa must divide V2_CPUS=$cpus and V2_MEMORY=$memory"
  for ((n = 0; n < numa; n++)); do
    first=$((n * cpus / numa)) last=$(((n + 1) * cpus / numa - 1))
    numa_opts+=(--numa "$((mem_value / numa))$mem_unit,cpus=$first-$last")
  done
fi
kernel=${V2_KERNEL:-$(ls -v /boot/vmlinuz-* 2>/dev/null | tail -1)}
[ -r "$kernel" ] || die "no kernel image to boot (looked for /boot/vmlinuz-*)"
# virtme-ng loads modules (9p, overlay, virtio) from the kernel's /lib/modules tree.
release=${kernel##*/vmlinuz-}
[ -d "/lib/modules/$release" ] || die "no /lib/modules/$release for $kernel"

# The guests read this checkout read-only and write no bytecode: every module an emulated guest compiles costs it
# what the host does in a fraction of the time, and on a fresh clone (the host stage starts beside this one) nothing
# is compiled yet. So compile here first: the project's modules, and pytest's rewritten test modules of the guests
# (a collection of the cgroupv2 modules writes them, and says early when one does not import).
"$venv/bin/python" -m compileall -q -j 0 "$here/koordlet" "$here/runtimeproxy" "$here/hooks" "$here/wire" \
  "$here/demo" "$here/tests" >/dev/null || die "compileall failed"
mapfile -t guest_modules < <(cd "$here" && grep -rlE --include='test_*.py' 'mark\.cgroupv2|BOTH_VERSIONS' tests | sort)
(cd "$here" && "$venv/bin/python" -m pytest -q --collect-only -p no:cacheprovider -m cgroupv2 "${guest_modules[@]}" \
  >"$out/.collect.log" 2>&1) || { cat "$out/.collect.log" >&2; die "the cgroupv2 modules do not collect"; }

# ---- run -----------------------------------------------------------------------------------------
export PATH=$venv/bin:$PATH   # vng runs its helper virtme-run from PATH
vng_pid=
tee_pid=
stop_guest() {
  [ -n "$vng_pid" ] || return 0
  # vng, virtme-run and qemu share one process group (setsid): note them, end the group, and return only
  # when every one of them has left /proc (qemu takes a moment to let go of the guest's memory).
  local members p; members=$(pgrep -g "$vng_pid" | tr '\n' ' ')
  kill -TERM -- "-$vng_pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$vng_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$vng_pid" 2>/dev/null
  wait "$vng_pid" 2>/dev/null
  # Gone: out of /proc, or a zombie (dead, its memory freed; reaping it is PID 1's business once vng is gone).
  gone() { [ ! -d "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
  for p in $members; do
    for _ in $(seq 1 100); do gone "$p" && break; sleep 0.1; done
    gone "$p" || log "WARNING: guest process $p ($(cat "/proc/$p/comm" 2>/dev/null)) still alive after 10 s"
  done
  kill "$tee_pid" 2>/dev/null
  vng_pid=
}
trap 'log "interrupted: stopping the guest"; stop_guest; exit 130' INT
trap 'log "terminated: stopping the guest"; stop_guest; exit 143' TERM

# boot DRIVER DIR [pytest args]: one guest run, its results (junit.xml, rc, guest.log, wall_seconds) in DIR.
#   cgroupfs: virtme-ng's own init runs scripts/v2-guest.sh (every cgroupv2 test, or the given args);
#   systemd:  systemd is PID 1 (scripts/v2-systemd-init.sh), containerd uses the systemd cgroup driver, and
#             the pod story runs on kubelet's systemd layout.
boot() {
  local driver=$1 dir=$2; shift 2
  rm -rf "$dir"; mkdir -p "$dir"
  # The turn of this guest's tests marked alone: a file the gate (scripts/v2-gate.sh) creates, when there is another
  # side to wait for (the host's stages, the other guest).
  local host_done=
  [ "${V2_WAIT_FOR_HOST:-}" != 1 ] || host_done=$dir/host-done
  local -a how
  if [ "$driver" = systemd ]; then
    local args; args=$(IFS=:; echo "$*")
    [[ $args != *" "* ]] || die "pytest arguments for the systemd guest cannot contain spaces"
    # A later -append replaces virtme's kernel command line (and with it virtme's init and --exec).
    local cmdline="console=ttyS0 nr_open=1048576 audit=off luks=no systemd.zram=0 quiet loglevel=1 container="
    cmdline+=" kpy_v2_guest=1 kpy_repo=$here kpy_venv=$venv kpy_out=$dir kpy_args=$args systemd.unit=kpy-v2.target"
    [ -z "$host_done" ] || cmdline+=" kpy_host_done=$host_done"
    cmdline+=" init=$here/scripts/v2-systemd-init.sh"
    how=(--systemd --qemu-opts="-append '$cmdline'")
  else
    # A block device for the blkio tests (test_blkio_v2.py): a sparse 64 MiB image attached as a virtio disk; the
    # guest finds it by its serial (the image path's first 20 characters, all a virtio-blk serial holds).
    local disk=$dir/blkio-disk.img
    truncate -s "${V2_DISK_MB:-64}M" "$disk"
    local guest_cmd
    guest_cmd="KPY_VENV=$(printf %q "$venv") KPY_V2_OUT=$(printf %q "$dir") KPY_V2_MODE=$mode KPY_V2_DISK=$(printf %q "$disk") KPY_V2_NUMA=$numa"
    guest_cmd+=" KPY_V2_BENCH=$(printf %q "${V2_BENCH:-bench/qos_reaction.py}") KPY_V2_HOST_DONE=$(printf %q "$host_done")"
    # The pod story and the NRI plugin on containerd 2.1 are the systemd guest's (below) when both guests boot;
    # the proxy's restarts under systemd and kubelet's endpoint under systemd need systemd as PID 1, so they are never
    # the cgroupfs guest's.
    local skip=("${systemd_only_modules[@]}")
    [[ " $drivers " != *" systemd "* ]] || skip+=("${systemd_modules[@]}")
    guest_cmd+=" KPY_V2_SKIP=$(printf %q "${skip[*]}")"
    guest_cmd+=" bash $(printf %q "$here/scripts/v2-guest.sh")"
    for a in "$@"; do guest_cmd+=" $(printf %q "$a")"; done
    # 2 MiB huge pages reserved at boot: the HugePageReport test reads them back from the guest's sysfs.
    how=(--disk "$disk" --append "hugepagesz=2M hugepages=${V2_HUGEPAGES:-64}" "${numa_opts[@]}" --exec "$guest_cmd")
  fi
  local nodes=1; [ "$driver" = systemd ] || nodes=$numa
  log "booting $kernel under qemu (TCG: this machine's KVM cannot run guests), $cpus vCPUs, $memory, $nodes NUMA node(s), $driver driver"
  local started; started=$(date +%s)
  # Its own session: every path (timeout, failure, Ctrl-C) ends vng and its qemu together, by that PID. The
  # systemd guest's console is stdio: its stdin is a FIFO held open read-write (never EOF, no extra process).
  # Its output goes through a pipe to tee (shown as it runs, kept in guest.log): qemu reopens its stdout
  # through /proc/self/fd, which on a plain file would start writing again at offset 0.
  local fifo=$dir/.stdin stdin_fd out_fd
  mkfifo "$fifo"
  exec {stdin_fd}<>"$fifo"
  exec {out_fd}> >(tee "$dir/guest.log")
  tee_pid=$!
  nice -n "$nice" setsid vng --run "$kernel" --disable-kvm --force-9p --cpus "$cpus" --memory "$memory" \
    --rwdir "$dir" "${how[@]}" <&"$stdin_fd" >&"$out_fd" 2>&1 &
  vng_pid=$!
  exec {stdin_fd}>&- {out_fd}>&-
  rm -f "$fifo"
  # setsid made the VM a session, and so (with the kernel's autogroup on) a group of its own beside the caller's.
  [ "$nice" = 0 ] || echo "$nice" > "/proc/$vng_pid/autogroup" 2>/dev/null || true
  local deadline=$((started + limit)) qemu_pid="" qemu_ticks=0 stat
  while kill -0 "$vng_pid" 2>/dev/null; do
    # qemu's CPU time so far (utime + stime), kept in cpu_seconds with the wall time: what the guest cost the host.
    [ -n "$qemu_pid" ] || qemu_pid=$(pgrep -g "$vng_pid" -f qemu-system | head -1)
    if [ -n "$qemu_pid" ] && stat=$(cut -d')' -f2 "/proc/$qemu_pid/stat" 2>/dev/null); then
      qemu_ticks=$(awk '{print $12 + $13}' <<< "$stat")
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "guest still running after ${limit}s: stopping it"
      stop_guest
      log "ERROR: timed out after ${limit}s (V2_TIMEOUT); the guest's output is above and in $dir/guest.log"
      return 1
    fi
    # In the background and waited for: a trapped signal interrupts `wait` at once, while bash would drop a
    # SIGINT that arrives during a foreground child that then exits normally.
    sleep 1 &
    wait $! 2>/dev/null || true
  done
  local vng_rc=0
  wait "$vng_pid" || vng_rc=$?
  vng_pid=
  wait "$tee_pid" 2>/dev/null || true
  local elapsed=$(( $(date +%s) - started ))
  echo "$elapsed" > "$dir/wall_seconds"
  echo $(( qemu_ticks / $(getconf CLK_TCK) )) > "$dir/cpu_seconds"
  # The guest writes its own exit code; a guest that never reached the end (kernel panic, boot failure)
  # leaves no file: that is a failure too.
  if [ ! -f "$dir/rc" ]; then
    log "ERROR: the $driver guest did not finish its run (vng exit $vng_rc, no $dir/rc after ${elapsed}s; see $dir/guest.log)"
    return 1
  fi
  local rc; rc=$(cat "$dir/rc")
  log "$driver guest finished in ${elapsed}s (qemu used $(cat "$dir/cpu_seconds") s of CPU) with exit code $rc"
  return "$rc"
}

# What the systemd guest runs: the stack a current node runs (kubelet's systemd layout, containerd 2.1, the
# proxy and koordlet as an NRI plugin), and every hook plugin through both on the session's one containerd. The
# cgroupfs guest runs every other cgroupv2 module.
# The proxy restarted 10 times by systemd while a client calls it needs systemd itself: it runs in that guest only.
# On request only (named in PYTEST_ARGS with V2_DRIVERS=systemd; never in `make test`): modules that need systemd and
# cost the guest about ten minutes of emulation each, more than the stage's 30-minute budget leaves (docs/testing.md).
systemd_on_request=(tests/deploy/test_kubelet_endpoint_systemd_v2.py tests/deploy/test_root_tree_systemd_v2.py)
systemd_only_modules=(tests/runtimeproxy/test_restart_systemd_v2.py "${systemd_on_request[@]}")
systemd_modules=(tests/koordlet/test_pod_story_v2.py tests/koordlet/runtimehooks/nri/test_containerd_v2.py
                 tests/koordlet/runtimehooks/test_hook_plugins_v2.py tests/runtimeproxy/test_restart_systemd_v2.py)
# The root tree the bare-metal install unpacks in the guest (test_root_tree_systemd_v2.py), which has no network to
# build it: built here first when that module is named (scripts/build-image.sh; nothing again when unchanged).
if [[ " $* " == *"test_root_tree_systemd_v2.py"* ]]; then
  log "building the image's root tree for test_root_tree_systemd_v2.py (scripts/build-image.sh)"
  bash "$here/scripts/build-image.sh" >&2 || die "scripts/build-image.sh failed: no root tree for the guest"
fi
# The gate (scripts/v2-gate.sh): the guests' tests marked alone one guest at a time, after the host's stages.
. "$here/scripts/v2-gate.sh"

started=$(date +%s)
rc=0
# V2_WAIT_FOR_HOST: each guest in a subshell of its own (its own vng_pid, its own traps) under the gate, which gives its
# tests marked alone their turn once the host's stages are done. One guest at a time: with two beside it, the host
# stage took twice as long and both the host's and the guests' timings failed (docs/testing.md).
gated_boot() {
  local driver=$1 pid; shift
  rm -rf "${out:?}/$driver"  # no word of an earlier run (alone-ready, rc) may reach the gate
  (
    trap 'stop_guest; exit 143' TERM
    trap '' INT
    # As the left side of `||`, as below: errexit stays off inside boot (its probes, such as pgrep before qemu is
    # there, may fail), and its own return is the subshell's exit code.
    boot "$driver" "$out/$driver" "$@" || exit $?
  ) &
  pid=$!
  trap 'log "interrupted: stopping the guest"; kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 130' INT
  trap 'log "terminated: stopping the guest"; kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 143' TERM
  gate "$out/$driver" "$pid"
  wait "$pid"
}
if [ "$mode" = bench ]; then
  boot cgroupfs "$out" "$@" || rc=$?
else
  # V2_DRIVERS: which guests (default both), one after the other. Arguments given: they go to both guests' pytest.
  for driver in $drivers; do
    args=("$@")
    [ "$driver" != systemd ] || [ $# -ne 0 ] || args=("${systemd_modules[@]}")
    if [ "${V2_WAIT_FOR_HOST:-}" = 1 ]; then
      gated_boot "$driver" "${args[@]}" || rc=$?
    else
      boot "$driver" "$out/$driver" "${args[@]}" || rc=$?
    fi
  done
fi
trap - INT TERM
log "v2 stage done in $(( $(date +%s) - started ))s, exit code $rc"
exit "$rc"
