"""What the ``/debug/pods`` records cost on the paths they sit on, side by side in one run (docs/operations.md):

1. the runtime hooks' reconciler pass over 150 BE pods (one container each, on a fixture cgroup v1 tree), without
   and with the records (its answers kept for pods with none yet; the plan runner's recent writes), interleaved;
2. one run of the hook plugins for a container (what the hook server and NRI do per creation), without and with a
   :class:`hooks.registry.Trace`.

Run as ``.venv/bin/python bench/debug_records.py [--passes N]``; prints medians and the difference.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hooks import registry  # noqa: E402
from hooks.protocol import ContainerContext, NodeContext  # noqa: E402
from koordlet.actuator import PlanRunner  # noqa: E402
from koordlet.api.pod import ContainerMeta, PodMeta  # noqa: E402
from koordlet.executor import ResourceExecutor  # noqa: E402
from koordlet.history.actions import RecentActions  # noqa: E402
from koordlet.history.answers import HookAnswers  # noqa: E402
from koordlet.runtimehooks.reconciler import Reconciler  # noqa: E402
from koordlet.system.cgroup import CgroupFS, CgroupVersion  # noqa: E402
from koordlet.system.kubepods import KubeCgroupLayout  # noqa: E402

SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
FILES = {"cpu": ("cpu.shares", "cpu.cfs_quota_us", "tasks", "cgroup.procs"), "memory": ("memory.limit_in_bytes",),
         "cpuset": ("cpuset.cpus",)}
GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True}


def fixture_pods(root: Path, count: int) -> list[PodMeta]:
    pods = []
    for index in range(count):
        uid, container_id = str(uuid.uuid4()), uuid.uuid4().hex * 2
        for controller, names in FILES.items():
            for rel in (f"kubepods/besteffort/pod{uid}", f"kubepods/besteffort/pod{uid}/{container_id}"):
                directory = root / controller / rel
                directory.mkdir(parents=True, exist_ok=True)
                for name in names:
                    (directory / name).write_text("-1\n" if "quota" in name or "limit" in name else "")
        pods.append(PodMeta(name=f"job-{index}", namespace="bench", uid=uid, labels={"koordinator.sh/qosClass": "BE"},
                            annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)},
                            cgroup_parent=f"/kubepods/besteffort/pod{uid}",
                            containers=(ContainerMeta("job", container_id),)))
    return pods


def reconciler(root: Path, pods: list[PodMeta], records: bool) -> Reconciler:
    executor = ResourceExecutor(CgroupFS(str(root), CgroupVersion.V1))
    plugins = registry.enabled(GATES)
    built = Reconciler(lambda: tuple(pods), NodeContext, lambda: plugins, executor, KubeCgroupLayout(),
                       answers=HookAnswers() if records else None)
    built._runner = PlanRunner(executor, actions=RecentActions() if records else None)
    built.reconcile_once()  # the first pass writes (and records); the passes measured are the steady ones
    return built


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=40)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kpy-bench-debug-"))
    try:
        pods = fixture_pods(root, 150)
        loops = {False: reconciler(root, pods, False), True: reconciler(root, pods, True)}
        passes: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.passes):
            for records, loop in loops.items():
                started = time.perf_counter()
                loop.reconcile_once()
                passes[records].append(time.perf_counter() - started)
        plugins, node = registry.enabled(GATES), NodeContext()
        context = ContainerContext(pod=pods[0], name="job")
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.passes):
            for traced in (False, True):
                started = time.perf_counter()
                for _ in range(1000):
                    registry.run_container(plugins, node, context, trace=registry.Trace() if traced else None)
                runs[traced].append((time.perf_counter() - started) / 1000)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    without, with_records = (statistics.median(passes[k]) * 1000 for k in (False, True))
    print(f"reconciler pass, 150 BE pods: {without:.2f} ms without the records, {with_records:.2f} ms with "
          f"({with_records - without:+.2f} ms, {with_records / without - 1:+.1%})")
    plain, traced = (statistics.median(runs[k]) * 1e6 for k in (False, True))
    print(f"plugins for one container ({len(plugins)} plugins): {plain:.1f} us without a trace, {traced:.1f} us "
          f"with ({traced - plain:+.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
