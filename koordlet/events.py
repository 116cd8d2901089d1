"""Kubernetes Events written by koordlet: one :class:`EventRecorder` per koordlet, as client-go's recorder.

What client-go's ``EventCorrelator`` does (kubernetes/client-go tools/record/events_cache.go), so a condition that
repeats does not become a stream of Events:

- **Aggregation.** An Event with the same involved object, type, reason, message and source as one sent in the last
  :data:`AGGREGATION_WINDOW_S` (10 minutes) is not created again: the existing Event's ``count`` goes up and its
  ``lastTimestamp`` moves on, in one PATCH.
- **Spam filter.** Each involved object gets a token bucket: :data:`SPAM_BURST` Events, then one per
  :data:`SPAM_REFILL_S` (client-go's defaults: 25, one per 5 minutes); what is over it is dropped (logged, counted).
- **Not again after a restart.** The Events sent in the last window are kept in a small file
  (``-system-config-record-file``'s dir, ``events-sent.json``; /var/run: a reboot forgets them). A koordlet
  that restarts and finds the same condition again (the same invalid NodeSLO, the same rejected annotation) sends
  nothing for it: the Event already says so. A repeat after that counts up as usual.

An Event is best effort: a failure, or the koordlet's API budget holding it back (the API server pushing back),
is logged and the Event dropped, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as _Urllib3Error

from koordlet.api.pod import PodMeta
from koordlet.kubeapi import CoreV1, KubeClient, Throttled
from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock
from wire.files import write_atomic

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)

UNREACHABLE = (_Urllib3Error, OSError)  # what an API server that cannot be reached raises

AGGREGATION_WINDOW_S = 600.0  # client-go: defaultAggregateIntervalInSeconds
SPAM_BURST = 25  # client-go: defaultSpamBurst
SPAM_REFILL_S = 300.0  # client-go: defaultSpamQPS = 1/300
MAX_ENTRIES = 4096  # client-go: maxLruCacheEntries
MAX_PERSISTED = 1024
MESSAGE_BYTES = 1024
EVENTS_FILE = "events-sent.json"


@dataclass(frozen=True, slots=True)
class InvolvedObject:
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def body(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}
        if self.namespace:
            out["namespace"] = self.namespace
        return out


@dataclass(slots=True)
class _Sent:
    """One Event on the server: its name and how often it was counted."""

    name: str
    namespace: str
    count: int
    first: str  # firstTimestamp
    last_at: float  # wall time of the last count
    restored: bool = False  # read from the file at start: the first repeat is the same condition found again


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records Events through ``core_api``; ``host`` is the source (this node), ``state_file`` where the Events
    sent lately are kept across a restart (None: memory only)."""

    def __init__(self, core_api: CoreV1, host: str, state_file: str | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = core_api
        self._host = host
        self._state_file = state_file
        self._clock = clock
        self._lock = threading.Lock()
        self._sent: OrderedDict[str, _Sent] = OrderedDict()  # LRU
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self.created = 0
        self.patched = 0
        self.dropped = 0
        self._load()

    # ------------------------------------------------------------------------------------------ record

    def record(self, involved: InvolvedObject, event_type: str, reason: str, message: str) -> None:
        message = message[:MESSAGE_BYTES]
        now = self._clock.time()
        key = json.dumps([involved.kind, involved.namespace, involved.name, involved.uid, event_type, reason, message,
                          self._host])
        with self._lock:
            sent = self._sent.get(key)
            if sent is not None and now - sent.last_at >= AGGREGATION_WINDOW_S:
                del self._sent[key]
                sent = None
            if sent is not None and sent.restored:
                sent.restored = False  # the condition the previous run already reported: nothing to send
                sent.last_at = now
                self._sent.move_to_end(key)
                return
            if not self._spam_allows(involved, now):
                self.dropped += 1
                logger.debug("event %s on %s %s dropped by the spam filter", reason, involved.kind, involved.name)
                return
        if sent is not None:
            self._count_up(key, sent, involved, reason, now)
        else:
            self._create(key, involved, event_type, reason, message, now)

    def _spam_allows(self, involved: InvolvedObject, now: float) -> bool:
        key = f"{involved.kind}/{involved.namespace}/{involved.name}/{involved.uid}"
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(SPAM_BURST), now)
            while len(self._buckets) > MAX_ENTRIES:
                self._buckets.popitem(last=False)
        bucket.tokens = min(float(SPAM_BURST), bucket.tokens + (now - bucket.at) / SPAM_REFILL_S)
        bucket.at = now
        self._buckets.move_to_end(key)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _create(self, key: str, involved: InvolvedObject, event_type: str, reason: str, message: str,
                now: float) -> None:
        namespace = involved.namespace or "default"
        stamp = _rfc3339(now)
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved.name}.", "namespace": namespace},
            "involvedObject": involved.body(),
            "type": event_type, "reason": reason, "message": message,
            "source": {"component": "koordlet", "host": self._host},
            "reportingComponent": "koordlet", "reportingInstance": self._host,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        created = self._send(reason, involved, lambda: self._api.create_namespaced_event(namespace, body))
        if not isinstance(created, dict):
            return
        name = str((created.get("metadata") or {}).get("name") or "")
        with self._lock:
            self.created += 1
            if name:
                self._sent[key] = _Sent(name, namespace, 1, stamp, now)
                self._sent.move_to_end(key)
                while len(self._sent) > MAX_ENTRIES:
                    self._sent.popitem(last=False)
        self._save()

    def _count_up(self, key: str, sent: _Sent, involved: InvolvedObject, reason: str, now: float) -> None:
        count = sent.count + 1
        patch = {"count": count, "lastTimestamp": _rfc3339(now)}
        try:
            answer = self._send(reason, involved,
                                lambda: self._api.patch_namespaced_event(sent.name, sent.namespace, patch),
                                missing_ok=True)
        except LookupError:  # the Event expired on the server (its TTL is an hour): a new one
            with self._lock:
                self._sent.pop(key, None)
            self._create(key, involved, *json.loads(key)[4:7], now)
            return
        if answer is None:
            return
        with self._lock:
            sent.count, sent.last_at = count, now
            self._sent.move_to_end(key)
            self.patched += 1
        self._save()

    def _send(self, reason: str, involved: InvolvedObject, call: Any, missing_ok: bool = False) -> Any:
        what = f"event {reason} on {involved.kind} {involved.namespace + '/' if involved.namespace else ''}" \
               f"{involved.name}"
        try:
            return call()
        except Throttled:
            logger.info("cannot record %s: the API server is pushing back", what)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                raise LookupError(what) from exc
            logger.warning("cannot record %s: %s %s", what, exc.status, exc.reason)
        except UNREACHABLE as exc:
            logger.warning("cannot record %s: API server unreachable: %s", what, exc)
        with self._lock:
            self.dropped += 1
        return None

    # ---------------------------------------------------------------------------------------- the file

    def _load(self) -> None:
        if not self._state_file:
            return
        try:
            with open(self._state_file, encoding="utf-8") as f:
                entries = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            logger.warning("events sent before the restart unreadable (%s): %s", self._state_file, err)
            return
        now = self._clock.time()
        for item in entries if isinstance(entries, list) else []:
            try:
                key, sent = str(item["key"]), _Sent(**item["sent"])
            except (KeyError, TypeError) as err:
                logger.warning("events file %s: skipping an entry: %s", self._state_file, err)
                continue
            if now - sent.last_at < AGGREGATION_WINDOW_S:
                sent.restored = True
                self._sent[key] = sent

    def _save(self) -> None:
        if not self._state_file:
            return
        now = self._clock.time()
        with self._lock:
            entries = [{"key": key, "sent": {**asdict(sent), "restored": False}}
                       for key, sent in self._sent.items() if now - sent.last_at < AGGREGATION_WINDOW_S]
        try:
            os.makedirs(os.path.dirname(self._state_file) or ".", exist_ok=True)
            write_atomic(self._state_file, json.dumps(entries[-MAX_PERSISTED:]), prefix=".events-")
        except OSError as err:
            logger.warning("cannot keep the events sent in %s: %s", self._state_file, err)


class PodEvents:
    """Events about pods, through the koordlet's :class:`EventRecorder`."""

    def __init__(self, node_name: str, api_client: KubeClient | ApiClient) -> None:
        client = api_client if isinstance(api_client, KubeClient) else KubeClient(api_client)
        self._recorder = client.event_recorder(node_name)

    def warning(self, pod: PodMeta, reason: str, message: str, uid: str | None = None) -> None:
        """A Warning Event on ``pod`` (``uid``: the live pod's, when known better than ``pod.uid``); failures
        are logged, never raised (an Event is best effort)."""
        self._recorder.record(InvolvedObject("Pod", pod.name, pod.namespace, uid or pod.uid), "Warning", reason,
                              message)
