"""The wire contracts: stubs up to date, unknown fields survive, hook API field numbers."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

from tests.support.containerd import REPO
from wire import cri_pb2, hookapi_pb2


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    import sys

    subprocess.run(["bash", str(REPO / "scripts/gen-proto.sh"), str(tmp_path)], check=True, timeout=120,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    generated = sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__")
    # wire/ also holds hand-written modules (__init__, sockets); the stubs are its *_pb2* files.
    committed = sorted(p.name for p in (REPO / "wire").glob("*_pb2*") if p.suffix in (".py", ".pyi"))
    assert generated == committed, "run `make proto`"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, REPO / "wire", generated, shallow=False)
    assert not mismatch and not errors, f"stale stubs {mismatch}: run `make proto`"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, value: bytes | int) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 0:
        return key + _varint(value)  # type: ignore[arg-type]
    return key + _varint(len(value)) + value  # type: ignore[arg-type]


def test_unknown_fields_survive_decode_and_encode() -> None:
    # stop_signal (18) and CDI_devices (17) of newer CRI versions are not in our proto.
    config = _field(1, 2, _field(1, 2, b"app")) + _field(18, 0, 9) + _field(17, 2, _field(1, 2, b"vendor.com/gpu=0"))
    raw = _field(1, 2, b"sandbox-1") + _field(2, 2, config) + _field(4242, 0, 1)
    msg = cri_pb2.CreateContainerRequest.FromString(raw)
    assert msg.config.metadata.name == "app"
    msg.config.annotations["added"] = "by a hook"
    again = cri_pb2.CreateContainerRequest.FromString(msg.SerializeToString())
    assert again.config.annotations["added"] == "by a hook"
    assert _field(18, 0, 9) in again.config.SerializeToString()
    assert _field(4242, 0, 1) in again.SerializeToString()


def test_unknown_fields_of_a_pod_level_resize_survive_a_hook_change() -> None:
    """UpdatePodSandboxResources, as the proxy re-encodes it after a hook changed its resources: what a newer kubelet
    sends that our subset lacks (a field of the request, one of its resources) goes to the runtime unchanged."""
    resources = _field(3, 0, 1024) + _field(4, 0, 1 << 30) + _field(77, 2, b"future")
    raw = _field(1, 2, b"sandbox-1") + _field(3, 2, resources) + _field(9, 0, 5)
    msg = cri_pb2.UpdatePodSandboxResourcesRequest.FromString(raw)
    assert (msg.pod_sandbox_id, msg.resources.cpu_shares) == ("sandbox-1", 1024)
    msg.resources.cpu_quota = -1
    again = msg.SerializeToString()
    assert _field(9, 0, 5) in again and _field(77, 2, b"future") in again
    assert cri_pb2.UpdatePodSandboxResourcesRequest.FromString(again).resources.cpu_quota == -1


def test_hook_api_field_numbers_match_koordinator() -> None:
    # Encoded by hand from docs/koordinator.md §2.3, not with our own stubs.
    resources = _field(1, 0, 100000) + _field(2, 0, 50000) + _field(3, 0, 512) + _field(4, 0, 1 << 30) + \
        _field(6, 2, b"0-3") + _field(9, 2, _field(1, 2, b"memory.max") + _field(2, 2, b"max"))
    raw = (
        _field(1, 2, _field(1, 2, b"pod") + _field(2, 2, b"uid-1") + _field(3, 2, b"ns") + _field(4, 0, 2))
        + _field(2, 2, _field(1, 2, b"ctr") + _field(2, 0, 1) + _field(3, 2, b"cid"))
        + _field(3, 2, _field(1, 2, b"ca") + _field(2, 2, b"1"))
        + _field(4, 2, resources)
        + _field(6, 2, _field(1, 2, b"pa") + _field(2, 2, b"2"))
        + _field(7, 2, _field(1, 2, b"koordinator.sh/qosClass") + _field(2, 2, b"BE"))
        + _field(8, 2, b"/kubepods/besteffort/poduid-1")
        + _field(9, 2, _field(1, 2, b"ENV") + _field(2, 2, b"v"))
    )
    req = hookapi_pb2.ContainerResourceHookRequest.FromString(raw)
    meta = req.pod_meta
    assert (meta.name, meta.uid, meta.namespace, meta.attempt) == ("pod", "uid-1", "ns", 2)
    assert (req.container_meta.name, req.container_meta.attempt, req.container_meta.id) == ("ctr", 1, "cid")
    assert req.container_annotations == {"ca": "1"} and req.pod_annotations == {"pa": "2"}
    assert req.pod_labels == {"koordinator.sh/qosClass": "BE"}
    r = req.container_resources
    assert (r.cpu_period, r.cpu_quota, r.cpu_shares, r.memory_limit_in_bytes, r.cpuset_cpus) == \
        (100000, 50000, 512, 1 << 30, "0-3")
    assert r.unified == {"memory.max": "max"}
    assert req.pod_cgroup_parent == "/kubepods/besteffort/poduid-1" and req.container_envs == {"ENV": "v"}

    sandbox = hookapi_pb2.PodSandboxHookRequest.FromString(
        _field(2, 2, b"runc") + _field(3, 2, _field(1, 2, b"l") + _field(2, 2, b"v")) + _field(5, 2, b"/kubepods"))
    assert (sandbox.runtime_handler, sandbox.labels, sandbox.cgroup_parent) == ("runc", {"l": "v"}, "/kubepods")
    response = hookapi_pb2.ContainerResourceHookResponse(pod_cgroup_parent="/p", container_envs={"A": "b"})
    assert response.SerializeToString() == _field(3, 2, b"/p") + _field(4, 2, _field(1, 2, b"A") + _field(2, 2, b"b"))
