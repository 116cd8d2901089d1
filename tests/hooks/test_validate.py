"""The one value check every hook answer passes (hooks/validate.py), on its own and through the plugins.

The property tests generate the annotations a buggy webhook or a hand edit could put on a pod (batch
resources of any size, any resource-status cpuset, QoS labels) and check that whatever the enabled plugins
answer, after the check, is a value the kernel and this node take.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooks import registry, validate
from hooks.protocol import Changes, ContainerContext, ContainerResources, NodeContext, PodContext
from koordlet.api.cpuset import parse_cpu_list
from koordlet.api.pod import PodMeta

NODE = NodeContext(online_cpus=frozenset({0, 1}), memory_bytes=8 << 30)
GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True, "GPUEnvInject": True,
         "CoreSched": True, "CPUNormalization": True, "Resctrl": True}
PLUGINS = registry.enabled(GATES)
COUNTS = {"cases": 0, "values_dropped": 0, "cases_with_a_drop": 0}


def _dropped(changes: Changes, **node_kw) -> list[str]:
    node = NodeContext(**{"online_cpus": NODE.online_cpus, "memory_bytes": NODE.memory_bytes, **node_kw})
    kept, rejected = validate.check(changes, node)
    for item in rejected:
        assert getattr(kept, item.key, None) is None or item.key.startswith("envs.")
    return [item.key for item in rejected]


@pytest.mark.parametrize("changes,dropped", [
    (Changes(cfs_quota_us=20_000_000_000_000), ["cfs_quota_us"]),  # batch-cpu 200000000000 milli
    (Changes(cfs_quota_us=200_001), ["cfs_quota_us"]),  # above 2 CPUs × 100 ms
    (Changes(cfs_quota_us=999), ["cfs_quota_us"]),
    (Changes(cfs_quota_us=-1), []),
    (Changes(cfs_quota_us=200_000), []),
    (Changes(cpuset_cpus="0-63"), ["cpuset_cpus"]),
    (Changes(cpuset_cpus="2"), ["cpuset_cpus"]),
    (Changes(cpuset_cpus="64"), ["cpuset_cpus"]),
    (Changes(cpuset_cpus="0-65535"), ["cpuset_cpus"]),
    (Changes(cpuset_cpus="1-0"), ["cpuset_cpus"]),
    (Changes(cpuset_cpus="0,x"), ["cpuset_cpus"]),
    (Changes(cpuset_cpus=""), []),  # follow the parent
    (Changes(cpuset_cpus="0-1"), []),
    (Changes(memory_limit_bytes=1), ["memory_limit_bytes"]),
    (Changes(memory_limit_bytes=4095), ["memory_limit_bytes"]),
    (Changes(memory_limit_bytes=(8 << 30) + 1), ["memory_limit_bytes"]),
    (Changes(memory_limit_bytes=-1), []),
    (Changes(cpu_shares=1), ["cpu_shares"]),
    (Changes(cpu_shares=262_145), ["cpu_shares"]),
    (Changes(bvt_warp_ns=3), ["bvt_warp_ns"]),
    (Changes(cpu_idle=2), ["cpu_idle"]),
    (Changes(resctrl_group="../../etc"), ["resctrl_group"]),
    (Changes(resctrl_schemata="L3:0=ff\nMB:0=\x00"), ["resctrl_schemata"]),
    (Changes(envs={"GOOD": "1", "1BAD": "x", "A=B": "y", "NUL": "a\x00b"}), ["envs.1BAD", "envs.A=B", "envs.NUL"]),
])
def test_values_outside_the_kernel_or_the_node_are_dropped(changes: Changes, dropped: list[str]) -> None:
    assert sorted(_dropped(changes)) == sorted(dropped)


def test_dropping_keeps_every_other_field() -> None:
    kept, rejected = validate.check(Changes(cpu_shares=512, cfs_quota_us=10**13, cpuset_cpus="0", envs={"9": "x",
                                                                                                     "OK": "y"}), NODE)
    assert kept == Changes(cpu_shares=512, cpuset_cpus="0", envs={"OK": "y"})
    assert [r.key for r in rejected] == ["cfs_quota_us", "envs.9"]


def test_a_childs_quota_never_goes_above_its_parents() -> None:
    reads: list[int] = []

    def parent() -> int:
        reads.append(1)
        return 148_635

    assert _dropped(Changes(cfs_quota_us=200_000)) == []
    kept, rejected = validate.check(Changes(cfs_quota_us=200_000), NODE, parent)
    assert kept.cfs_quota_us is None and "parent" in rejected[0].reason
    kept, rejected = validate.check(Changes(cfs_quota_us=100_000), NODE, parent)
    assert kept.cfs_quota_us == 100_000 and not rejected
    validate.check(Changes(cfs_quota_us=-1, cpu_shares=2), NODE, parent)
    assert len(reads) == 2  # read only when a limited quota is checked
    assert validate.check(Changes(cfs_quota_us=200_000), NODE, None)[0].cfs_quota_us == 200_000


def test_unknown_node_facts_are_not_checked() -> None:
    kept, rejected = validate.check(Changes(cpuset_cpus="0-63", memory_limit_bytes=1 << 40, cfs_quota_us=10**9),
                                    NodeContext())
    assert not rejected and kept.cpuset_cpus == "0-63"


# ------------------------------------------------------------------------------ property: through the plugins

_QUANTITY = st.one_of(
    st.integers(min_value=-10**15, max_value=10**15).map(str),
    st.sampled_from(["200000000000", "0", "-1", "1", "999", "1.5", "1e30", "64Mi", "1Ki", "1", "NaN", "", "x"]),
    st.text(max_size=12),
)
_RESOURCES = st.dictionaries(
    st.sampled_from(["kubernetes.io/batch-cpu", "kubernetes.io/batch-memory", "cpu", "memory"]), _QUANTITY, max_size=4)
_CPU_LIST = st.one_of(
    st.sampled_from(["0-63", "2", "64", "0-65535", "", "0", "1", "0-1", "1-0", "0,,1", "-1", "0-", "a"]),
    st.lists(st.integers(min_value=0, max_value=70000), max_size=6).map(lambda xs: ",".join(map(str, xs))),
    st.text(max_size=10),
)


@st.composite
def _pods(draw) -> tuple[PodMeta, str]:
    name = "job"
    spec = {"containers": {name: {"requests": draw(_RESOURCES), "limits": draw(_RESOURCES)}}}
    annotations = {"node.koordinator.sh/extended-resource-spec": json.dumps(spec)}
    if draw(st.booleans()):
        annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": draw(_CPU_LIST)})
    qos = draw(st.sampled_from(["BE", "LS", "LSR", "LSE", "SYSTEM", "bogus", None]))
    labels = {"koordinator.sh/qosClass": qos} if qos else {}
    return PodMeta(name="p", namespace="ns", uid="u", labels=labels, annotations=annotations,
                   cgroup_parent="/kubepods/besteffort/podu"), name


def _kernel_takes(changes: Changes) -> None:
    if changes.cpu_shares is not None:
        assert 2 <= changes.cpu_shares <= 262_144
    if changes.cfs_quota_us is not None:
        assert changes.cfs_quota_us == -1 or 1000 <= changes.cfs_quota_us <= 200_000
    if changes.cpuset_cpus:
        assert set(parse_cpu_list(changes.cpuset_cpus)) <= {0, 1}
    if changes.memory_limit_bytes is not None:
        assert changes.memory_limit_bytes == -1 or 4096 <= changes.memory_limit_bytes <= 8 << 30
    for key in changes.envs:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pods())
def _checked_answers_are_ones_the_kernel_takes(pod_and_name) -> None:
    pod, name = pod_and_name
    rejected: list[validate.Rejected] = []
    pod_changes = registry.run_pod(PLUGINS, NODE, PodContext(pod), lambda *a: None, rejected.extend)
    container = registry.run_container(
        PLUGINS, NODE, ContainerContext(pod, name, "cid", ContainerResources()), lambda *a: None, rejected.extend)
    _kernel_takes(pod_changes)
    _kernel_takes(container)
    COUNTS["cases"] += 1
    COUNTS["values_dropped"] += len(rejected)
    COUNTS["cases_with_a_drop"] += bool(rejected)


def test_whatever_the_annotations_the_checked_answer_is_one_the_kernel_takes() -> None:
    """400 generated pods through every plugin; the generator reaches the bad values (some are dropped), and the
    counts are printed for the record."""
    COUNTS.update(cases=0, values_dropped=0, cases_with_a_drop=0)
    _checked_answers_are_ones_the_kernel_takes()
    print(f"\nhook value fuzz: {COUNTS}")
    assert COUNTS["cases"] >= 100 and COUNTS["values_dropped"] > 0
