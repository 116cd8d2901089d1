"""The fleet bench: koordlet-py's own API client code for many nodes against the project's API server, beside a
reference client that does what Koordinator's koordlet (client-go) does, in one run, on virtual time.

What runs, per simulated node (koordlet-py): the Node and NodeSLO reflectors (koordlet/statesinformer/kube.py on
koordlet/kubeclient/reflector.py), the NodeMetric reporter (koordlet/reporters/nodemetric.py), the
NodeResourceTopology loop (reporters/nrt.py), the Device loop with gate ``Accelerators`` (reporters/device.py,
gpu/reporter.py), the evictor (koordlet/eviction.py) and its Events (koordlet/events.py), all through
koordlet/kubeapi.py and one API budget (koordlet/kubeclient/budget.py) per node; and the ``/debug`` guard
(koordlet/debug/authz.py) under a flood. The reference (bench/fleet_reference.py, written from Koordinator's and
client-go's code) runs the same scenarios on the same transport. What is not koordlet's code is the node's input:
a metric cache whose usage does not change, this host's CPU topology, a fixed GPU inventory, and the pods.

The server is tests/support/apiserver.py behind tests/support/fleetserver.py, in process: every request is
recorded (time, verb, resource, consistent read or not, bytes), watches are served from a 75 s watch-cache window
with bookmarks, and the scenarios' faults are injected there. Time is virtual (an event loop; every part takes a
clock), so 30 minutes of a fleet take a few minutes of CPU. Each scenario starts a fresh fleet whose nodes come up
at random times over a 10-minute warm-up (a fleet that has been running for a while), then measures a window:

- ``steady``: 30 minutes of nothing happening;
- ``restart``: every node's koordlet restarts at once (60 s into the window, back 2 s later);
- ``rolling``: a rolling update at the chart's ``maxUnavailable`` (20 %): that many nodes at a time are stopped,
  started 5-10 s later, and the next taken when one is back in sync (its watches open);
- ``apiserver-restart``: every watch cut, and every request answered 503 for 20 s;
- ``brownout``: 2 minutes of 60 % of requests answered 429 with ``Retry-After: 5`` and every watch cut every 10 s;
- ``watch-cache-lag``: every watch answered 410 for 1 minute;
- ``accelerators``: 10 steady minutes with gate ``Accelerators`` on (the Device reporters).

Background in every scenario: kubelet's node status update every 5 minutes per node (a Node watch sees it; not
counted as the agents' requests) and an eviction of a BE pod per node per hour (Poisson).

Figures per scenario and client, at N nodes and extrapolated to 5,000 nodes × 110 pods (printed with how):
requests per node per minute by verb; consistent reads per second; the steady mean μ and the peak requests in any
one second after the fleet is back to steady state, as a multiple of μ (and the peak during the re-sync); bytes per
second; the time from the end of the disturbance until every node is back to steady state (its watches open, and
for koordlet-py its budget normal again); for the brownout, its requests against what steady state sends in the
same window. ``--json`` prints the same figures.

    .venv/bin/python bench/fleet.py [--nodes 500] [--scenarios steady,restart,...] [--json] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import fleet_reference as ref  # noqa: E402
from koordlet.api.pod import PodMeta  # noqa: E402
from koordlet.debug.authz import ApiAuthorizer  # noqa: E402
from koordlet.events import EVENTS_FILE  # noqa: E402
from koordlet.eviction import Evictor  # noqa: E402
from koordlet.gpu.devicecr import build_device  # noqa: E402
from koordlet.gpu.health import GPUHealth  # noqa: E402
from koordlet.gpu.nvml import GPUInfo, GPUInventory  # noqa: E402
from koordlet.gpu.reporter import DeviceReporter  # noqa: E402
from koordlet.kubeapi import AuthV1, CoreV1, CustomObjects, KubeClient  # noqa: E402
from koordlet.kubeclient.budget import Budget, State  # noqa: E402
from koordlet.kubeclient.checkpoint import ApiCheckpoint  # noqa: E402
from koordlet.kubeclient.reflector import NextLine, Sleep  # noqa: E402
from koordlet.metriccache import Label, MetricCache, MetricKind, Sample, SeriesKey  # noqa: E402
from koordlet.metriccache.cache import Aggregate  # noqa: E402
from koordlet.metrics import Request  # noqa: E402
from koordlet.reporters.device import DeviceReportLoop  # noqa: E402
from koordlet.reporters.nodemetric import CollectPolicy, NodeMetricReporter, StatusBuilder  # noqa: E402
from koordlet.reporters.nrt import NRTReporter, NRTReportLoop, build_nrt  # noqa: E402
from koordlet.statesinformer.api import NodeInfo  # noqa: E402
from koordlet.statesinformer.kube import KubeStates  # noqa: E402
from koordlet.system.sysfs import NodeTopology, read_node_topology  # noqa: E402
from koordlet.ticker import TickerThread  # noqa: E402
from tests.deploy.koordinator_v1_8_0 import KOORDLET_ROLE_RULES  # noqa: E402
from tests.support.fleetserver import (  # noqa: E402
    EPOCH,
    EventLoop,
    FleetApiServer,
    FleetServer,
    InProcessApiClient,
    Timer,
    VirtualClock,
    copy_json_trees_fast,
)

OURS, REFERENCE = "koordlet-py", "Koordinator (reference)"
NAMESPACE = "koordinator-system"
# Who each client is to the API server: its DaemonSet's service account, with that chart's ClusterRole (ours:
# deploy/base/rbac.yaml; Koordinator's: its chart's koordlet-role, tests/deploy/koordinator_v1_8_0.py), and a
# static token of its (the server authenticates and authorizes every request where it does so).
ACCOUNTS = {OURS: "koordlet-py", REFERENCE: "koordlet"}
ADMIN_TOKEN = "fleet-bench-admin"  # kubelet's and the controllers' writes in the background
TARGET_NODES, TARGET_PODS = 5000, 110
WARMUP_S = 600.0
DISTURB_AT_S = 60.0  # into the window
KUBELET_STATUS_S = 300.0  # kubelet's nodeStatusReportFrequency
EVICTIONS_PER_NODE_HOUR = 1.0
# The NRT loop's local tick in the bench (koordlet: 3 s). It sends nothing while nothing changed, and after a restart
# its first tick sends nothing either (the API checkpoint stands in for the first read), so only the CPU differs.
NRT_TICK_S = 30.0
INVALID_NODESLO_SHARE = 0.05
MAX_UNAVAILABLE = 0.2  # deploy/chart/koordlet-py/values.yaml updateStrategy.rollingUpdate.maxUnavailable
SLO = ("slo.koordinator.sh", "v1alpha1")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    window_s: float
    fault_s: float = 0.0  # how long the disturbance lasts (0: an instant)
    accelerators: bool = False


SCENARIOS = {s.name: s for s in (
    Scenario("steady", 1800.0),
    Scenario("restart", 1200.0),
    Scenario("rolling", 1200.0),
    Scenario("apiserver-restart", 900.0, 20.0),
    Scenario("brownout", 900.0, 120.0),
    Scenario("watch-cache-lag", 900.0, 60.0),
    Scenario("accelerators", 600.0, accelerators=True),
)}


# ------------------------------------------------------------------------------------------------ drivers


class StepDriver:
    """Runs a loop written as a generator of Sleep / NextLine steps (koordlet.kubeclient.reflector) on the event
    loop: a Sleep is a timer, a NextLine reads the stream or waits for it."""

    def __init__(self, loop: EventLoop, steps: Generator[Any, Any, Any]) -> None:
        self._loop = loop
        self._steps = steps
        self._timer: Timer | None = None
        self.alive = True
        self._timer = loop.call_later(0.0, self._advance, None, None)

    def _advance(self, reply: Any, error: BaseException | None) -> None:
        while self.alive:
            try:
                step = self._steps.throw(error) if error is not None else self._steps.send(reply)
            except StopIteration:
                self.alive = False
                return
            reply, error = None, None
            if isinstance(step, Sleep):
                self._timer = self._loop.call_later(step.seconds, self._advance, None, None)
                return
            assert isinstance(step, NextLine)
            stream = step.response
            kind, value = stream.take()
            if kind == "wait":
                stream.wait(lambda stream=stream: self._advance_read(stream))
                return
            reply, error = (value, None) if kind == "line" else (None, value if kind == "cut" else None)

    def _advance_read(self, stream: Any) -> None:
        if not self.alive:
            return
        kind, value = stream.take()
        if kind == "wait":
            stream.wait(lambda: self._advance_read(stream))
            return
        self._advance(value if kind == "line" else None, value if kind == "cut" else None)

    def stop(self) -> None:
        self.alive = False
        if self._timer is not None:
            self._timer.cancel()
        self._steps.close()  # a watch open is released by the loop's own finally


class TimerDriver:
    """Runs a koordlet periodic loop (koordlet.ticker) without its thread: tick when due, at the time it returns."""

    def __init__(self, loop: EventLoop, ticker: TickerThread) -> None:
        self._loop = loop
        self._ticker = ticker
        self._timer = loop.call_at(ticker.schedule(), self._tick)

    def _tick(self) -> None:
        self._timer = self._loop.call_at(self._ticker.tick(self._loop.now), self._tick)

    def stop(self) -> None:
        self._timer.cancel()


# ------------------------------------------------------------------------------------------- the nodes' input


class SteadyCache(MetricCache):
    """A node whose usage does not change: every query answers the samples put in, whatever its window (the
    reporter's input, not the code under test)."""

    def query(self, key: SeriesKey, start: float, end: float) -> Aggregate | None:
        return super().query(key, -math.inf, math.inf)


def pods_of(count: int) -> list[PodMeta]:
    return [PodMeta(name=f"pod-{i:03d}", namespace="workload", uid=f"uid-{i:03d}",
                    labels={"koordinator.sh/qosClass": "BE" if i % 3 == 0 else "LS"}, priority=5500 if i % 3 == 0
                    else 9500, phase="Running") for i in range(count)]


def steady_cache(pods: Sequence[PodMeta]) -> SteadyCache:
    cache = SteadyCache()
    samples = []
    for t in range(0, 1801, 60):  # 30 minutes: every aggregate duration (5m, 10m, 30m) is covered
        stamp = EPOCH + t
        samples += [Sample(SeriesKey.of(MetricKind.NODE_CPU_USAGE), stamp, 6.5),
                    Sample(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), stamp, 48e9),
                    Sample(SeriesKey.of(MetricKind.SYS_CPU_USAGE), stamp, 0.4),
                    Sample(SeriesKey.of(MetricKind.SYS_MEMORY_USAGE), stamp, 2e9)]
        for pod in pods:
            samples += [Sample(SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: pod.uid}), stamp, 0.05),
                        Sample(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: pod.uid}), stamp, 4e8)]
    cache.append_samples(samples)
    return cache


