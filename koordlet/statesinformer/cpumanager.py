"""kubelet's CPU manager state (``/var/lib/kubelet/cpu_manager_state``), as the koordlet models it.

The shapes here are shared by the NodeResourceTopology reporter (which reports the policy and the exclusive
assignments in Koordinator's annotations) and by the cpuset hook and CPU suppress (which never give kubelet's
exclusive CPUs to BE or shared-pool pods).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from prometheus_client import Counter

from koordlet.api.cpuset import CPUListError, parse_cpu_list
from koordlet.api.safeload import MAX_DOCUMENT_BYTES, SafeLoadError, load_json, load_yaml

logger = logging.getLogger(__name__)

STATE_ERRORS = Counter("koordlet_kubelet_cpu_manager_state_errors",
                       "kubelet CPU manager checkpoints (or kubelet configs) that could not be used")

POLICY_NONE = "none"
POLICY_STATIC = "static"


@dataclass(frozen=True, slots=True)
class CPUAssignment:
    """CPUs kubelet's static policy gave one container exclusively.

    The v2 checkpoint names the pod by UID and the container by name; the v1 checkpoint (kubelet before 1.18)
    names only the container ID (then ``pod_uid`` and ``container_name`` are empty).
    """

    cpus: frozenset[int]
    pod_uid: str = ""
    container_name: str = ""
    container_id: str = ""


@dataclass(frozen=True, slots=True)
class CPUManagerState:
    """What kubelet's CPU manager holds: its policy, options, reserved CPUs, shared pool and exclusive CPUs."""

    policy: str = POLICY_NONE
    options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: frozenset[int] = frozenset()
    default_cpuset: frozenset[int] = frozenset()
    assignments: tuple[CPUAssignment, ...] = ()

    @property
    def exclusive_cpus(self) -> frozenset[int]:
        """Every CPU kubelet assigned to a container exclusively (never for BE or shared pools)."""
        out: set[int] = set()
        for assignment in self.assignments:
            out |= assignment.cpus
        return frozenset(out)


# ----------------------------------------------------------------------------------------------- reading

MAX_STATE_BYTES = 4 << 20


class CPUManagerStateError(ValueError):
    """The checkpoint (or kubelet config) cannot be used; the message names the file and why."""


def _fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _go_dump(type_name: str, policy: str, default: str, entries: object, entries_type: str) -> str:
    """What kubelet hashes: its checkpoint struct (checksum zeroed) printed the way k8s.io/apimachinery's
    dump.ForHash prints it (spew: types, sorted map keys, no pointer addresses)."""
    if entries is None:
        shown = "<nil>"
    else:
        assert isinstance(entries, dict)
        parts = []
        for key in sorted(entries):
            value = entries[key]
            if isinstance(value, dict):
                inner = " ".join(f"{name}:{value[name]}" for name in sorted(value))
                parts.append(f"{key}:map[{inner}]")
            else:
                parts.append(f"{key}:{value}")
        shown = "map[" + " ".join(parts) + "]"
    return (f"(*state.{type_name}){{PolicyName:(string){policy} DefaultCPUSet:(string){default} "
            f"Entries:({entries_type}){shown} Checksum:(checksum.Checksum)0}}")


def checkpoint_checksums(policy: str, default: str, entries: object, v2: bool) -> set[int]:
    """Every checksum a kubelet may have written for this content: the struct hashed under its legacy name
    (``CPUManagerCheckpoint``, what kubelet writes and checks since 1.18) and under its versioned name."""
    entries_type = "map[string]map[string]string" if v2 else "map[string]string"
    names = ("CPUManagerCheckpoint", "CPUManagerCheckpointV2" if v2 else "CPUManagerCheckpointV1")
    return {_fnv32a(_go_dump(name, policy, default, entries, entries_type).encode()) for name in names}


def _field(doc: dict, name: str) -> object:
    """A JSON field as Go's encoding/json finds it: an exact key first, else one equal ignoring case."""
    if name in doc:
        return doc[name]
    lowered = name.lower()
    return next((value for key, value in doc.items() if key.lower() == lowered), None)


def _cpus(text: object, where: str) -> frozenset[int]:
    if not isinstance(text, str):
        raise CPUManagerStateError(f"{where}: expected a CPU list string, got {type(text).__name__}")
    try:
        return frozenset(parse_cpu_list(text))
    except CPUListError as err:
        raise CPUManagerStateError(f"{where}: {err}") from None


def parse_cpu_manager_state(raw: bytes | str, path: str = "cpu_manager_state") -> CPUManagerState:
    """kubelet's checkpoint, either format: V2 (``entries``: pod UID → container name → CPUs, kubelet ≥ 1.18) or
    V1 (``entries``: container ID → CPUs). A checksum other than 0 must match kubelet's."""
    try:
        doc = load_json(raw, path, max_bytes=MAX_STATE_BYTES, max_depth=8)
    except SafeLoadError as err:
        raise CPUManagerStateError(str(err)) from None
    if not isinstance(doc, dict):
        raise CPUManagerStateError(f"{path}: expected a JSON object")
    policy, default, entries, checksum = _checkpoint_fields(doc, path)
    _check_checksum(policy, default, entries, checksum, path)
    assignments: list[CPUAssignment] = []
    for key, value in (entries or {}).items():
        if isinstance(value, dict):
            for container, cpus in value.items():
                assignments.append(CPUAssignment(_cpus(cpus, f"{path}: entries.{key}.{container}"),
                                                 pod_uid=str(key), container_name=str(container)))
        else:
            assignments.append(CPUAssignment(_cpus(value, f"{path}: entries.{key}"), container_id=str(key)))
    return CPUManagerState(policy=policy, default_cpuset=_cpus(default, f"{path}: defaultCpuSet"),
                           assignments=tuple(assignments))


