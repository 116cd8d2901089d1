from __future__ import annotations

from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.statesinformer.api import CallbackKind, NodeInfo, StaticStates


def test_static_states_fire_callbacks_and_survive_a_failing_one() -> None:
    states = StaticStates()
    seen: list[str] = []

    def boom() -> None:
        raise RuntimeError("subscriber bug")

    states.register_callback(CallbackKind.ALL_PODS, "boom", boom)
    states.register_callback(CallbackKind.ALL_PODS, "record", lambda: seen.append("pods"))
    states.register_callback(CallbackKind.NODE_SLO_SPEC, "slo", lambda: seen.append("slo"))
    assert not states.has_synced()
    states.set_node(NodeInfo(name="n1", capacity={"cpu": 4000}))
    states.set_pods([PodMeta(name="p", namespace="default", uid="u1")])
    states.set_node_slo(default_node_slo_spec())
    assert seen == ["pods", "slo"]
    assert states.has_synced() and states.node().name == "n1" and states.pods()[0].uid == "u1"