def status_bytes(pods: int) -> int:
    """The size of a NodeMetric status with ``pods`` pods, as koordlet's StatusBuilder writes it."""
    status = StatusBuilder(steady_cache(pods_of(pods))).build(pods_of(pods), CollectPolicy(), EPOCH + 1800)
    return len(json.dumps(status))


class StaticGPUs:
    """Two GPUs that stay healthy: what koordlet.gpu.service.GPUService hands the Device loop (no NVML here)."""

    INVENTORY = GPUInventory("580.159.04", tuple(
        GPUInfo(i, f"GPU-{i:08d}-bench", i, "NVIDIA H100 80GB HBM3", 80 << 30, 0, f"0000:{0x18 + i:02x}:00.0", "")
        for i in range(2)))

    def device_object(self, node_name: str, node_uid: str = "", previous: Any = None) -> dict[str, Any]:
        return build_device(node_name, self.INVENTORY, {g.uuid: GPUHealth(g.uuid, True) for g in self.INVENTORY.gpus},
                            node_uid, previous)


class NodeStates:
    """What the states informer keeps of the Node and the NodeSLO (KubeStates hands them over)."""

    def __init__(self) -> None:
        self.node_info: NodeInfo | None = None
        self.rejected = 0

    def set_node(self, node: NodeInfo) -> None:
        self.node_info = node

    def set_node_slo(self, spec: Any, origin: Any) -> None:
        pass

    def reject_node_slo(self, reason: str) -> None:
        self.rejected += 1


