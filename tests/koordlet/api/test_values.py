"""CPU lists, quantities, QoS/priority mapping and the pod view."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordlet.api.cpuset import CPUListError, format_cpu_list, parse_cpu_list
from koordlet.api.keys import (
    LABEL_PRIORITY_CLASS,
    LABEL_QOS_CLASS,
    LABEL_SKIP_HOOKSERVER,
    RESOURCE_BATCH_CPU,
    RESOURCE_DEPRECATED_BATCH_MEMORY,
    canonical_resource_name,
)
from koordlet.api.pod import ContainerMeta, PodMeta, runtime_for_pod, split_container_id
from koordlet.api.qos import (
    KubeQoS,
    PriorityClass,
    QoSClass,
    kube_qos_from_cgroup_parent,
    parse_kube_qos,
    priority_class_for_pod,
    qos_class_for_pod,
    qos_class_from_labels,
    skips_hooks,
)
from koordlet.api.quantity import QuantityError, parse_quantity, parse_quantity_milli, parse_resource_quantity


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8", (0, 1, 2, 3, 8)), ("0-3,8\n", (0, 1, 2, 3, 8)), ("", ()), ("5", (5,)), ("3,1,2,1", (1, 2, 3))],
)
def test_parse_cpu_list_accepts_kernel_format(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "a", "1-", "-1", "1,,2", "0-99999999999", "1 2", "²"])
def test_parse_cpu_list_rejects_junk(text: str) -> None:
    with pytest.raises(CPUListError):
        parse_cpu_list(text)


def test_format_cpu_list_compacts_ranges() -> None:
    assert format_cpu_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert format_cpu_list([]) == ""


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_cpu_list_round_trips(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == tuple(sorted(cpus))


@pytest.mark.parametrize(
    ("text", "value", "milli"),
    [
        ("2Gi", 2 * 1024**3, 2 * 1024**3 * 1000),
        ("500m", 1, 500),
        ("1000", 1000, 1000000),
        ("1.5", 2, 1500),
        ("1e3", 1000, 1000000),
        ("10M", 10_000_000, 10_000_000_000),
        ("0.1", 1, 100),
    ],
)
def test_quantities_parse_like_apimachinery(text: str, value: int, milli: int) -> None:
    assert parse_quantity(text) == value
    assert parse_quantity_milli(text) == milli


def test_cpu_quantities_are_milli_cores_other_resources_base_units() -> None:
    assert parse_resource_quantity("cpu", "4") == 4000
    assert parse_resource_quantity(RESOURCE_BATCH_CPU, "1000") == 1000
    assert parse_resource_quantity("memory", "8Gi") == 8 * 1024**3


@pytest.mark.parametrize("text", ["", "Gi", "1Xi", "1e", "1e99", "--1", "1 Gi", "9" * 40])
def test_bad_quantities_raise_quantity_error(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_quantity_parser_never_crashes_otherwise(text: str) -> None:
    try:
        parse_quantity(text)
    except QuantityError:
        pass


def test_deprecated_resource_names_map_to_current() -> None:
    assert canonical_resource_name(RESOURCE_DEPRECATED_BATCH_MEMORY) == "kubernetes.io/batch-memory"
    assert canonical_resource_name("cpu") == "cpu"


def test_qos_label_wins_over_kube_qos() -> None:
    assert qos_class_for_pod({LABEL_QOS_CLASS: "BE"}, KubeQoS.GUARANTEED) is QoSClass.BE


@pytest.mark.parametrize(
    ("kube_qos", "qos"),
    [(KubeQoS.GUARANTEED, QoSClass.LSR), (KubeQoS.BURSTABLE, QoSClass.LS), (KubeQoS.BESTEFFORT, QoSClass.BE)],
)
def test_qos_derived_from_kube_qos_when_label_absent(kube_qos: KubeQoS, qos: QoSClass) -> None:
    assert qos_class_for_pod({}, kube_qos) is qos


def test_unknown_qos_label_is_none() -> None:
    assert qos_class_from_labels({LABEL_QOS_CLASS: "gold"}) is QoSClass.NONE
    assert qos_class_for_pod({LABEL_QOS_CLASS: "gold"}, None) is QoSClass.NONE


@pytest.mark.parametrize(
    ("parent", "kube_qos"),
    [
        ("/kubepods/besteffort/pod1", KubeQoS.BESTEFFORT),
        ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice", KubeQoS.BURSTABLE),
        ("kubepods-besteffort-pod1_2.slice", KubeQoS.BESTEFFORT),
        ("/kubepods/pod1", KubeQoS.GUARANTEED),
        ("/koordlet-py/kubepods/burstable/pod1", KubeQoS.BURSTABLE),
    ],
)
def test_kube_qos_from_cgroup_parent_by_substring(parent: str, kube_qos: KubeQoS) -> None:
    assert kube_qos_from_cgroup_parent(parent) is kube_qos


def test_parse_kube_qos_unknown_is_none() -> None:
    assert parse_kube_qos("BestEffort") is KubeQoS.BESTEFFORT
    assert parse_kube_qos("") is None


@pytest.mark.parametrize(
    ("labels", "priority", "qos", "expected"),
    [
        ({LABEL_PRIORITY_CLASS: "koord-batch"}, 9500, QoSClass.LS, PriorityClass.BATCH),
        ({}, 7100, QoSClass.LS, PriorityClass.MID),
        ({}, 3999, QoSClass.NONE, PriorityClass.FREE),
        ({}, None, QoSClass.BE, PriorityClass.BATCH),
        ({}, None, QoSClass.LSR, PriorityClass.PROD),
        ({}, 0, QoSClass.SYSTEM, PriorityClass.PROD),
        ({}, None, QoSClass.NONE, PriorityClass.NONE),
    ],
)
def test_priority_class_label_then_priority_then_qos(
    labels: dict[str, str], priority: int | None, qos: QoSClass, expected: PriorityClass
) -> None:
    assert priority_class_for_pod(labels, priority, qos) is expected


def test_skip_hookserver_needs_exact_true() -> None:
    assert skips_hooks({LABEL_SKIP_HOOKSERVER: "true"})
    assert not skips_hooks({LABEL_SKIP_HOOKSERVER: "True"})
    assert not skips_hooks({})


def test_pod_meta_derives_kube_qos_and_qos_from_cgroup_parent() -> None:
    pod = PodMeta(
        name="web",
        namespace="default",
        uid="1234-abcd",
        cgroup_parent="/kubepods/burstable/pod1234-abcd",
        containers=(ContainerMeta(name="app", container_id="abc", requests={"cpu": 500}),),
    )
    assert pod.effective_kube_qos is KubeQoS.BURSTABLE
    assert pod.qos_class is QoSClass.LS
    assert pod.qos_label is QoSClass.NONE
    assert pod.priority_class is PriorityClass.PROD
    assert pod.container("app") is not None and pod.container("app").requests["cpu"] == 500
    assert pod.container("missing") is None
    assert pod.key == "default/web"


def test_container_id_prefix_split_and_docker_runtime() -> None:
    assert split_container_id("containerd://abc") == ("containerd", "abc")
    assert split_container_id("abc") == ("containerd", "abc")
    assert runtime_for_pod({"io.kubernetes.docker.type": "podsandbox"}) == "docker"
    assert runtime_for_pod({}) == "containerd"