def _checkpoint_fields(doc: dict, path: str) -> tuple[str, str, dict | None, int]:
    """(policyName, defaultCpuSet, entries, checksum) of the checkpoint, each of the type kubelet writes."""
    policy, default, entries = _field(doc, "policyName"), _field(doc, "defaultCpuSet"), _field(doc, "entries")
    checksum = _field(doc, "checksum")
    if not isinstance(policy, str) or not policy:
        raise CPUManagerStateError(f"{path}: policyName missing")
    default = "" if default is None else default
    if not isinstance(default, str):
        raise CPUManagerStateError(f"{path}: defaultCpuSet is not a string")
    if entries is not None and not isinstance(entries, dict):
        raise CPUManagerStateError(f"{path}: entries is not an object")
    if checksum is None:
        checksum = 0
    if not isinstance(checksum, int) or isinstance(checksum, bool) or checksum < 0:
        raise CPUManagerStateError(f"{path}: checksum is not an unsigned integer")
    return policy, default, entries, checksum


def _check_checksum(policy: str, default: str, entries: dict | None, checksum: int, path: str) -> None:
    """A checksum other than 0 must be one kubelet would have written for this content (either shape)."""
    v2 = bool(entries) and all(isinstance(value, dict) for value in entries.values())
    if entries and not v2 and not all(isinstance(value, str) for value in entries.values()):
        raise CPUManagerStateError(f"{path}: entries mix the V1 and V2 shapes")
    if entries:
        expected = checkpoint_checksums(policy, default, entries, v2)
    else:  # empty: either shape
        expected = checkpoint_checksums(policy, default, entries, True) | checkpoint_checksums(
            policy, default, entries, False)
    if checksum and checksum not in expected:
        raise CPUManagerStateError(f"{path}: checksum {checksum} does not match the content (a corrupt or "
                                   "hand-edited checkpoint)")


def parse_kubelet_config(raw: bytes | str, path: str = "kubelet config") -> tuple[str, dict[str, str], frozenset[int]]:
    """(cpuManagerPolicy, cpuManagerPolicyOptions, reservedSystemCPUs) of a KubeletConfiguration file."""
    try:
        doc = load_yaml(raw, path)
    except SafeLoadError as err:
        raise CPUManagerStateError(str(err)) from None
    if not isinstance(doc, dict):
        raise CPUManagerStateError(f"{path}: expected a KubeletConfiguration object")
    policy = doc.get("cpuManagerPolicy") or POLICY_NONE
    options = doc.get("cpuManagerPolicyOptions") or {}
    reserved = doc.get("reservedSystemCPUs") or ""
    if not isinstance(policy, str) or not isinstance(options, dict) or not isinstance(reserved, str):
        raise CPUManagerStateError(f"{path}: cpuManagerPolicy, cpuManagerPolicyOptions or reservedSystemCPUs "
                                   "has the wrong type")
    return policy, {str(k): str(v) for k, v in options.items()}, _cpus(reserved, f"{path}: reservedSystemCPUs")


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(limit + 1)


class CPUManagerStateReader:
    """kubelet's CPU manager state for the hooks, suppress and the NRT reporter, read again when the checkpoint
    (or the kubelet config) changes. ``None``: unknown (no file, or a malformed one; reported once per
    content, never fatal)."""

    def __init__(self, state_path: str, kubelet_config_path: str | None = None) -> None:
        self.state_path = state_path
        self.kubelet_config_path = kubelet_config_path
        self._key: tuple | None = None
        self._state: CPUManagerState | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _stamp(path: str | None) -> tuple[int, int] | None:
        if not path:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def __call__(self) -> CPUManagerState | None:
        key = (self._stamp(self.state_path), self._stamp(self.kubelet_config_path))
        with self._lock:
            if key == self._key:
                return self._state
            self._key = key
            self._state = self._load(key[0] is not None, key[1] is not None)
            return self._state

    def _load(self, have_state: bool, have_config: bool) -> CPUManagerState | None:
        if not have_state:
            logger.info("no kubelet CPU manager checkpoint at %s: kubelet's CPU assignments unknown",
                        self.state_path)
            return None
        try:
            state = parse_cpu_manager_state(_read(self.state_path, MAX_STATE_BYTES), self.state_path)
            if have_config and self.kubelet_config_path:
                policy, options, reserved = parse_kubelet_config(
                    _read(self.kubelet_config_path, MAX_DOCUMENT_BYTES), self.kubelet_config_path)
                if policy != state.policy:
                    logger.info("kubelet config says cpuManagerPolicy %s, its checkpoint %s: using the checkpoint's",
                                policy, state.policy)
                state = replace(state, options=options, reserved_cpus=reserved)
        except (CPUManagerStateError, OSError) as err:
            STATE_ERRORS.inc()
            logger.warning("kubelet CPU manager state unusable, treated as unknown: %s", err)
            return None
        return state