# ----------------------------------------------------------------------------------------------- the clients


class OurNode:
    """One node's koordlet-py, its API-facing parts."""

    def __init__(self, sim: Sim, index: int) -> None:
        self.sim = sim
        self.index = index
        self.name = f"node-{index:05d}"
        self.starts = 0
        self._drivers: list[StepDriver | TimerDriver] = []
        self.kube: KubeStates | None = None
        self.budget: Budget | None = None
        self.evictor: Evictor | None = None

    def start(self) -> None:
        sim, clock = self.sim, self.sim.clock
        self.starts += 1
        rng = random.Random(f"{sim.seed}/{self.index}/{self.starts}")
        api = InProcessApiClient(sim.fleet, self.name, token=sim.token)
        self.budget = Budget(clock=clock, rng=rng, sleep=None)
        client = KubeClient(api, self.budget, events_file=str(sim.state_root / self.name / EVENTS_FILE), clock=clock)
        core, custom = CoreV1(client), CustomObjects(client)
        states = NodeStates()
        # the node's /var/run/koordlet, which a restart keeps (the DaemonSet's -api-checkpoint-file)
        (sim.state_root / self.name).mkdir(parents=True, exist_ok=True)
        checkpoint = ApiCheckpoint(str(sim.state_root / self.name / "api-checkpoint.json"), clock=clock)
        kube = self.kube = KubeStates(self.name, core, custom, states, clock=clock, rng=rng)
        loop = sim.loop
        self._drivers = [StepDriver(loop, kube.node_reflector.run()), StepDriver(loop, kube.node_slo_reflector.run())]
        reporter = NodeMetricReporter(self.name, sim.cache, lambda: sim.pods, custom_api=custom,
                                      wall_clock=clock.time, clock=clock, rng=rng, checkpoint=checkpoint)
        self._drivers.append(TimerDriver(loop, reporter.timer()))

        def node_uid() -> str:
            return str(((kube.raw_node or {}).get("metadata") or {}).get("uid") or "")

        nrt = NRTReportLoop(NRTReporter(self.name, custom), lambda: sim.topology, lambda: sim.pods, lambda: None,
                            node_annotations=lambda: dict(states.node_info.annotations) if states.node_info else {},
                            node_uid=node_uid, interval_s=NRT_TICK_S, monotonic=clock.monotonic, rng=rng,
                            checkpoint=checkpoint)
        self._drivers.append(TimerDriver(loop, nrt.timer))
        if sim.scenario.accelerators:
            device = DeviceReportLoop(StaticGPUs(), DeviceReporter(self.name, custom_api=custom, clock=clock, rng=rng),
                                      node_uid=node_uid, monotonic=clock.monotonic, rng=rng)  # type: ignore[arg-type]
            self._drivers.append(TimerDriver(loop, device.timer))
        self.evictor = Evictor(self.name, api_client=client, clock=clock.monotonic)

    def stop(self) -> None:
        for driver in self._drivers:
            driver.stop()
        self._drivers = []
        self.kube = None

    def whole(self) -> bool:
        kube, budget = self.kube, self.budget
        return (kube is not None and budget is not None and kube.node_reflector.watching
                and kube.node_slo_reflector.watching and budget.state is State.NORMAL)

    def evict(self, pod: dict[str, Any]) -> None:
        if self.evictor is None or self.kube is None:
            return
        meta = pod["metadata"]
        self.evictor.evict(PodMeta(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                                   labels=dict(meta.get("labels") or {}), phase="Running"),
                           "BEMemoryEvict", "node memory 93 % over the 70 % threshold")


