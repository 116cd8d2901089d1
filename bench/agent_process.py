"""What the whole koordlet process costs on a node with N pods: the figure a DaemonSet's limits are set from.

``bench/agent_cost.py`` measures the metrics pipeline alone. This runs the real agent, ``koordlet
-local-mode`` with its default feature gates, against the project's private containerd holding N real
pods (one sandbox and one sleeping container each; a third of them BE, the rest LS burstable): the
states informer listing them over CRI, the collectors at 1 s, the QoS manager, the hook server and
its reconciler every 10 s, the Prometheus endpoint and the NodeMetric reporter. For each N it starts a
fresh koordlet, waits until its NodeMetric report lists all N pods, lets it settle, then reports

  rss_mib   resident set at the end          hwm_mib   peak resident set (VmHWM)
  cpu_pct   CPU time over wall time while measuring, in % of one core

A benchmark, not a test: needs root and cgroup v1; creates and removes its pods, stops containerd and
koordlet by PID, and removes its cgroup root. Roughly 1 s per pod to create and remove here.

    .venv/bin/python bench/agent_process.py [--counts 10,50,150] [--seconds 60] [--report-interval 60] [--json]

The NodeMetric report goes out at koordlet's default interval (60 s) and each run measures a whole interval, so that
every window holds one status; before 2026-12-07 the bench reported every 10 s and measured 30 s.

Before and after a change, side by side on the same pods (the machine's speed drifts by tens of percent
over minutes, so only an interleaved comparison says anything): ``--before DIR`` (or ``--base-tree DIR``, as
bench/nri.py spells it) runs the koordlet of the tree in DIR (e.g. ``git worktree add /tmp/before <commit>``) and
this tree's alternately, ``--rounds`` times each per count, in alternating order, and prints each one's runs and
medians, after/before at each count, and how each tree's CPU grows from one count to the next.

``--all-gates`` runs the koordlet with every feature gate on (``AllAlpha=true,AllBeta=true``), the audit log,
the pod-resources proxy and Terway's QoS files in the run's dir, ``-enable-resctrl-collector``, and a NodeSLO
asking for Terway's network QoS (so the tc manager leaves the host's uplink alone); ``--gates both`` measures
the default gates and every gate interleaved on the same pods (with ``--before``: both trees, both ways).
``--log-v both`` measures klog's ``-v=0`` and ``-v=4`` (what Koordinator's chart passes) the same way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
import yaml  # noqa: E402

from tests.support.containerd import REPO, Containerd  # noqa: E402
from tests.support.cri import CriClient, PodFactory  # noqa: E402
from wire import cri_pb2 as cri  # noqa: E402

NODE = "bench-node"
CGROUP_ROOT = "/koordlet-py-bench-agent"
CONTAINERD = Containerd("/run/koordlet-py/bench-agent/containerd", "/var/lib/koordlet-py/bench-agent/containerd",
                        cgroup_root=CGROUP_ROOT)
# koordlet's own -report-interval default: the NodeMetric status of every pod, built and written once a minute. The
# bench reported every 10 s before 2026-12-07 (to see the pods sooner): six times the status a node builds, which at
# 300 pods was a tenth of the agent's CPU. --report-interval 10 measures that way again.
REPORT_INTERVAL_S = 60


@dataclass(frozen=True, slots=True)
class Result:
    pods: int
    rss_mib: float
    hwm_mib: float
    cpu_pct: float
    seconds: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _pods_reported(report: Path) -> int:
    try:
        status = yaml.safe_load(report.read_text()).get("status", {})
    except (OSError, yaml.YAMLError, AttributeError):
        return 0
    return len(status.get("podsMetric") or [])


def _hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def add_pods(factory: PodFactory, start: int, stop: int) -> None:
    for index in range(start, stop):
        if index % 3 == 0:
            factory.start_pod(f"be-{index}", kube_qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
        else:
            factory.start_pod(f"ls-{index}", kube_qos="burstable", labels={"koordinator.sh/qosClass": "LS"},
                              resources=cri.LinuxContainerResources(cpu_shares=102, cpu_period=100000,
                                                                    cpu_quota=50000, memory_limit_in_bytes=64 << 20))


ALL_GATES_SLO = "resourceQOSStrategy: {policies: {netQOSPolicy: terway-qos}}\n"


def all_gates_args(run: Path) -> list[str]:
    """Every feature gate on, with the files of the gates that write some kept in the run's dir."""
    return ["-feature-gates=AllAlpha=true,AllBeta=true", f"-audit-log-dir={run / 'audit'}",
            f"-pod-resources-proxy-path={run / 'pod-resources'}", f"-terway-qos-dir={run / 'terway'}",
            "-enable-resctrl-collector"]


