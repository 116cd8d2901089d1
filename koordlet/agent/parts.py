"""The table of contents: every part of the agent in start order (docs/koordinator.md §1.2), each built by a
factory of the wiring module named after what it wires (koordlet/agent/wiring/). Read top to bottom it is the
start; the stop is the same list from the bottom up.

executor → metric cache → states informer (its node and NodeSLO sources first; then the NRI plugin, which needs
no pod list; then the wait until synced, bounded; PLEG) → GPU service → GPU device plugin → metrics advisor →
predict server → the components (default: qos manager, runtime hooks, network QoS) → reporters.
"""

from __future__ import annotations

from collections.abc import Sequence

from koordlet.agent.context import ComponentFactory, Part
from koordlet.agent.wiring.devices import device_plugin, gpu_service
from koordlet.agent.wiring.executor import executor
from koordlet.agent.wiring.extensions import extensions
from koordlet.agent.wiring.hooks import nri_plugin, runtime_hooks
from koordlet.agent.wiring.metricsadvisor import kidled_restore, metric_cache, metrics_advisor
from koordlet.agent.wiring.network import netqos, terway_qos
from koordlet.agent.wiring.nodestate import node_state_collector
from koordlet.agent.wiring.prediction import predict_server
from koordlet.agent.wiring.qos import qos_manager
from koordlet.agent.wiring.reporters import device_reporter, nodemetric_reporter, nrt_reporter
from koordlet.agent.wiring.states import (
    audit_owners,
    cri_pod_source,
    node_sources,
    pleg,
    pod_resources_proxy,
    states_informer,
    states_informer_built,
    states_synced,
)


def agent_parts(components: Sequence[ComponentFactory]) -> list[Part]:
    """Every part in start order (docs/koordinator.md §1.2).

    ``components`` go between the metrics advisor and the reporters."""
    return [
        Part("executor", executor),
        Part("metric cache", metric_cache),
        Part("extensions", extensions),
        Part("pod source", states_informer_built),
        Part("node and NodeSLO sources", node_sources),
        Part("CRI pod source", cri_pod_source),
        Part("states informer", states_informer),
        Part("audit owners", audit_owners),
        *([Part("NRI plugin", nri_plugin)] if runtime_hooks in components else []),
        Part("states sync", states_synced),
        Part("PLEG", pleg),
        Part("pod resources proxy", pod_resources_proxy),
        Part("GPU service", gpu_service),
        Part("device plugin", device_plugin),
        Part("kidled restore", kidled_restore),
        Part("metrics advisor", metrics_advisor),
        Part("predict server", predict_server),
        *(_component_part(factory) for factory in components),
        Part("node state collector", node_state_collector),
        Part("Device reporter", device_reporter),
        Part("NodeResourceTopology reporter", nrt_reporter),
        Part("NodeMetric reporter", nodemetric_reporter),
    ]


def default_components() -> list[ComponentFactory]:
    """Started after the states informer and metrics advisor, before the reporters, in this order
    (docs/koordinator.md §1.2: qos manager, then runtime hooks; then tc network QoS and Terway's QoS files
    when their gates are on)."""
    return [qos_manager, runtime_hooks, netqos, terway_qos]


def _component_part(factory: ComponentFactory) -> Part:
    return Part(getattr(factory, "__name__", type(factory).__name__).lstrip("_"), factory)