class RefNode:
    """One node's Koordinator koordlet, as bench/fleet_reference.py models it."""

    def __init__(self, sim: Sim, index: int) -> None:
        self.sim = sim
        self.index = index
        self.name = f"node-{index:05d}"
        self.starts = 0
        self._drivers: list[StepDriver] = []
        self._informers: list[ref.Informer] = []
        self._rest: ref.RestClient | None = None

    def start(self) -> None:
        sim = self.sim
        self.starts += 1
        rng = random.Random(f"{sim.seed}/ref/{self.index}/{self.starts}")
        rest = self._rest = ref.RestClient(sim.fleet, self.name, token=sim.token)

        def now() -> float:
            return sim.loop.now

        def informer(path: str) -> ref.Informer:
            return ref.Informer(rest, path, self.name, now, rng)

        node, slo = informer("/api/v1/nodes"), informer("/apis/slo.koordinator.sh/v1alpha1/nodeslos")
        metric = informer("/apis/slo.koordinator.sh/v1alpha1/nodemetrics")
        nrt = informer("/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies")
        self._informers = [node, slo, metric, nrt]
        worker = ref.NodeMetricWorker(rest, self.name, [node, slo, metric], metric, sim.reference_status, now, rng)
        self._drivers = [StepDriver(sim.loop, i.run()) for i in self._informers]
        self._drivers.append(StepDriver(sim.loop, worker.run()))
        if sim.scenario.accelerators:
            self._drivers.append(StepDriver(sim.loop, ref.device_reporter(rest, self.name)))

    def stop(self) -> None:
        for driver in self._drivers:
            driver.stop()
        self._drivers = []
        self._rest = None

    def whole(self) -> bool:
        return bool(self._informers) and self._rest is not None and all(i.watching for i in self._informers)

    def evict(self, pod: dict[str, Any]) -> None:
        if self._rest is not None:
            StepDriver(self.sim.loop, ref.evict(self._rest, self.name, pod, self.sim.loop.now))


# --------------------------------------------------------------------------------------------- a simulation


