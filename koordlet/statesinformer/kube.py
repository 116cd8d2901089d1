"""The node and its NodeSLO from the API server: list + watch by name, with periodic resync (docs/koordinator.md §8.1).

One :class:`ObjectWatcher` per object: list with a field selector on ``metadata.name`` (the node is
cluster-scoped and so is NodeSLO, named after the node), hand the object (or its absence) over, then
watch from the list's resourceVersion with a server-side timeout equal to the resync period; when the
watch ends, list again (the resync). A failed list or watch (connection refused, 5xx, 410 Gone, a
watch ERROR event) is logged, counted and retried after a backoff that doubles up to a bound and is
reset by the next good list. Objects are handled as the JSON the server sent (no client models), so
fields newer than the client library survive.

:func:`stop` shuts the watch's socket down, so a stop never waits for the server's timeout.

NodeSLO handling (docs/koordinator.md §5.2): the spec is merged over the defaults
(:func:`parse_node_slo_spec`); an invalid one is rejected — the last good spec stays, the reason is logged
and counted, and a Warning Event ``InvalidNodeSLO`` is recorded on the Node (once per distinct error, not
once per resync). A deleted or absent NodeSLO means the defaults.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from koordlet.api.nodeslo import NodeSLOError, default_node_slo_spec, parse_node_slo_spec
from koordlet.api.quantity import QuantityError, parse_resource_quantity
from koordlet.api.safeload import load_json
from koordlet.kubeapi import MAX_API_BYTES, CoreV1, CustomObjects
from koordlet.statesinformer.api import SOURCE_APISERVER, SOURCE_DEFAULTS, NodeInfo, NodeSLOOrigin
from koordlet.statesinformer.nodeslo_file import NodeSLOSink
from koordlet.ticker import join_thread

logger = logging.getLogger(__name__)

SLO_GROUP, SLO_VERSION = "slo.koordinator.sh", "v1alpha1"
NODE_SLO_PLURAL, NODE_METRIC_PLURAL = "nodeslos", "nodemetrics"

Object = dict[str, Any]
ListCall = Callable[..., Any]


class WatchError(RuntimeError):
    """The watch stream reported an error (ERROR event, undecodable line)."""


class ObjectWatcher:
    """List + watch of one named object; calls ``on_object(obj)`` on every state (None = absent)."""

    def __init__(
        self,
        what: str,
        list_call: ListCall,
        name: str,
        on_object: Callable[[Object | None], None],
        resync_s: float = 300.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        count_error: Callable[[str], None] | None = None,
    ) -> None:
        self.what = what
        self._list_call = list_call
        self._selector = f"metadata.name={name}"
        self._on_object = on_object
        self._resync_s = resync_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._count_error = count_error or (lambda source: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response_lock = threading.Lock()
        self._response: urllib3.response.BaseHTTPResponse | None = None
        self.synced = threading.Event()
        self.lists = 0
        self.failures = 0

    def _list(self) -> str:
        response = self._list_call(field_selector=self._selector, _preload_content=False,
                                   _request_timeout=(5, 30))
        try:
            document = load_json(response.data, "list answer", max_bytes=MAX_API_BYTES)
        finally:
            response.release_conn()  # back to the pool, also when the answer is refused
        items = document.get("items") or []
        self.lists += 1
        self._on_object(items[0] if items else None)
        self.synced.set()
        return str((document.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, resource_version: str) -> None:
        response = self._list_call(
            field_selector=self._selector, watch=True, resource_version=resource_version or None,
            allow_watch_bookmarks=True, timeout_seconds=max(int(self._resync_s), 1), _preload_content=False,
            _request_timeout=(5, self._resync_s + 30),
        )
        with self._response_lock:
            self._response = response
        try:
            if self._stop.is_set():
                return
            for line in iter_resp_lines(response):
                if self._stop.is_set():
                    return
                try:
                    event = load_json(line, "watch event", max_bytes=MAX_API_BYTES)
                except ValueError as err:
                    raise WatchError(f"undecodable watch line: {line[:200]!r}") from err
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise WatchError(f"watch error: {obj.get('code')} {obj.get('message')}")
                if kind == "BOOKMARK":
                    continue
                self._on_object(None if kind == "DELETED" else obj)
        finally:
            with self._response_lock:
                self._response = None
            response.release_conn()

    def _loop(self) -> None:
        backoff = self._backoff_initial_s
        while not self._stop.is_set():
            try:
                resource_version = self._list()
                backoff = self._backoff_initial_s
                self._watch(resource_version)
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, WatchError) as err:
                if self._stop.is_set():
                    return
                self.failures += 1
                self._count_error(self.what)
                logger.warning("%s list/watch failed, retrying in %.1f s: %s", self.what, backoff,
                               str(err).splitlines()[0] if str(err) else type(err).__name__)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.what} watcher already started")
        self._thread = threading.Thread(target=self._loop, name=f"watch-{self.what}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        self._stop.set()
        with self._response_lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()  # wakes the blocked read at once
            except OSError as err:
                logger.debug("%s watch shutdown: %s", self.what, err)
        thread, self._thread = self._thread, None
        return join_thread(thread, f"{self.what} watcher", timeout_s)


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

    def __init__(self, node_name: str, sink: NodeSLOSink, core_api: CoreV1 | None = None,
                 node_uid: Callable[[], str] = lambda: "", event_namespace: str = "default") -> None:
        self._node_name = node_name
        self._sink = sink
        self._core = core_api
        self._node_uid = node_uid
        self._event_namespace = event_namespace
        self._last_error = ""
        self.events_recorded = 0

    def __call__(self, obj: Object | None) -> None:
        if obj is None:
            self._last_error = ""
            self._sink.set_node_slo(default_node_slo_spec(), NodeSLOOrigin(
                SOURCE_DEFAULTS, f"no NodeSLO object named {self._node_name}", at=time.time()))
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
            at=time.time()))

    def _record_event(self, message: str) -> None:
        if self._core is None:
            return
        now = datetime.now(UTC).replace(microsecond=0).isoformat()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{self._node_name}.", "namespace": self._event_namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self._node_name,
                               "uid": self._node_uid()},
            "reason": "InvalidNodeSLO", "message": message[:1024], "type": "Warning",
            "source": {"component": "koordlet", "host": self._node_name},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": "koordlet", "reportingInstance": self._node_name,
        }
        try:
            self._core.create_namespaced_event(self._event_namespace, body)
            self.events_recorded += 1
        except (ApiException, urllib3.exceptions.HTTPError) as err:
            logger.warning("cannot record the InvalidNodeSLO event: %s", err)


class KubeStates:
    """Node and NodeSLO watchers for one node, pushing into a states informer."""

    def __init__(self, node_name: str, core_api: CoreV1, custom_api: CustomObjects, informer: Any,
                 resync_s: float = 300.0, backoff_max_s: float = 30.0,
                 count_error: Callable[[str], None] | None = None) -> None:
        self.node_name = node_name
        self.raw_node: Object | None = None
        self.node_slo_handler = NodeSLOHandler(node_name, informer, core_api, lambda: self._node_uid())

        def on_node(obj: Object | None) -> None:
            if obj is None:
                logger.warning("node %s not found in the API server", node_name)
                return
            self.raw_node = obj
            informer.set_node(node_info_from_node(obj))

        self.node_watcher = ObjectWatcher("node", core_api.list_node, node_name, on_node, resync_s,
                                          backoff_max_s=backoff_max_s, count_error=count_error)

        def list_node_slos(**kwargs: Any) -> Any:
            return custom_api.list_cluster_custom_object(SLO_GROUP, SLO_VERSION, NODE_SLO_PLURAL, **kwargs)

        self.node_slo_watcher = ObjectWatcher("nodeslo", list_node_slos, node_name, self.node_slo_handler,
                                              resync_s, backoff_max_s=backoff_max_s, count_error=count_error)

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
