"""What the states informer offers the rest of koordlet: the node, its NodeSLO and its pods.

The hook server, the reconciler, the metrics collectors and the QoS strategies depend on this
protocol only, never on where the states come from (API server + kubelet, CRI + a NodeSLO file,
or a test). Callbacks run after the states changed, outside any lock, on the informer's thread;
they must be quick or hand work off.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from koordlet.api.nodeslo import NodeSLOSpec, default_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.statesinformer.enacted import EnactedResources

log = logging.getLogger(__name__)


class CallbackKind(enum.StrEnum):
    NODE_SLO_SPEC = "NodeSLOSpec"
    ALL_PODS = "AllPods"
    NODE_METADATA = "NodeMetadata"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The node as koordlet needs it. Amounts in Koordinator units: cpu and batch-cpu in milli-cores,
    memory and batch-memory in bytes (koordlet.api.quantity.parse_resource_quantity)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    kubelet_version: str = ""  # status.nodeInfo.kubeletVersion ("" when not known: local mode)


@dataclass(frozen=True, slots=True)
class NodeSLOOrigin:
    """Where the NodeSLO in effect came from (``/debug/nodeslo``): ``source`` is ``apiserver`` (the object
    ``name`` at ``resource_version``), ``file`` (``path``, the first hex digits of its content's sha256 in
    ``detail``) or ``defaults`` (``detail`` says why: no object, no file, nothing received yet); ``at`` is the
    wall-clock time it was taken."""

    source: str
    detail: str = ""
    name: str = ""
    resource_version: str = ""
    path: str = ""
    at: float = 0.0


SOURCE_APISERVER, SOURCE_FILE, SOURCE_DEFAULTS = "apiserver", "file", "defaults"
NOT_RECEIVED = NodeSLOOrigin(SOURCE_DEFAULTS, "no NodeSLO received yet")


class StatesProvider(Protocol):
    # what kubelet set with UpdateContainerResources, over the pods until their status reports it (enacted.py)
    enacted: EnactedResources

    def node(self) -> NodeInfo | None: ...

    def node_slo(self) -> NodeSLOSpec: ...

    def pods(self) -> tuple[PodMeta, ...]: ...

    def register_callback(self, kind: CallbackKind, name: str, fn: Callable[[], None]) -> None: ...

    def has_synced(self) -> bool: ...

    def request_resync(self, follow_up_s: float = 0.0) -> None:
        """Read the pods again now (something changed that the next poll would only see later)."""


class Callbacks:
    """Registered callbacks by kind; a failing callback is logged and the others still run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[CallbackKind, list[tuple[str, Callable[[], None]]]] = {k: [] for k in CallbackKind}

    def register(self, kind: CallbackKind, name: str, fn: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks[kind].append((name, fn))

    def fire(self, kind: CallbackKind) -> None:
        with self._lock:
            callbacks = list(self._callbacks[kind])
        for name, fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one faulty subscriber must not starve the others
                log.exception("%s callback %s failed", kind.value, name)


class StaticStates:
    """A StatesProvider whose states are set by its owner (tests, and sources that push states)."""

    def __init__(self, node: NodeInfo | None = None, node_slo: NodeSLOSpec | None = None,
                 pods: tuple[PodMeta, ...] = ()) -> None:
        self._node = node
        self._node_slo = node_slo or default_node_slo_spec()
        self._pods = tuple(pods)
        self._synced = node is not None
        self._callbacks = Callbacks()
        self.enacted = EnactedResources()

    def node(self) -> NodeInfo | None:
        return self._node

    def node_slo(self) -> NodeSLOSpec:
        return self._node_slo

    def pods(self) -> tuple[PodMeta, ...]:
        return self.enacted.apply(self._pods)

    def has_synced(self) -> bool:
        return self._synced

    def register_callback(self, kind: CallbackKind, name: str, fn: Callable[[], None]) -> None:
        self._callbacks.register(kind, name, fn)

    def request_resync(self, follow_up_s: float = 0.0) -> None:
        """Nothing to read again: the owner pushes the states."""

    def set_node(self, node: NodeInfo) -> None:
        self._node = node
        self._synced = True
        self._callbacks.fire(CallbackKind.NODE_METADATA)

    def set_node_slo(self, spec: NodeSLOSpec, origin: NodeSLOOrigin | None = None) -> None:
        self._node_slo = spec
        self._callbacks.fire(CallbackKind.NODE_SLO_SPEC)

    def set_pods(self, pods: tuple[PodMeta, ...] | list[PodMeta]) -> None:
        self._pods = tuple(pods)
        self._callbacks.fire(CallbackKind.ALL_PODS)