def measure(socket_path: str, count: int, seconds: float, workdir: Path, repo: Path = REPO,
            all_gates: bool = False, verbosity: int = 0, report_interval_s: int = REPORT_INTERVAL_S) -> Result:
    """The koordlet of ``repo`` (this tree by default) with ``count`` pods, in a fresh dir under ``workdir``;
    ``all_gates``: with every feature gate on; ``verbosity``: klog's -v (Koordinator's chart passes 4)."""
    run = Path(tempfile.mkdtemp(prefix=f"koordlet-{count}-", dir=workdir))
    (run / "hooks").mkdir(parents=True)
    (run / "sysfs").mkdir()
    slo = run / "nodeslo.yaml"
    slo.write_text(ALL_GATES_SLO if all_gates else "{}\n")
    port = _free_port()
    args = [
        sys.executable, "-m", "koordlet.main", "-local-mode", f"-node-slo-file={slo}",
        f"-cri-endpoint={socket_path}", f"-report-dir={run / 'reports'}", f"-report-interval={report_interval_s}s",
        "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}", "-sys-root-dir=/sys/",
        f"-sys-fs-root-dir={run / 'sysfs'}", f"-addr=127.0.0.1:{port}",
        f"-runtime-hooks-config-path={run / 'hooks'}", f"-runtime-hooks-addr={run / 'koordlet.sock'}",
        f"-runtime-hooks-host-endpoint={run / 'koordlet.sock'}",
        *(all_gates_args(run) if all_gates else []),
        *([f"-v={verbosity}"] if verbosity else []),
    ]
    if "prediction-checkpoint-filepath" in (repo / "koordlet/config.py").read_text():
        # a tree with the peak predictor and the system config record: theirs in the run dir
        args += [f"-prediction-checkpoint-filepath={run / 'prediction'}",
                 f"-system-config-record-file={run / 'system-config-originals.json'}"]
    env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(repo)}
    with open(run / "koordlet.log", "ab") as log:
        proc = subprocess.Popen(args, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60 + 2 * report_interval_s
        report = run / "reports" / f"nodemetric-{NODE}.yaml"
        while _pods_reported(report) < count or not _healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (run / "koordlet.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"koordlet never reported {count} pods (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        time.sleep(5.0)  # settle: first reconcile and QoS ticks over all pods
        agent = psutil.Process(proc.pid)
        before, started = agent.cpu_times(), time.monotonic()
        time.sleep(seconds)
        after, wall = agent.cpu_times(), time.monotonic() - started
        cpu_s = (after.user - before.user) + (after.system - before.system)
        return Result(count, agent.memory_info().rss / (1 << 20), _hwm_mib(proc.pid), 100.0 * cpu_s / wall, wall)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _interleaved(socket_path: str, count: int, args: argparse.Namespace, workdir: Path) -> dict[str, list[Result]]:
    gates = {"default": (False,), "all": (True,), "both": (False, True)}[args.gates]
    levels = {"0": (0,), "4": (4,), "both": (0, 4)}[args.log_v]
    sources = [("before", Path(args.before).resolve()), ("after", REPO)] if args.before else [("", REPO)]
    # Named by tree (with --before), by gates (with --gates both), by -v (with --log-v both): "before/all/v4".
    trees = [("/".join(n for n in (source, ("all" if all_gates else "default") if len(gates) > 1 else "",
                                   f"v{level}" if len(levels) > 1 else "") if n),
              tree, all_gates, level) for level in levels for all_gates in gates for source, tree in sources]
    runs: dict[str, list[Result]] = {name: [] for name, _, _, _ in trees}
    for round_ in range(args.rounds):
        for name, tree, all_gates, level in trees if round_ % 2 == 0 else trees[::-1]:
            result = measure(socket_path, count, args.seconds, workdir, tree, all_gates, level, args.report_interval)
            runs[name].append(result)
            if not args.json:
                print(f"# {count} pods, {name}: {result.rss_mib:.1f} MiB, {result.cpu_pct:.2f} %", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="10,50,150", help="pod counts, ascending, comma separated")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="measuring time per count (a whole report interval: one status in every window)")
    parser.add_argument("--report-interval", type=int, default=REPORT_INTERVAL_S,
                        help="koordlet's -report-interval in seconds (its default: 60)")
    parser.add_argument("--before", "--base-tree", dest="before",
                        help="a tree of an earlier commit, measured interleaved with this one")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree per count with --before")
    parser.add_argument("--json", action="store_true", help="print one JSON object keyed by count")
    parser.add_argument("--all-gates", dest="gates", action="store_const", const="all", default="default",
                        help="every feature gate on")
    parser.add_argument("--gates", choices=("default", "all", "both"), dest="gates",
                        help="default gates, every gate, or both interleaved")
    parser.add_argument("--log-v", choices=("0", "4", "both"), default="0",
                        help="klog's -v of the koordlet (Koordinator's chart: 4), or 0 and 4 interleaved")
    args = parser.parse_args(argv)
    counts = sorted(int(c) for c in args.counts.split(","))
    if os.geteuid() != 0:
        print("needs root (containerd, cgroups)", file=sys.stderr)
        return 2
    if args.before is not None and not (Path(args.before) / "koordlet" / "main.py").is_file():
        print(f"--before {args.before}: not a koordlet-py tree", file=sys.stderr)
        return 2
    results: dict[int, Result] = {}
    compared: dict[int, dict[str, list[Result]]] = {}
    client = factory = None
    with tempfile.TemporaryDirectory(prefix="kpy-agent-bench-") as tmp:
        try:
            socket_path = CONTAINERD.up()
            client = CriClient(socket_path)
            factory = PodFactory(client, cgroup_root=CGROUP_ROOT)
            made = 0
            for count in counts:
                started = time.monotonic()
                add_pods(factory, made, count)
                if not args.json:
                    print(f"# {count} pods up ({count - made} made in {time.monotonic() - started:.0f} s)",
                          file=sys.stderr)
                made = count
                if args.before is None and args.gates != "both" and args.log_v != "both":
                    results[count] = measure(socket_path, count, args.seconds, Path(tmp), all_gates=args.gates == "all",
                                             report_interval_s=args.report_interval,
                                             verbosity=int(args.log_v))
                else:
                    compared[count] = _interleaved(socket_path, count, args, Path(tmp))
        finally:
            if factory is not None:
                factory.cleanup()
            if client is not None:
                client.close()
            CONTAINERD.down()
            CONTAINERD.remove_dirs()
    if compared:
        return _print_compared(compared, args.json)
    if args.json:
        print(json.dumps({str(n): asdict(r) for n, r in results.items()}))
        return 0
    print(f"{'pods':>6} {'rss_mib':>8} {'hwm_mib':>8} {'cpu_pct':>8}")
    for count, r in results.items():
        print(f"{count:>6} {r.rss_mib:>8.1f} {r.hwm_mib:>8.1f} {r.cpu_pct:>8.2f}")
    print("anchor: Koordinator koordlet 341 MiB, 50 % of a core at 150 containers")
    return 0


def _print_compared(compared: dict[int, dict[str, list[Result]]], as_json: bool) -> int:
    summary = {
        str(count): {
            name: {"rss_mib_median": statistics.median(r.rss_mib for r in runs),
                   "cpu_pct_median": statistics.median(r.cpu_pct for r in runs),
                   "cpu_pct_runs": [round(r.cpu_pct, 2) for r in runs]}
            for name, runs in by_tree.items()
        }
        for count, by_tree in compared.items()
    }
    if as_json:
        print(json.dumps(summary))
        return 0
    print(f"{'pods':>6} {'tree':>14} {'rss_mib':>8} {'cpu_pct':>8}  runs")
    for count, by_tree in summary.items():
        for name, figures in by_tree.items():
            runs = " ".join(f"{c:.2f}" for c in figures["cpu_pct_runs"])
            print(f"{count:>6} {name:>14} {figures['rss_mib_median']:>8.1f} {figures['cpu_pct_median']:>8.2f}  {runs}")
        # CPU ratios of neighbours: after/before (per gate set with --before), else all/default.
        medians = [(name, figures["cpu_pct_median"]) for name, figures in by_tree.items()]
        for (first, before), (second, after) in zip(medians[::2], medians[1::2], strict=True):
            if before > 0:
                print(f"{count:>6} cpu {second}/{first} {after / before:.2f}")
    # How each tree's CPU grows with the pods: the median at each count over the one at the count before.
    counts = list(summary)
    for smaller, larger in itertools.pairwise(counts):
        for name, figures in summary[larger].items():
            base = summary[smaller][name]["cpu_pct_median"]
            if base > 0:
                print(f"{name or 'cpu'}: {larger}/{smaller} pods, cpu x{figures['cpu_pct_median'] / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
