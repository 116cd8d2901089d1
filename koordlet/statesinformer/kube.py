"""The node and its NodeSLO from the API server: one reflector each, by name (docs/koordinator.md §8.1).

Each object has a :class:`koordlet.kubeclient.reflector.Reflector` (list at resourceVersion 0, then watch from the
last version or bookmark with a random 5–10 minute timeout, list again only on 410, back off with full jitter)
run by a thread of its own (``watch-node``, ``watch-nodeslo``). Node and NodeSLO are cluster-scoped and named
after the node, so each is selected with a ``metadata.name`` field selector. Objects are handled as the JSON the
server sent (no client models), so fields newer than the client library survive. A failed list or watch is
logged (once per streak) and counted.

NodeSLO handling (docs/koordinator.md §5.2): the spec is merged over the defaults
(:func:`parse_node_slo_spec`); an invalid one is rejected — the last good spec stays, the reason is logged
and counted, and a Warning Event ``InvalidNodeSLO`` is recorded on the Node (once per distinct error, and not again
by a koordlet that restarts and finds the same error: koordlet/events.py). A deleted or absent NodeSLO means the
defaults.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from koordlet.api.nodeslo import NodeSLOError, default_node_slo_spec, parse_node_slo_spec
from koordlet.api.quantity import QuantityError, parse_resource_quantity
from koordlet.events import EventRecorder, InvolvedObject
from koordlet.kubeapi import CoreV1, CustomObjects
from koordlet.kubeclient.backoff import Backoff
from koordlet.kubeclient.reflector import WATCH_TIMEOUT_S, Reflector, ReflectorThread
from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock
from koordlet.statesinformer.api import SOURCE_APISERVER, SOURCE_DEFAULTS, NodeInfo, NodeSLOOrigin
from koordlet.statesinformer.nodeslo_file import NodeSLOSink

logger = logging.getLogger(__name__)

SLO_GROUP, SLO_VERSION = "slo.koordinator.sh", "v1alpha1"
NODE_SLO_PLURAL, NODE_METRIC_PLURAL = "nodeslos", "nodemetrics"

Object = dict[str, Any]


def node_info_from_node(node: Mapping[str, Any]) -> NodeInfo:
    """A core/v1 Node (JSON) → NodeInfo; unparseable quantities are left out (and logged)."""
    metadata = node.get("metadata") or {}
    status = node.get("status") or {}

    def amounts(resources: Mapping[str, Any] | None) -> dict[str, int]:
        out = {}
        for resource, text in (resources or {}).items():
            try:
                out[resource] = parse_resource_quantity(resource, str(text))
            except QuantityError as err:
                logger.warning("node %s: ignoring %s: %s", metadata.get("name"), resource, err)
        return out

    return NodeInfo(
        name=metadata.get("name", ""),
        labels=dict(metadata.get("labels") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        capacity=amounts(status.get("capacity")),
        allocatable=amounts(status.get("allocatable")),
        kubelet_version=str((status.get("nodeInfo") or {}).get("kubeletVersion") or ""),
    )


class NodeSLOHandler:
    """Turns NodeSLO objects into merged specs for ``sink``; records an Event on the node for a bad one."""

    def __init__(self, node_name: str, sink: NodeSLOSink, events: EventRecorder | None = None,
                 node_uid: Callable[[], str] = lambda: "", clock: Clock = SYSTEM_CLOCK) -> None:
        self._node_name = node_name
        self._sink = sink
        self._events = events
        self._node_uid = node_uid
        self._clock = clock
        self._last_error = ""
        self.events_recorded = 0

    def __call__(self, obj: Object | None) -> None:
        if obj is None:
            self._last_error = ""
            self._sink.set_node_slo(default_node_slo_spec(), NodeSLOOrigin(
                SOURCE_DEFAULTS, f"no NodeSLO object named {self._node_name}", at=self._clock.time()))
            return
        try:
            spec = parse_node_slo_spec(obj.get("spec") or {})
        except NodeSLOError as err:
            self._sink.reject_node_slo(str(err))
            if str(err) != self._last_error:
                self._last_error = str(err)
                self._record_event(str(err))
            return
        self._last_error = ""
        metadata = obj.get("metadata") or {}
        self._sink.set_node_slo(spec, NodeSLOOrigin(
            SOURCE_APISERVER, f"{NODE_SLO_PLURAL}.{SLO_GROUP}/{metadata.get('name', '')}",
            name=str(metadata.get("name", "")), resource_version=str(metadata.get("resourceVersion", "")),
            at=self._clock.time()))

    def _record_event(self, message: str) -> None:
        if self._events is None:
            return
        self._events.record(InvolvedObject("Node", self._node_name, uid=self._node_uid()), "Warning",
                            "InvalidNodeSLO", message)
        self.events_recorded += 1


class KubeStates:
    """Node and NodeSLO reflectors for one node, pushing into a states informer. ``backoff_initial_s`` /
    ``backoff_max_s`` and ``watch_timeout_s`` are the reflectors' (tests shorten them)."""

    def __init__(self, node_name: str, core_api: CoreV1, custom_api: CustomObjects, informer: Any, *,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None,
                 backoff_initial_s: float = 0.8, backoff_max_s: float = 30.0,
                 watch_timeout_s: tuple[float, float] = WATCH_TIMEOUT_S,
                 count_error: Callable[[str], None] | None = None) -> None:
        self.node_name = node_name
        self.raw_node: Object | None = None
        rng = rng or random.Random()
        client = core_api.kube
        self.node_slo_handler = NodeSLOHandler(node_name, informer, client.event_recorder(node_name),
                                               lambda: self._node_uid(), clock)

        def on_node(obj: Object | None) -> None:
            if obj is None:
                logger.warning("node %s not found in the API server", node_name)
                return
            self.raw_node = obj
            informer.set_node(node_info_from_node(obj))

        core, custom = core_api.essential(), custom_api.essential()

        def list_node_slos(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(SLO_GROUP, SLO_VERSION, NODE_SLO_PLURAL, **kwargs)

        def reflector(what: str, list_call: Callable[..., Any],
                      on_object: Callable[[Object | None], None]) -> Reflector:
            return Reflector(what, list_call, node_name, on_object, client.budget, clock=clock, rng=rng,
                             backoff=Backoff(backoff_initial_s, backoff_max_s, rng), watch_timeout_s=watch_timeout_s,
                             count_error=count_error)

        self.node_reflector = reflector("node", core.list_node, on_node)
        self.node_slo_reflector = reflector("nodeslo", list_node_slos, self.node_slo_handler)
        self.node_watcher = ReflectorThread(self.node_reflector, "watch-node")
        self.node_slo_watcher = ReflectorThread(self.node_slo_reflector, "watch-nodeslo")

    def _node_uid(self) -> str:
        return str(((self.raw_node or {}).get("metadata") or {}).get("uid") or "")

    def start(self) -> None:
        self.node_watcher.start()
        self.node_slo_watcher.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Both watchers within ``timeout_s`` in all: the first gets half, the second what is left."""
        deadline = time.monotonic() + timeout_s
        stopped = self.node_slo_watcher.stop(timeout_s / 2)
        return self.node_watcher.stop(max(deadline - time.monotonic(), 0.0)) and stopped
