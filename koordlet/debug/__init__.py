"""What ``/debug/nodeslo``, ``/debug/pods/<namespace>/<name>`` and ``koordlet explain`` show, and who may see it.

- :mod:`.endpoints`: the two endpoints, built from what :mod:`koordlet.history` keeps (the plugins' answers, the
  runners' last writes and evictions) and from the states, the executor and the QoS manager;
- :mod:`.authz`: the guard of ``/events`` and ``/debug/*`` (TokenReview + SubjectAccessReview, or loopback only
  in local mode);
- :mod:`.explain`: ``koordlet explain <namespace>/<name>``, the same answer for a person.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordlet.debug.endpoints import DebugSources
    from koordlet.kubeapi import KubeClient
    from koordlet.metrics import MetricsServer

GUARDED = ("/events", "/debug")


def serve_debug(server: MetricsServer, sources: Callable[[], DebugSources | None],
                api_client: KubeClient | None, node_name: str) -> None:
    """The debug routes on the agent's metrics server, and the guard of ``/events`` and ``/debug/*``: the API
    server's TokenReview and SubjectAccessReview with an API server, the loopback address without one."""
    from koordlet.debug.authz import ApiAuthorizer, loopback_only
    from koordlet.debug.endpoints import NODESLO_PATH, PODS_PREFIX, DebugEndpoints
    from koordlet.kubeapi import AuthV1

    guard = ApiAuthorizer(AuthV1(api_client), node_name) if api_client is not None else loopback_only
    for prefix in GUARDED:
        server.guard(prefix, guard)
    endpoints = DebugEndpoints(sources)
    server.route(NODESLO_PATH, endpoints.nodeslo)
    server.route(PODS_PREFIX, endpoints.pod, prefix=True)
