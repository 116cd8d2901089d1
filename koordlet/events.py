"""Kubernetes Events on pods, written by koordlet (a Warning when a pod's annotation could not be honoured)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as _Urllib3Error

from koordlet.api.pod import PodMeta
from koordlet.kubeapi import CoreV1

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)

UNREACHABLE = (_Urllib3Error, OSError)  # what an API server that cannot be reached raises


class PodEvents:
    """Writes Events about pods through the API server (``create`` on events, which koordlet's RBAC grants)."""

    def __init__(self, node_name: str, api_client: ApiClient) -> None:
        self._node_name = node_name
        self._api = CoreV1(api_client)

    def warning(self, pod: PodMeta, reason: str, message: str, uid: str | None = None) -> None:
        """One Warning Event on ``pod`` (``uid``: the live pod's, when known better than ``pod.uid``); failures
        are logged, never raised (an Event is best effort)."""
        now = datetime.now(UTC).isoformat()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace,
                               "uid": uid or pod.uid},
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "koordlet", "host": self._node_name},
            "reportingComponent": "koordlet",
            "reportingInstance": self._node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._api.create_namespaced_event(pod.namespace, event)
        except ApiException as exc:
            logger.warning("cannot record event %s on %s: %s %s", reason, pod.key, exc.status, exc.reason)
        except UNREACHABLE as exc:
            logger.warning("cannot record event %s on %s: API server unreachable: %s", reason, pod.key, exc)