class Sim:
    """One scenario for one client: a fresh API server and fleet on their own virtual time."""

    def __init__(self, client: str, scenario: Scenario, nodes: int, seed: int, pods: int, state_root: Path) -> None:
        self.client = client
        self.scenario = scenario
        self.seed = seed
        self.state_root = state_root
        self.rng = random.Random(f"{seed}/{client}/{scenario.name}")
        self.loop = EventLoop()
        self.clock = VirtualClock(self.loop)
        self.api = FleetApiServer()
        self.fleet = FleetServer(self.api, self.loop, random.Random(seed))
        self.pods = pods_of(pods)
        self.cache = steady_cache(self.pods)
        self.topology: NodeTopology = read_node_topology("/sys")
        self._status = StatusBuilder(self.cache).build(self.pods, CollectPolicy(), EPOCH)
        node_cls = OurNode if client == OURS else RefNode
        self.nodes = [node_cls(self, i) for i in range(nodes)]
        self._pods_of: dict[str, list[dict[str, Any]]] = {}
        self.token = self._seed_account(ACCOUNTS[client])
        self._seed_objects()

    def reference_status(self) -> dict[str, Any]:
        status = dict(self._status)
        status["updateTime"] = datetime.fromtimestamp(self.clock.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return status

    # ---- the cluster as koord-manager, kubelet and the scheduler leave it

    def _seed_account(self, name: str) -> str:
        """The client's service account, its ClusterRole and binding, and a token of it; the background's admin."""
        rules = KOORDLET_ROLE_RULES if self.client == REFERENCE else [
            doc for doc in yaml.safe_load_all((REPO / "deploy" / "base" / "rbac.yaml").read_text())
            if doc and doc["kind"] == "ClusterRole"][0]["rules"]
        self.api.seed({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name,
                                                                                "namespace": NAMESPACE}})
        self.api.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": name}, "rules": rules})
        self.api.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                       "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                               "kind": "ClusterRole", "name": name},
                       "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]})
        token = f"fleet-bench-{name}"
        self.api.add_token(token, f"system:serviceaccount:{NAMESPACE}:{name}",
                           ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"))
        self.api.add_token(ADMIN_TOKEN, "kubernetes-admin", ("system:masters",))
        return token

    def _seed_objects(self) -> None:
        for node in self.nodes:
            name = node.name
            stored = self.api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name}}, "status": {"capacity": {"cpu": "96", "memory": "384Gi"},
                                                             "allocatable": {"cpu": "94", "memory": "370Gi"}}})
            spec: dict[str, Any] = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}
            if self.rng.random() < INVALID_NODESLO_SHARE:  # koord-manager pushed a bad config to some nodes
                spec = {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"catRangeStartPercent": 80,
                                                                            "catRangeEndPercent": 20}}}}
            self.api.seed({"apiVersion": f"{SLO[0]}/{SLO[1]}", "kind": "NodeSLO", "metadata": {"name": name},
                           "spec": spec})
            self.api.seed({"apiVersion": f"{SLO[0]}/{SLO[1]}", "kind": "NodeMetric", "metadata": {"name": name},
                           "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300,
                                                            "reportIntervalSeconds": 60}}})
            nrt = build_nrt(name, self.topology, _pools(self.topology), None, {}, stored["metadata"]["uid"])
            self.api.seed(nrt)
            self._pods_of[name] = [self._seed_pod(name, k) for k in range(2)]

    def _seed_pod(self, node: str, k: int) -> dict[str, Any]:
        return self.api.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"be-{node}-{k}-{self.rng.randrange(1 << 30):x}", "namespace": "batch",
            "labels": {"koordinator.sh/qosClass": "BE"}},
            "spec": {"nodeName": node, "containers": [{"name": "job", "image": "busybox"}]},
            "status": {"phase": "Running"}})

    def _kubelet_status(self, index: int) -> None:
        name = self.nodes[index].name
        stamp = datetime.fromtimestamp(self.clock.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                            "lastHeartbeatTime": stamp, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        self.api.handle("PATCH", f"/api/v1/nodes/{name}/status", "application/merge-patch+json",
                        json.dumps(patch).encode(), {"Authorization": f"Bearer {ADMIN_TOKEN}"})
        self.loop.call_later(KUBELET_STATUS_S, self._kubelet_status, index)

    def _eviction(self, index: int) -> None:
        node = self.nodes[index]
        pods = self._pods_of[node.name]
        victim = pods.pop(0)
        node.evict(victim)
        pods.append(self._seed_pod(node.name, 0))  # its controller makes another
        self.loop.call_later(self.rng.expovariate(EVICTIONS_PER_NODE_HOUR / 3600.0), self._eviction, index)

    # ---- the run

    def run(self) -> Run:
        for index, node in enumerate(self.nodes):
            self.loop.call_at(self.rng.uniform(0.0, WARMUP_S), node.start)
            self.loop.call_at(self.rng.uniform(0.0, KUBELET_STATUS_S), self._kubelet_status, index)
            self.loop.call_at(WARMUP_S + self.rng.expovariate(EVICTIONS_PER_NODE_HOUR / 3600.0), self._eviction,
                              index)
        start = WARMUP_S
        self.loop.run_until(start)
        self.fleet.records.clear()
        self.fleet.watch_bytes.clear()
        run = Run(self.client, self.scenario.name, len(self.nodes), start, start + self.scenario.window_s)
        if self.scenario.name not in ("steady", "accelerators"):
            disturb = start + DISTURB_AT_S
            self.loop.call_at(disturb, self._disturb, run)
            self.loop.call_at(disturb, self._sample, run)
        started = time.monotonic()
        self.loop.run_until(run.end)
        run.cpu_s = time.monotonic() - started
        run.records = [r for r in self.fleet.records if r.at < run.end]
        run.watch_bytes = dict(self.fleet.watch_bytes)
        run.peak_watches = max(self.fleet.peak_watches.values(), default=0)
        for node in self.nodes:
            node.stop()
        self.api.stop()
        return run

    def _disturb(self, run: Run) -> None:
        name, now = self.scenario.name, self.loop.now
        run.disturbed = (now, now + self.scenario.fault_s)
        fleet = self.fleet
        if name == "restart":
            for node in self.nodes:
                node.stop()
                self.loop.call_later(2.0, node.start)
        elif name == "rolling":
            order = list(self.nodes)
            self.rng.shuffle(order)
            run.disturbed = (now, math.inf)  # until the rollout ends
            for _ in range(max(1, math.ceil(MAX_UNAVAILABLE * len(order)))):
                self._roll_next(order, run)
        elif name == "apiserver-restart":
            fleet.cut_watches()
            fleet.unavailable = True
            self.loop.call_later(self.scenario.fault_s, setattr, fleet, "unavailable", False)
        elif name == "brownout":
            fleet.reject_fraction, fleet.retry_after_s = 0.6, 5
            for k in range(1, int(self.scenario.fault_s // 10)):
                self.loop.call_later(10.0 * k, fleet.cut_watches)
            self.loop.call_later(self.scenario.fault_s, setattr, fleet, "reject_fraction", 0.0)
        elif name == "watch-cache-lag":
            fleet.watch_gone = True
            self.loop.call_later(self.scenario.fault_s, setattr, fleet, "watch_gone", False)

    def _roll_next(self, order: list[OurNode | RefNode], run: Run) -> None:
        if not order:
            run.rolled += 1
            if run.rolled == max(1, math.ceil(MAX_UNAVAILABLE * len(self.nodes))):
                run.disturbed = (run.disturbed[0], self.loop.now)  # the last slot is done: the rollout ended
            return
        node = order.pop()
        node.stop()
        self.loop.call_later(self.rng.uniform(5.0, 10.0), self._rolled_start, node, order, run)

    def _rolled_start(self, node: OurNode | RefNode, order: list[OurNode | RefNode], run: Run) -> None:
        node.start()
        self.loop.call_later(1.0, self._ready, node, order, run, 0)

    def _ready(self, node: OurNode | RefNode, order: list[OurNode | RefNode], run: Run, waited: int) -> None:
        if node.whole() or waited >= 300:  # the DaemonSet controller moves on when the new pod is ready
            self._roll_next(order, run)
            return
        self.loop.call_later(1.0, self._ready, node, order, run, waited + 1)

    def _sample(self, run: Run) -> None:
        """Each second: is every node back to steady state? The first such second after the disturbance ended."""
        now = self.loop.now
        if run.back_at is None and now >= run.disturbed[1] and all(node.whole() for node in self.nodes):
            run.back_at = now
        if run.back_at is None:
            self.loop.call_later(1.0, self._sample, run)


def _pools(topology: NodeTopology) -> Any:
    from koordlet.api.cpupools import compute_cpu_pools

    return compute_cpu_pools(topology.cpus, [])


# ------------------------------------------------------------------------------------------------ the figures


@dataclass(slots=True)
class Run:
    client: str
    scenario: str
    nodes: int
    start: float
    end: float
    disturbed: tuple[float, float] = (math.inf, math.inf)
    back_at: float | None = None
    rolled: int = 0
    cpu_s: float = 0.0
    records: list[Any] = field(default_factory=list)
    watch_bytes: dict[int, int] = field(default_factory=dict)
    peak_watches: int = 0


@dataclass(slots=True)
class Figures:
    scenario: str
    client: str
    nodes: int
    window_s: float
    requests_per_node_min: dict[str, float]  # by verb, and "all"
    requests_by_resource: dict[str, int]
    consistent_reads_per_s: float  # at 5,000 nodes
    mean_per_s: float  # at N nodes
    steady_mean_per_s: float  # μ at N nodes (the steady scenario's)
    peak_after_per_s: int | None  # the most requests in one second after the fleet is back to steady
    peak_after_ratio: float | None  # that, in μ
    peak_after_ratio_at_target: float | None  # the same at 5,000 nodes for a spread fleet: k-second windows, in μ
    resync_peak_ratio: float | None  # the most in one second from the disturbance until back to steady, in μ
    bytes_per_s: float  # at 5,000 nodes × 110 pods
    back_to_steady_s: float | None  # from the end of the disturbance; None: not within the window
    disturbance_requests_ratio: float | None  # requests during the disturbance / μ × its length
    watches_per_node: int  # the most watches one node held open at once
    connections_per_node: int
    cpu_s: float


def figures(run: Run, steady_mean: float | None, extra_status_bytes: int) -> Figures:
    window = run.end - run.start
    records = [r for r in run.records if run.start <= r.at < run.end]
    scale = TARGET_NODES / run.nodes
    by_verb = Counter(r.verb for r in records)
    per_node_min = {verb: round(count / run.nodes / (window / 60), 3) for verb, count in sorted(by_verb.items())}
    per_node_min["all"] = round(len(records) / run.nodes / (window / 60), 3)
    mean = len(records) / window
    mu = steady_mean if steady_mean is not None else mean
    bins = Counter(int(r.at) for r in records)
    d0, d1 = run.disturbed
    back_to_steady = None if run.back_at is None else run.back_at - min(d1, run.back_at)
    settled = run.back_at if run.back_at is not None else math.inf
    if d0 == math.inf:  # steady: no disturbance, everything counts
        settled, d0 = run.start, run.start
    after = [bins.get(s, 0) for s in range(int(settled), int(run.end))]
    # At TARGET_NODES: k = TARGET / N times the nodes put into one second what these N nodes put into k seconds,
    # wherever the fleet's rate does not change within k seconds (a spread fleet's); a phase-locked burst of one
    # second keeps its measured ratio instead (every node in the same second, at any size).
    k = max(1, round(TARGET_NODES / run.nodes))
    windows = [sum(after[i:i + k]) for i in range(max(0, len(after) - k + 1))]
    resync = [bins.get(s, 0) for s in range(int(d0), int(min(settled, run.end)))]
    status_puts = sum(1 for r in records if r.resource == "nodemetrics/status" and r.verb == "update")
    bytes_total = sum(r.bytes_in + r.bytes_out for r in records) + sum(
        b for s, b in run.watch_bytes.items() if run.start <= s < run.end)
    bytes_total += status_puts * 2 * extra_status_bytes  # the status's 110 pods: in the PUT and its answer
    if run.client == REFERENCE:  # and in the NodeMetric watch event each write sends back to the reference
        bytes_total += status_puts * extra_status_bytes
    disturbance_ratio = None
    if run.scenario == "brownout" and d1 > d0:
        inside = sum(1 for r in records if d0 <= r.at < d1)
        disturbance_ratio = round(inside / (mu * (d1 - d0)), 2)
    return Figures(
        scenario=run.scenario, client=run.client, nodes=run.nodes, window_s=window,
        requests_per_node_min=per_node_min,
        requests_by_resource=dict(sorted(Counter(f"{r.verb} {r.resource}" for r in records).items())),
        consistent_reads_per_s=round(sum(r.consistent for r in records) / window * scale, 3),
        mean_per_s=round(mean, 3), steady_mean_per_s=round(mu, 3),
        peak_after_per_s=max(after) if after else None,
        peak_after_ratio=round(max(after) / mu, 2) if after and mu else None,
        peak_after_ratio_at_target=round(max(windows) / (k * mu), 2) if windows and mu else None,
        resync_peak_ratio=round(max(resync) / mu, 2) if resync and mu else None,
        bytes_per_s=round(bytes_total / window * scale),
        back_to_steady_s=None if back_to_steady is None else round(back_to_steady, 1),
        disturbance_requests_ratio=disturbance_ratio,
        watches_per_node=run.peak_watches,
        connections_per_node=run.peak_watches + 1 if run.client == OURS else 1,
        cpu_s=round(run.cpu_s, 1))


# ------------------------------------------------------------------------------------- the /debug guard flood


def debug_flood(tokens: int = 10_000, seconds: float = 100.0) -> dict[str, Any]:
    """One node's /debug guard on virtual time: ``tokens`` random bearer tokens over ``seconds`` while an allowed
    user who was reading before keeps reading every second; what reached the API server."""
    loop = EventLoop()
    clock = VirtualClock(loop)
    api = FleetApiServer()
    fleet = FleetServer(api, loop)
    api.add_token("operator-token", "operator", ("system:authenticated",))
    api.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "debug"},
              "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]})
    api.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
              "metadata": {"name": "debug"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                          "kind": "ClusterRole", "name": "debug"},
              "subjects": [{"kind": "User", "name": "operator"}]})
    rules = [doc for doc in yaml.safe_load_all((REPO / "deploy" / "base" / "rbac.yaml").read_text())
             if doc and doc["kind"] == "ClusterRole"][0]["rules"]
    api.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "koordlet"},
              "rules": rules})
    api.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
              "metadata": {"name": "koordlet"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                             "kind": "ClusterRole", "name": "koordlet"},
              "subjects": [{"kind": "ServiceAccount", "name": "koordlet-py", "namespace": NAMESPACE}]})
    api.add_token("koordlet-token", f"system:serviceaccount:{NAMESPACE}:koordlet-py",
                  ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"))
    budget = Budget(clock=clock, sleep=None)
    guard = ApiAuthorizer(AuthV1(KubeClient(InProcessApiClient(fleet, "node-00000", token="koordlet-token"), budget,
                                            clock=clock)), "node-00000", clock=clock.monotonic)
    answers: Counter[int] = Counter()
    served = []

    def ask(token: str) -> int:
        reply = guard(Request("/debug/nodeslo", {}, {"Authorization": f"Bearer {token}"}, "192.0.2.9"))
        return 200 if reply is None else reply.status

    served.append(ask("operator-token"))  # the operator was reading before the flood began
    for i in range(tokens):
        loop.call_at(seconds * i / tokens, lambda: answers.update([ask(secrets.token_urlsafe(24))]))
    for s in range(int(seconds)):
        loop.call_at(s + 0.5, lambda: served.append(ask("operator-token")))
    loop.run_until(seconds + 1)
    reviews = Counter(r.resource for r in fleet.records)
    return {"random_tokens": tokens, "seconds": seconds, "answers": dict(sorted(answers.items())),
            "token_reviews": reviews.get("tokenreviews", 0),
            "access_reviews": reviews.get("subjectaccessreviews", 0),
            "allowed_user_requests": len(served), "allowed_user_served": served.count(200)}


# ----------------------------------------------------------------------------------------------------- output

_VERBS = ("get", "list", "watch", "create", "update", "patch")


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}{unit}"


