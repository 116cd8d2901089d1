#!/usr/bin/env bash
# test-all.sh — the README's test command (`make test`, called by .ci/run). Its stages, in the order they start:
#   1. the cgroup v2 stage (scripts/v2-stage.sh): a VM booted at once, in the background, its guests beside
#      everything below (the VM is CPU-bound emulation; most host tests wait on processes, sockets and timers);
#   2. the host suite (real containerd + runc, real cgroup v1) on the default containerd generation (2.1), as two
#      pytest sessions at once: the parallel one (pytest-xdist, HOST_WORKERS workers, a worker per core by default)
#      with every test but those marked serial or alone, and the serial one, the tests marked `serial` one after
#      another (they touch node state with a fixed name: tests/support/nodestate.py);
#   3. the runtime-facing subset on containerd 1.7, then on 1.6, the same two sessions each;
#   4. once the VM is done: the tests marked `alone` (they measure CPU shares), with nothing beside them.
# The VM is niced, so that the host tests keep the cores they need; the guests' own tests marked alone wait until
# the host sessions are done (out/v2/host-done; scripts/v2-gate.sh gives each guest its turn).
# Every stage runs even when an earlier one fails; the command fails when any does, and ends with one line per
# stage, the time of each, and one line that adds them up.
#   PYTEST_ARGS=...     extra pytest arguments for the host sessions on the default generation
#   HOST_WORKERS=N      xdist workers of the parallel sessions (default: one per CPU, nproc)
#   GENERATIONS_SKIP=1  leave out the 1.7 and 1.6 subsets (a quick local run; never in CI)
#   V2_SKIP=1           leave out the v2 stage (a quick local run; never in CI)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
py=${VENV:-$here/.venv}/bin/python
workers=${HOST_WORKERS:-$(nproc)}
mkdir -p out
rm -f out/host-*junit.xml out/host-*.log

default=2.1
# The runtime-facing tests (docs/testing.md): the proxy's transparency with real clients (ctr) and kubelet's call
# sequence, hooks through the proxy, hostile clients, bad annotations, device injection, the states informer's
# CRI view, the fault tests and OOM score on real containers. Only the modules that talk to containerd: the rest
# do not change with it. The NRI tests pick their own generations (1.7 and 2.1) and run in the default stage.
subset=(tests/runtimeproxy/test_kubelet_sequence.py tests/runtimeproxy/test_grpc_go_client.py
        tests/runtimeproxy/test_hooks.py tests/runtimeproxy/test_hostile_clients.py
        "tests/runtimeproxy/test_socket_activation.py::test_a_restart_under_an_evented_pleg_subscription_takes_no_drain_timeout_and_the_client_subscribes_again"
        tests/koordlet/runtimehooks/test_bad_annotations.py tests/koordlet/runtimehooks/test_device_injection.py
        tests/koordlet/runtimehooks/test_runtimehooks.py tests/koordlet/statesinformer/test_cri.py
        tests/test_faults.py tests/hooks/test_oomscore.py)

names=()
results=()
times=()
host_rc=0
# ok RC: a pytest exit code that passes: 0, or 5 (no test selected: a subset without serial tests).
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }
# host_sessions GENERATION NAME [pytest args and paths...]: the parallel session (its output here) and, at the same
# time, the serial one (its output in out/host-NAME-serial.log, shown when both are done).
host_sessions() {
  local gen=$1 name=$2; shift 2
  local started; started=$(date +%s)
  KPY_CONTAINERD=$gen "$py" -m pytest -q -rs -m "serial and not alone and not cgroupv2" \
    --junitxml="out/host-$name-serial-junit.xml" "$@" >"out/host-$name-serial.log" 2>&1 &
  local serial_pid=$!
  KPY_CONTAINERD=$gen "$py" -m pytest -q -rs -n "$workers" --dist worksteal \
    -m "not serial and not alone and not cgroupv2" --junitxml="out/host-$name-junit.xml" "$@"
  ok $? || host_rc=1
  wait "$serial_pid"
  ok $? || host_rc=1
  echo "--- the same stage's tests marked serial, one after another (out/host-$name-serial.log):"
  tail -n 15 "out/host-$name-serial.log"
  times+=("$(( $(date +%s) - started ))")
}

started=$(date +%s)
v2_pid=
if [ "${V2_SKIP:-}" = 1 ] && [ "${CI:-}" != true ]; then
  echo "=== v2 stage left out (V2_SKIP=1) ==="
else
  echo "=== v2 stage started in the background: the tests marked cgroupv2 in a VM (out/v2-stage.log, shown at the end) ==="
  # Niced (V2_NICE, scripts/v2-stage.sh): the host tests keep the cores they need, the VM takes what they leave.
  # The guests' tests marked alone wait for out/v2/host-done (V2_WAIT_FOR_HOST), written once the host sessions
  # beside the VM are done; each guest may then take longer than it would alone (V2_TIMEOUT).
  rm -f out/v2/host-done
  V2_NICE=${V2_NICE:-10} V2_WAIT_FOR_HOST=1 V2_TIMEOUT=${V2_TIMEOUT:-1800} bash scripts/v2-stage.sh \
    >out/v2-stage.log 2>&1 &
  v2_pid=$!
  trap 'kill -TERM "$v2_pid" 2>/dev/null; wait "$v2_pid"; exit 130' INT TERM
