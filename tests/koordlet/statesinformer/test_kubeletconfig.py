"""What kubelet's own memory QoS writes, from the KubeletConfiguration file (koordlet/statesinformer/kubeletconfig.py;
kubelet's /configz: test_kubelet.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.statesinformer.kubeletconfig import KubeletMemoryQoSSource


def test_the_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_last_answer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "kubelet-config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      "featureGates:\n  MemoryQoS: true\nmemoryThrottlingFactor: 0.8\n")
    version = ["v1.36.2"]
    source = KubeletMemoryQoSSource(str(config), None, lambda: version[0])
    first = source()
    assert (first.enabled, first.throttling_factor, first.reservation) == (True, 0.8, "None")
    config.write_text("featureGates:\n  MemoryQoS: true\nmemoryReservationPolicy: TieredReservation\n")
    second = source()
    assert (second.throttling_factor, second.reservation) == (0.9, "TieredReservation")  # 1.36's default factor
    version[0] = "v1.37.0"
    assert source().throttling_factor is None  # 1.37: no factor unless one is set
    config.write_text("memoryReservationPolicy: Everything\n")
    kept = source()
    assert kept.reservation == "TieredReservation"
    assert source() is kept  # unchanged file: not read again, not logged again
    assert sum("memoryReservationPolicy: expected" in r.getMessage() for r in caplog.records) == 1


def test_without_a_file_or_configz_kubelet_is_taken_to_write_nothing() -> None:
    got = KubeletMemoryQoSSource(None, None, lambda: "v1.37.0")()
    assert not got.enabled
