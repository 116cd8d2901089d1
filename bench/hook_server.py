#!/usr/bin/env python3
"""koordlet's hook server and reconciler: what they cost, measured here (not a test).

* p50/p99 of one PreCreateContainerHook round trip on the unix socket (a BE container with batch
  resources: every default plugin runs), from a gRPC client like the proxy's;
* the reconciler's cost per container per tick on N real cgroup v1 pod/container dirs (default 50),
  values already in place (the steady state: reads and skipped writes) and after drift (writes).
Prints a table; with --json one object (hook_p50_ms, hook_p99_ms, reconcile_us_per_container, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc

from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc

GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True}
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
FORCE_UPDATE_S = 60.0
ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}
LABELS = {"koordinator.sh/qosClass": "BE"}
CONTROLLERS = ("cpu", "memory")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def hook_round_trips(socket_path: str, cgroup_root: str, calls: int) -> list[float]:
    """Milliseconds of each PreCreateContainerHook round trip (after 100 to warm up)."""
    request = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="job", namespace="ns", uid="u1"),
        container_meta=hookapi.ContainerMetadata(name="job"), pod_annotations=ANNOTATIONS, pod_labels=LABELS,
        pod_cgroup_parent=f"{cgroup_root}/kubepods/besteffort/podu1", container_envs={"A": "1"},
        container_resources=hookapi.LinuxContainerResources(cpu_period=100000))
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = hookapi_grpc.RuntimeHookServiceStub(channel)
        for _ in range(100):
            stub.PreCreateContainerHook(request)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            stub.PreCreateContainerHook(request)
            samples.append((time.perf_counter() - t0) * 1000)
    return samples


def make_pods(cgroup_root: str, containers: int, made: list[Path]) -> list[PodMeta]:
    """BE pods of one container each, with their cgroup v1 dirs made (and listed in ``made``)."""
    pods = []
    for _ in range(containers):
        uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
        for controller in CONTROLLERS:
            for rel in ("", "/kubepods", "/kubepods/besteffort", f"/kubepods/besteffort/pod{uid}",
                        f"/kubepods/besteffort/pod{uid}/{cid}"):
                path = Path(f"/sys/fs/cgroup/{controller}{cgroup_root}{rel}")
                if not path.exists():
                    path.mkdir()
                    made.append(path)
        pods.append(PodMeta(name=f"p{len(pods)}", namespace="ns", uid=uid, labels=LABELS, annotations=ANNOTATIONS,
                            cgroup_parent=f"{cgroup_root}/kubepods/besteffort/pod{uid}",
                            containers=(ContainerMeta("job", cid),)))
    return pods


def reconcile_costs(hooks: RuntimeHooks, clock: list[float], ticks: int, containers: int) -> tuple[float, float]:
    """µs per container per tick: in steady state (values in place), and when every value is written."""
    hooks.reconciler.reconcile_once()  # first pass writes everything
    t0 = time.perf_counter()
    for _ in range(ticks):
        hooks.reconciler.reconcile_once()
    steady_us = (time.perf_counter() - t0) / ticks / containers * 1e6
    drift_total = 0.0
    for _ in range(ticks):
        clock[0] += FORCE_UPDATE_S  # the write cache expired: every value is written again, as after drift
        t0 = time.perf_counter()
        hooks.reconciler.reconcile_once()
        drift_total += time.perf_counter() - t0
    return steady_us, drift_total / ticks / containers * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--containers", type=int, default=50)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu").is_dir():
        print("needs root and cgroup v1 (cpu, memory)", file=sys.stderr)
        return 1

    tmp = Path(tempfile.mkdtemp(prefix="kpy-hookbench-"))
    cgroup_root = f"/koordlet-py-hookbench-{os.getpid()}"
    states = StaticStates(node=NodeInfo("bench"))
    config = RuntimeHooksConfig(socket_path=str(tmp / "koordlet.sock"), host_endpoint=str(tmp / "koordlet.sock"),
                                config_dir=str(tmp / "hookserver.d"), reconcile_interval_s=3600, feature_gates=GATES)
    clock = [time.monotonic()]  # the executor's: moved on to expire its write cache
    executor = ResourceExecutor(CgroupFS(), force_update_seconds=FORCE_UPDATE_S, clock=lambda: clock[0])
    hooks = RuntimeHooks(config, states, executor, KubeCgroupLayout(cgroup_root=cgroup_root))
    made: list[Path] = []
    try:
        hooks.start()
        samples = hook_round_trips(config.socket_path, cgroup_root, args.calls)
        states.set_pods(make_pods(cgroup_root, args.containers, made))
        steady_us, drift_us = reconcile_costs(hooks, clock, args.ticks, args.containers)
    finally:
        hooks.stop()
        for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
            path.rmdir()
        shutil.rmtree(tmp, ignore_errors=True)

    result = {"hook_p50_ms": round(percentile(samples, 50), 4), "hook_p99_ms": round(percentile(samples, 99), 4),
              "reconcile_us_per_container": round(steady_us, 1), "reconcile_write_us_per_container": round(drift_us, 1),
              "containers": args.containers}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"PreCreateContainerHook round trip ({args.calls} calls): p50 {result['hook_p50_ms']} ms, "
              f"p99 {result['hook_p99_ms']} ms")
        print(f"reconciler, {args.containers} BE containers: {result['reconcile_us_per_container']} us per container "
              f"per tick in steady state, {result['reconcile_write_us_per_container']} us when every value is written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