def table(results: list[Figures]) -> str:
    head = ("| scenario | client | req/node/min (get · list · watch · create · update · patch) | consistent reads/s "
            "@5k | peak 1 s after / μ (@5k, spread) | re-sync peak / μ | MB/s @5k×110 | back to steady | "
            "brownout req / steady |")
    lines = [head, "|" + "---|" * 9]
    for f in results:
        verbs = " · ".join(f"{f.requests_per_node_min.get(v, 0):.2f}" for v in _VERBS)
        lines.append(
            f"| {f.scenario} | {f.client} | **{f.requests_per_node_min['all']:.2f}** ({verbs}) | "
            f"{f.consistent_reads_per_s:.1f} | {_fmt(f.peak_after_ratio, '×', 2)} "
            f"({_fmt(f.peak_after_ratio_at_target, '×', 2)}) | {_fmt(f.resync_peak_ratio, '×', 1)}"
            f" | {f.bytes_per_s / 1e6:.2f} | {_fmt(f.back_to_steady_s, ' s', 0)} | "
            f"{_fmt(f.disturbance_requests_ratio, '×', 2)} |")
    return "\n".join(lines)


def how(nodes: int, pods: int, extra: int) -> str:
    return (f"Measured with {nodes} simulated nodes whose NodeMetric status lists {pods} pods. To {TARGET_NODES} "
            f"nodes × {TARGET_PODS} pods: requests per node per minute as measured; consistent reads and bytes per "
            f"second × {TARGET_NODES / nodes:g} (every node's requests are its own); each NodeMetric status write "
            f"carries {extra} bytes more at {TARGET_PODS} pods (StatusBuilder's status measured at both sizes), "
            f"counted in the PUT, its answer and, for the reference, its watch event. μ is the steady scenario's "
            f"mean at {nodes} nodes; peaks are in μ: a fleet {TARGET_NODES / nodes:g}× larger keeps a phase-locked "
            f"peak's ratio, and lowers a spread one's towards its mean (a count's noise grows as √μ), so the ratios "
            f"measured here are upper bounds of a spread fleet's. In brackets, a spread fleet's at {TARGET_NODES} "
            f"nodes: the busiest {round(TARGET_NODES / nodes)} s window here (what {round(TARGET_NODES / nodes)}× "
            f"the nodes send in one second, where the rate does not change within that window), over that many μ; "
            f"for a phase-locked burst (every node in one second) the bracket understates, and the measured ratio "
            f"before it is the one that holds.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=10, help="pods in each simulated node's NodeMetric status")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--clients", default="ours,reference")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-debug-flood", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--log-level", default="ERROR", help="of koordlet's loggers (thousands of nodes log)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    copy_json_trees_fast()
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}: pick from {', '.join(SCENARIOS)}")
    clients = [{"ours": OURS, "reference": REFERENCE}[c] for c in args.clients.split(",")]
    if "steady" not in names:
        names.insert(0, "steady")  # μ, the steady mean every peak is measured against
    extra = status_bytes(TARGET_PODS) - status_bytes(args.pods)
    state_root = Path(tempfile.mkdtemp(prefix="kpy-fleet-"))
    results: list[Figures] = []
    try:
        for client in clients:
            mu: float | None = None
            for name in names:
                sim = Sim(client, SCENARIOS[name], args.nodes, args.seed, args.pods, state_root / client.split()[0])
                run = sim.run()
                # the accelerators scenario is a steady state of its own (another gate on): its peaks in its own mean
                result = figures(run, None if SCENARIOS[name].accelerators else mu, extra)
                if name == "steady":
                    mu = result.mean_per_s
                results.append(result)
                if not args.json:
                    print(f"  {client:24} {name:18} done: {len(run.records)} requests, {result.cpu_s:.0f} s of CPU",
                          file=sys.stderr)
    finally:
        shutil.rmtree(state_root, ignore_errors=True)
    order = {name: i for i, name in enumerate(SCENARIOS)}
    results.sort(key=lambda f: (order[f.scenario], clients.index(f.client)))
    flood = None if args.no_debug_flood else debug_flood()
    if args.json:
        print(json.dumps({"nodes": args.nodes, "pods": args.pods, "target": {"nodes": TARGET_NODES,
                                                                              "pods": TARGET_PODS},
                          "how": how(args.nodes, args.pods, extra), "results": [asdict(f) for f in results],
                          "debug_flood": flood}, indent=1))
        return 0
    print(table(results))
    print()
    print(how(args.nodes, args.pods, extra))
    ours = [f for f in results if f.client == OURS]
    if ours:
        print(f"Connections per node (koordlet-py, HTTP/1.1 keep-alive): at most "
              f"{max(f.connections_per_node for f in ours)} in use at once ({max(f.watches_per_node for f in ours)} "
              f"watches + 1), pool bounded at 4; the reference is one HTTP/2 connection.")
    if flood is not None:
        print(f"/debug guard, {flood['random_tokens']} random tokens in {flood['seconds']:.0f} s: "
              f"{flood['token_reviews']} TokenReviews and {flood['access_reviews']} SubjectAccessReviews sent; answers "
              f"{flood['answers']}; the allowed user served {flood['allowed_user_served']} of "
              f"{flood['allowed_user_requests']}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