fi

echo "=== host stage on containerd $default (the default): every test but those marked cgroupv2, $workers workers and the serial tests beside them ==="
# shellcheck disable=SC2086
host_sessions "$default" default ${PYTEST_ARGS:-}
names+=("host, containerd $default" "host, containerd $default, serial")
results+=(out/host-default-junit.xml out/host-default-serial-junit.xml)

if [ "${GENERATIONS_SKIP:-}" = 1 ] && [ "${CI:-}" != true ]; then
  echo "=== containerd 1.7 and 1.6 subsets left out (GENERATIONS_SKIP=1) ==="
else
  for gen in 1.7 1.6; do
    echo "=== host stage on containerd $gen: the runtime-facing subset ==="
    host_sessions "$gen" "$gen" "${subset[@]}"
    names+=("host, containerd $gen (runtime-facing subset)" "host, containerd $gen (subset), serial")
    results+=("out/host-$gen-junit.xml" "out/host-$gen-serial-junit.xml")
  done
fi

# The host's word to the guests: their tests marked alone may run now (scripts/v2-gate.sh passes it on into the
# results dir of the guest running, which the guest sees, and of a guest that boots later).
mkdir -p out/v2
: > out/v2/host-done
v2_rc=0
if [ -n "$v2_pid" ]; then
  echo "=== v2 stage: the tests marked cgroupv2, as root on a real cgroup v2 kernel in a VM ==="
  tail -n +1 -f --pid="$v2_pid" out/v2-stage.log
  wait "$v2_pid"
  v2_rc=$?
  trap - INT TERM
  names+=("v2 guest, cgroupfs driver, containerd 2.1" "v2 guest, systemd driver, containerd 2.1")
  results+=(out/v2/cgroupfs/junit.xml out/v2/systemd/junit.xml)
fi
v2_s=$(( $(date +%s) - started ))

echo "=== host stage on containerd $default, last: the tests marked alone (they measure CPU shares), nothing beside them ==="
alone_started=$(date +%s)
# shellcheck disable=SC2086
KPY_CONTAINERD=$default "$py" -m pytest -q -rs -m "alone and not cgroupv2" --junitxml=out/host-alone-junit.xml \
  ${PYTEST_ARGS:-}
ok $? || host_rc=1
names+=("host, containerd $default, alone")
results+=(out/host-alone-junit.xml)
if [ "${GENERATIONS_SKIP:-}" != 1 ] || [ "${CI:-}" = true ]; then
  for gen in 1.7 1.6; do
    echo "=== host stage on containerd $gen, last: the runtime-facing subset's tests marked alone ==="
    KPY_CONTAINERD=$gen "$py" -m pytest -q -rs -m "alone and not cgroupv2" --junitxml="out/host-$gen-alone-junit.xml" \
      "${subset[@]}"
    ok $? || host_rc=1
    names+=("host, containerd $gen (subset), alone")
    results+=("out/host-$gen-alone-junit.xml")
  done
fi
alone_s=$(( $(date +%s) - alone_started ))
total_s=$(( $(date +%s) - started ))
gens_s=0
for t in "${times[@]:1}"; do gens_s=$((gens_s + t)); done

"$py" - "${times[0]}" "$gens_s" "$v2_s" "$alone_s" "$total_s" "${#names[@]}" "${names[@]}" "${results[@]}" <<'PY'
import sys
import xml.etree.ElementTree as ET
host_s, gens_s, v2_s, alone_s, total_s, count, *rest = sys.argv[1:]
names, files = rest[:int(count)], rest[int(count):]
totals = dict.fromkeys(("passed", "failed", "skipped"), 0)
for name, path in zip(names, files):
    try:
        suites = ET.parse(path).getroot().iter("testsuite")
    except (OSError, ET.ParseError):
        print(f"{name}: no results ({path} missing or unreadable)")
        totals["failed"] += 1
        continue
    got = dict.fromkeys(totals, 0)
    failed_ids = []
    for s in suites:
        n, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        got["failed"] += f + e
        got["skipped"] += sk
        got["passed"] += n - f - e - sk
        failed_ids += [f"{case.get('classname', '')}::{case.get('name', '')}" for case in s.iter("testcase")
                       if case.find("failure") is not None or case.find("error") is not None]
    print(f"{name}: {got['passed']} passed, {got['failed']} failed, {got['skipped']} skipped")
    for case_id in failed_ids:  # by name, here at the end, where a log's tail still shows them
        print(f"  failed: {case_id}")
    for k in totals:
        totals[k] += got[k]
print(f"(host stage {host_s} s and 1.7/1.6 subsets {gens_s} s beside the v2 stage, the v2 stage done at {v2_s} s, "
      f"the alone tests {alone_s} s after it; whole run {total_s} s)")
print(f"total: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
PY
[ "$host_rc" = 0 ] && [ "$v2_rc" = 0 ]
