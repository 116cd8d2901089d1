"""kubelet's CPU manager checkpoint and config, as kubelet writes them (checksums from kubelet's own tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from koordlet.statesinformer.cpumanager import (
    CPUManagerStateError,
    CPUManagerStateReader,
    checkpoint_checksums,
    parse_cpu_manager_state,
    parse_kubelet_config,
)


def test_v2_checkpoints_with_kubelets_own_checksums() -> None:
    # kubernetes pkg/kubelet/cm/cpumanager/state/state_checkpoint_test.go
    empty = parse_cpu_manager_state('{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, '
                                    '"checksum": 354655845}')
    assert empty.policy == "none" and empty.default_cpuset == {4, 5, 6} and empty.assignments == ()
    state = parse_cpu_manager_state(json.dumps({
        "policyName": "none", "defaultCPUSet": "1-3",
        "entries": {"pod": {"container1": "4-6", "container2": "1-3"}}, "checksum": 3610638499}))
    by_name = {a.container_name: a for a in state.assignments}
    assert by_name["container1"].cpus == {4, 5, 6} and by_name["container1"].pod_uid == "pod"
    assert state.exclusive_cpus == {1, 2, 3, 4, 5, 6}


def test_a_static_checkpoint_round_trips_through_the_checksum() -> None:
    entries = {"uid-a": {"app": "2-3"}, "uid-b": {"db": "6,7"}}
    (checksum, *_) = sorted(checkpoint_checksums("static", "0-1,4-5", entries, True))
    state = parse_cpu_manager_state(json.dumps({"policyName": "static", "defaultCpuSet": "0-1,4-5",
                                                "entries": entries, "checksum": checksum}))
    assert state.policy == "static" and state.exclusive_cpus == {2, 3, 6, 7}


def test_v1_checkpoint_names_containers_by_id() -> None:
    state = parse_cpu_manager_state('{"policyName": "static", "defaultCpuSet": "0-1", '
                                    '"entries": {"abc123": "2-3"}, "checksum": 0}')
    (assignment,) = state.assignments
    assert assignment.container_id == "abc123" and assignment.cpus == {2, 3} and assignment.pod_uid == ""


@pytest.mark.parametrize("text,match", [
    ('{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": {"container1": "4-6", '
     '"container2": "1-2"}}, "checksum": 3610638499}', "checksum"),
    ("{", "not JSON"),
    ('{"defaultCPUSet": "1"}', "policyName"),
    ('{"policyName": "static", "defaultCpuSet": "0-x"}', "defaultCpuSet"),
    ('{"policyName": "static", "entries": {"a": "1", "b": {"c": "2"}}}', "mix"),
    ('{"policyName": "static", "entries": {"pod": {"c": 5}}}', "CPU list"),
    ("[" * 100 + "]" * 100, "nested"),
])
def test_bad_checkpoints_are_one_typed_error(text: str, match: str) -> None:
    with pytest.raises(CPUManagerStateError, match=match):
        parse_cpu_manager_state(text)


def test_kubelet_config_gives_options_and_reserved_cpus() -> None:
    policy, options, reserved = parse_kubelet_config(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\n"
        "cpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\nreservedSystemCPUs: \"0,4\"\n")
    assert (policy, options, reserved) == ("static", {"full-pcpus-only": "true"}, frozenset({0, 4}))
    with pytest.raises(CPUManagerStateError):
        parse_kubelet_config("a: &x 1\nb: *x\n")


def test_reader_rereads_on_change_and_reports_a_bad_file_without_failing(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    config = tmp_path / "kubelet.yaml"
    reader = CPUManagerStateReader(str(path), str(config))
    assert reader() is None  # no checkpoint: unknown
    path.write_text('{"policyName": "static", "defaultCpuSet": "0-1", "entries": {"u": {"c": "2"}}}')
    config.write_text("cpuManagerPolicy: static\ncpuManagerPolicyOptions: {full-pcpus-only: \"true\"}\n"
                      "reservedSystemCPUs: \"0\"\n")
    state = reader()
    assert state is not None and state.exclusive_cpus == {2} and state.reserved_cpus == {0}
    assert state.options == {"full-pcpus-only": "true"}
    assert reader() is state  # unchanged files: not read again
    errors = REGISTRY.get_sample_value("koordlet_kubelet_cpu_manager_state_errors_total") or 0.0
    path.write_text("{ corrupt")
    os.utime(path, ns=(1, 1))
    assert reader() is None
    assert REGISTRY.get_sample_value("koordlet_kubelet_cpu_manager_state_errors_total") == errors + 1
