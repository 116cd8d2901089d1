"""koordlet-py as the koordlet of Koordinator v1.8.0's own chart, nothing changed but the image.

The facts of that chart and binary are recorded in tests/deploy/koordinator_v1_8_0.py (its flags, its DaemonSet
with the default values, its ClusterRole) and koordinator_v1_8_0_crds.json (its CRD schemas), so these tests need
neither Koordinator's sources nor its chart. They check that every flag of that binary parses here as Go parses it,
that every path koordlet reads lies under one of that DaemonSet's mounts, that the RBAC it grants covers our calls,
that the README's command sets values the chart has, and (marked ``containerd``) run the image with exactly that
DaemonSet's command, args, env and mounts against the project's API server over TLS and containerd 2.1 with NRI.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from koordlet.config import parse_config
from tests.deploy import koordinator_v1_8_0 as koord
from tests.deploy.rbac_scan import scan_package
from tests.deploy.tools import ROOT

ENV = {"NODE_NAME": "node-1"}  # the chart's only env: NODE_NAME, and no agent_mode (DaemonSet mode)
POD = koord.DAEMONSET_POD["spec"]
CONTAINER = POD["containers"][0]
METRICS_PORT = koord.VALUES["koordlet"]["metrics"]["port"]


def _go_sample(kind: str) -> str:
    """A value Go's type takes (``kind`` as recorded in koordinator_v1_8_0.FLAGS)."""
    return {"string": "x", "bool": "true", "int": "0x10", "int64": "-7", "uint": "010", "uint64": "3",
            "float64": "1.5e1", "duration": "1m30s", "mapStringBool": "CPUBurst=true",
            "stringSlice": "PreRunPodSandbox",
            "Level": "4", "severity": "WARNING", "moduleSpec": "informer=5", "traceLocation": "main.go:10"}[kind]


# Values that a flag's meaning needs beyond its Go type (checked at start, as Koordinator checks them later).
_SEMANTIC_SAMPLES = {"addr": ":9316", "feature-gates": "BECPUEvict=true", "runtime-hooks-failure-policy": "Fail",
                     "runtime-hooks-plugin-failure-policy": "Ignore", "runtime-hooks-nri-plugin-index": "05",
                     "runtime-hooks-nri-plugin-name": "koordlet_nri", "collect-cpi-timewindow": "5s",
                     "runtime-hooks-nri-backoff-factor": "2"}


def _every_flag() -> list[tuple[str, str]]:
    return [(name, kind) for flags in koord.FLAGS.values() for name, kind in flags.items()]


def test_the_recorded_flags_are_every_flag_of_the_v1_8_0_binary_144_of_them() -> None:
    names = [name for name, _ in _every_flag()]
    assert len(names) == len(set(names)) == 144
    assert {"v", "logtostderr", "kubeconfig", "housekeeping_interval", "qos-extension-plugins"} <= set(names)


def test_every_flag_has_the_go_type_koordinator_declares_it_with() -> None:
    # the type decides the parser and what -help shows (int, uint, float, duration, value ...)
    from koordlet.config import _build_parser

    ours = {item.name: item.kind.name for item in _build_parser(False).flags()}
    assert {name: ours[name] for name, _ in _every_flag()} == dict(_every_flag())


@pytest.mark.parametrize(("name", "kind"), _every_flag())
def test_every_flag_of_koordinators_koordlet_parses_in_each_of_gos_spellings(name: str, kind: str) -> None:
    value = _SEMANTIC_SAMPLES.get(name) or _go_sample(kind)
    spellings = [[f"-{name}={value}"], [f"--{name}={value}"]]
    spellings += [[f"-{name}"], [f"--{name}"], [f"-{name}=false"]] if kind == "bool" else \
        [[f"-{name}", value], [f"--{name}", value]]
    for argv in spellings:
        config = parse_config(argv + ["-v=2"], ENV)  # a flag after it: the value was taken, parsing went on
        assert config.logging.verbosity == 2 or name == "v", argv


@pytest.mark.parametrize(("argv", "message"), [
    (["-kubelet-sync-interval=10"], 'invalid value "10" for flag -kubelet-sync-interval: parse error'),
    (["-report-interval", "soon"], 'invalid value "soon" for flag -report-interval: parse error'),
    (["-kubelet-read-only-port=-1"], 'invalid value "-1" for flag -kubelet-read-only-port: parse error'),
    (["-tsdb-stripe-size=99999999999999999999"], 'for flag -tsdb-stripe-size: value out of range'),
    (["-enable-pprof=yes"], 'invalid boolean value "yes" for -enable-pprof: parse error'),
    (["-v=x"], 'invalid value "x" for flag -v: strconv.ParseInt: parsing "x": invalid syntax'),
    (["-vmodule=informer"], "syntax error: expect comma-separated list of filename=N"),
    (["-stderrthreshold=LOUD"], 'strconv.ParseInt: parsing "LOUD": invalid syntax'),
    (["-log_backtrace_at=main:3"], "syntax error: expect file.go:234"),
    (["-qos-extension-plugins=A"], "malformed pair, expect string=bool"),
    (["-qos-extension-plugins=A=yes"],
     'invalid value of A: yes, err: strconv.ParseBool: parsing "yes": invalid syntax'),
    (["-feature-gates=BECPUEvict=on"], 'strconv.ParseBool: parsing "on": invalid syntax'),
    (["-addr"], "flag needs an argument: -addr"),
    (["---v=1"], "bad flag syntax: ---v=1"),
    (["-no-such-flag"], "flag provided but not defined: -no-such-flag"),
])
def test_a_bad_value_is_refused_with_the_go_types_own_message(argv: list[str], message: str) -> None:
    from koordlet.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config(argv, ENV)
    assert message in str(refused.value)


def test_booleans_and_the_end_of_the_flags_follow_go() -> None:
    # `-bool false` is `-bool` (true) and `false` ends the flags, so -v=9 after it is never read, as in Go.
    config = parse_config(["-enable-nri-runtime-hook", "false", "-v=9"], ENV)
    assert config.enable_nri_runtime_hook is True and config.logging.verbosity == 0
    assert config.ignored_args == ("false", "-v=9")
    assert parse_config(["--", "-v=9"], ENV).logging.verbosity == 0
    assert parse_config(["-kubelet-read-only-port=0x2813", "-reconcile-interval-seconds=010"], ENV).\
        kubelet_read_only_port == 10259


def test_a_map_flag_given_again_merges_its_pairs_as_map_string_bool_does() -> None:
    config = parse_config(["-qos-extension-plugins=a=true,b=true", "-qos-extension-plugins", "b=false,c=1"], ENV)
    assert dict(config.qos_extension_plugins) == {"a": True, "b": False, "c": True}
    gates = parse_config(["-feature-gates=BECPUEvict=true", "-feature-gates=BEMemoryEvict=true"], ENV)
    assert gates.gate("BECPUEvict") and gates.gate("BEMemoryEvict")


def test_the_charts_args_parse_and_name_the_unused_flags_given() -> None:
    config = parse_config(CONTAINER["args"] + ["-tsdb-path=/metric-data/", "--housekeeping_interval=2s"], ENV)
    assert config.logging.verbosity == 4 and config.logging.to_stderr
    assert config.unused_flags == ("tsdb-path", "housekeeping_interval")
    assert {name for name, on in config.feature_gates.items() if on} >= {"BECPUEvict", "BEMemoryEvict",
                                                                         "CgroupReconcile", "Accelerators"}
    assert config.metrics_host == "0.0.0.0" and config.metrics_port == METRICS_PORT  # -addr=:9316, as Go binds it


# ---------------------------------------------------------------------------------------------------- the layout
def _mount_table() -> list[tuple[PurePosixPath, PurePosixPath | None, bool]]:
    """(path in the pod, host path or None for an emptyDir, read-only) of every mount of the DaemonSet."""
    volumes = {v["name"]: v for v in POD["volumes"]}
    table = []
    for mount in CONTAINER["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath", {}).get("path")
        table.append((PurePosixPath(mount["mountPath"]), PurePosixPath(host) if host else None,
                      bool(mount.get("readOnly"))))
    return table


def _host_path(seen: str) -> tuple[PurePosixPath, bool]:
    """The host path a path koordlet sees stands for, by the deepest mount holding it, and whether it is read-only."""
    inside = PurePosixPath(seen)
    match = [m for m in _mount_table() if inside == m[0] or m[0] in inside.parents]
    assert match, f"{seen} is not under any volume mount of Koordinator's DaemonSet"
    mount, host, read_only = max(match, key=lambda m: len(m[0].parts))
    assert host is not None, f"{seen} is in an emptyDir, lost when the pod restarts"
    return host / inside.relative_to(mount), read_only


def _koordinators_config() -> Any:
    return parse_config(CONTAINER["args"], ENV)


def test_every_path_koordlet_reads_lies_under_a_host_mount_of_koordinators_daemonset() -> None:
    config = _koordinators_config()
    kubelet = config.var_lib_kubelet_dir
    expected = {  # the path koordlet sees: (the host path it must be, written by koordlet)
        config.cgroup_root_dir: ("/sys/fs/cgroup", True),
        config.sys_root_dir: ("/sys", False),
        os.path.join(config.sys_fs_root_dir, "resctrl"): ("/sys/fs/resctrl", True),
        config.nri_socket_path: ("/var/run/nri/nri.sock", False),  # a socket: connect works on a read-only mount
        config.runtime_hooks_addr: ("/var/run/koordlet/koordlet.sock", True),
        config.runtime_hooks_config_path: ("/etc/runtime/hookserver.d", True),
        os.path.join(kubelet, "cpu_manager_state"): ("/var/lib/kubelet/cpu_manager_state", False),
        os.path.join(kubelet, "memory_manager_state"): ("/var/lib/kubelet/memory_manager_state", False),
        os.path.join(kubelet, "pod-resources", "kubelet.sock"): ("/var/lib/kubelet/pod-resources/kubelet.sock", False),
        os.path.join(kubelet, "device-plugins", "kubelet.sock"):
            ("/var/lib/kubelet/device-plugins/kubelet.sock", False),
        config.prediction_checkpoint_filepath: ("/var/run/koordlet/prediction-checkpoints", True),
        config.system_config_record_file: ("/var/run/koordlet/system-config-originals.json", True),
        config.api_checkpoint_file: ("/var/run/koordlet/api-checkpoint.json", True),
        os.path.join(config.pod_resources_proxy_path, "kubelet.sock"): ("/var/run/koordlet/pod-resources/kubelet.sock",
                                                                        True),
        "/var/run/koordlet/xpu-device-infos/": ("/var/run/koordlet/xpu-device-infos", False),
        "/usr/local/vgpu/containers/pod_c": ("/usr/local/vgpu/containers/pod_c", True),  # HAMi-core's cache dirs
        config.proc_root_dir: None,  # hostPID: the pod's own /proc is the host's
        "/dev": ("/dev", False),
    }
    for seen, want in expected.items():
        if want is None:
            assert POD["hostPID"] is True
            continue
        host, read_only = _host_path(seen)
        assert str(host).rstrip("/") == want[0], f"{seen} is host {host}, not {want[0]}"
        assert not (want[1] and read_only), f"koordlet writes {seen} but Koordinator mounts it read-only"


def test_the_device_plugin_dir_is_read_only_there_and_the_pod_resources_proxy_is_not() -> None:
    config = _koordinators_config()
    assert _host_path(config.device_plugin_dir)[1] is True  # our GPU device plugin cannot serve there
    assert _host_path(config.pod_resources_proxy_path)[1] is False


def test_koordinators_role_allows_every_call_koordlet_makes() -> None:
    """Matched as RBAC matches (tests/support/authz.py): every API call but the /debug guard's reviews, and kubelet's
    pod list through nodes/proxy on every kubelet (nodes/pods, which kubelet 1.33+ asks first, it does not grant)."""
    from koordlet.statesinformer.kubelet import KUBELET_CALLS
    from tests.deploy.rbac_scan import kubelet_permissions
    from tests.support.authn import UserInfo
    from tests.support.authz import Attributes, rules_allow

    calls, problems = scan_package(ROOT, "koordlet")
    assert calls and problems == []

    def allowed(group: str, resource: str, verb: str) -> bool:
        name, _, subresource = resource.partition("/")
        return rules_allow(koord.KOORDLET_ROLE_RULES, Attributes(UserInfo("koordlet"), verb, True, "", group, "v1",
                                                                 name, subresource, "", "node-1"))

    missing = sorted({f"{g or 'core'} {r} {v}" for call in calls for g, r, v in call.permissions
                      if not allowed(g, r, v)})
    # Only the guard of /events and /debug/* reviews tokens (koordlet/debug/authz.py). Koordinator's role cannot, so
    # under its chart those endpoints refuse every caller (fail closed, 503 with the reason); nothing else needs them.
    # And only the bare-metal token renewal (koordlet/credentials.py) asks for a token: it runs with a token file the
    # installer's TokenRequest made, never in a pod, where kubelet renews the projected token.
    assert missing == ["authentication.k8s.io tokenreviews create", "authorization.k8s.io subjectaccessreviews create",
                       "core serviceaccounts/token create"]
    assert not any(allowed(*perm) for perm in kubelet_permissions(KUBELET_CALLS))  # nodes/pods
    assert all(allowed(*perm) for perm in kubelet_permissions(KUBELET_CALLS, fine_grained_authz=False))  # nodes/proxy


# ------------------------------------------------------------------------------------------ the README's command
def _readme_command() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("helm upgrade --install koordinator koordinator-sh/koordinator")
    end = text.index("\n```", start)
    return shlex.split(text[start:end].replace("\\\n", " "))


def _set_arguments(command: list[str]) -> dict[str, str]:
    """Helm's --set: ``key=value`` pairs split on unescaped commas; ``\\,`` is a comma in a value."""
    pairs: dict[str, str] = {}
    for flag, value in zip(command, command[1:], strict=False):
        if flag != "--set":
            continue
        parts, current, escaped = [], "", False
        for char in value:
            if escaped:
                current, escaped = current + char, False
            elif char == "\\":
                escaped = True
            elif char == ",":
                parts, current = parts + [current], ""
            else:
                current += char
        for part in parts + [current]:
            key, _, item = part.partition("=")
            pairs[key] = item
    return pairs


def _image_of_make_image() -> str:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"koordlet-py:{version}"


def _readme_push_target() -> str:
    """Where README's step 1 pushes the image `make image` builds (``skopeo copy ... docker://<target>``)."""
    text = (ROOT / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("skopeo copy oci-archive:"))
    archive, target = line.split()[2:4]
    assert archive == f"oci-archive:out/image/{_image_of_make_image().replace(':', '-')}.oci.tar"
    return target.removeprefix("docker://")


def test_docs_give_koordinators_koordlet_the_limits_its_v1_8_0_chart_sets() -> None:
    """docs/koordinator.md names Koordinator's koordlet CPU limit in two places; both are its chart's value."""
    limits = koord.VALUES["koordlet"]["resources"]["limits"]
    text = " ".join((ROOT / "docs/koordinator.md").read_text().split())
    assert f"Koordinator's DaemonSet limits: cpu {limits['cpu']}, memory {limits['memory']}, requests 0" in text
    assert f"under the chart's {limits['cpu']} CPU limit" in text


def test_the_readmes_koordinator_chart_command_sets_values_the_chart_has_and_names_our_image() -> None:
    command = _readme_command()
    assert command[:7] == ["helm", "upgrade", "--install", "koordinator", "koordinator-sh/koordinator", "--version",
                           "1.8.0"]
    assert "--reuse-values" in command  # a running Koordinator keeps its other values
    values = _set_arguments(command)
    for key in values:  # an unescaped comma in a value would make a key the chart does not have
        node: Any = koord.VALUES
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"--set {key}: Koordinator v1.8.0's chart has no such value"
            node = node[part]
    # the chart's image template, with the README's values over the defaults
    image = koord.IMAGE_TEMPLATE
    for key in ("imageRepositoryHost", "koordlet.image.repository", "koordlet.image.tag"):
        default: Any = koord.VALUES
        for part in key.split("."):
            default = default[part]
        image = image.replace("{" + key + "}", str(values.get(key, default)))
    assert image == _readme_push_target()
    assert image.endswith("/" + _image_of_make_image())
    gates = values["koordlet.features"].split(",")
    assert len(gates) == 4 and parse_config([f"-feature-gates={values['koordlet.features']}"], ENV).gate("BECPUEvict")


# -------------------------------------------------------------------------- the image under Koordinator's chart
NODE = "koordinator-node"
NRI_SOCKET = "/var/run/nri/nri.sock"
SA_NAMESPACE = koord.VALUES["installation"]["namespace"]


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))  # noqa: S104 (the chart's hostNetwork port, as koordlet binds it)
        except OSError:
            return False
    return True


@pytest.fixture
def chart_host_dirs() -> Iterator[list[str]]:
    """The DaemonSet's hostPath dirs that are not kernel roots, made for the test (as kubelet's DirectoryOrCreate
    does) and removed after; refuses to run over a node's own koordlet, NRI or port 9316."""
    if not _port_free(METRICS_PORT):
        pytest.fail(f"port {METRICS_PORT} is in use: Koordinator's chart runs koordlet on the host network at that "
                    "fixed port; stop whatever holds it (another koordlet, another run of this test) and run again")
    if os.path.exists(NRI_SOCKET):
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(NRI_SOCKET) == 0:
                pytest.fail(f"{NRI_SOCKET} answers: a containerd with NRI runs on this host; this test runs its own "
                            "there")
        os.unlink(NRI_SOCKET)  # left by a containerd that stopped (containerd does not remove it)
    wanted = [v["hostPath"]["path"].rstrip("/") for v in POD["volumes"] if "hostPath" in v]
    wanted = [p for p in wanted if not p.startswith(("/sys", "/dev", "/run", "/etc/localtime"))
              and p not in ("/var/run",)] + ["/var/run/nri"]
    made: list[str] = []
    for path in wanted:
        if os.path.isdir(path) and os.listdir(path) and path not in ("/var/lib/kubelet", "/var/run/koordlet"):
            pytest.fail(f"{path} exists and is not empty: this machine runs Kubernetes or koordlet of its own")
        missing = path
        while not os.path.exists(missing):
            made.append(missing)
            missing = os.path.dirname(missing)
        os.makedirs(path, exist_ok=True)
    # What koordlet makes in its host dir (sockets, pod-resources/, xpu-device-infos/, checkpoints) goes after the
    # test even where the dir was there before: a later test (test_image) refuses a non-empty one.
    koordlet_dir = "/var/run/koordlet"
    before = set(os.listdir(koordlet_dir)) if os.path.isdir(koordlet_dir) else set()
    try:
        yield wanted
    finally:
        for path in ("/etc/runtime/hookserver.d/koordlet.json", NRI_SOCKET):
            if os.path.lexists(path):
                os.unlink(path)
        for entry in set(os.listdir(koordlet_dir) if os.path.isdir(koordlet_dir) else ()) - before:
            subprocess.run(["rm", "-rf", "--one-file-system", os.path.join(koordlet_dir, entry)], check=False,
                           timeout=30)
        for path in sorted(made, key=len, reverse=True):
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False, timeout=30)


def _cri_pod(sandbox_uid: str, service_account: Path, api_port: int, empty_dir: Path, log_dir: Path) -> tuple:
    """The CRI requests kubelet sends for Koordinator's koordlet pod with the recorded spec, image ours."""
    from tests.support.containerd import CGROUP_ROOT
    from wire import cri_pb2 as cri

    host = cri.NamespaceOption(network=cri.NODE, pid=cri.NODE, ipc=cri.POD)
    privileged = CONTAINER["securityContext"]["privileged"]
    sandbox = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="koordlet-drop1", uid=sandbox_uid, namespace=SA_NAMESPACE),
        labels=koord.DAEMONSET_POD["metadata"]["labels"], log_directory=str(log_dir),
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=f"{CGROUP_ROOT}/kubepods/burstable/pod{sandbox_uid}",
            security_context=cri.LinuxSandboxSecurityContext(namespace_options=host, privileged=privileged)))
    volumes = {v["name"]: v for v in POD["volumes"]}
    mounts = []
    for mount in CONTAINER["volumeMounts"]:
        volume = volumes[mount["name"]]
        source = volume["hostPath"]["path"] if "hostPath" in volume else str(empty_dir)
        mounts.append(cri.Mount(container_path=mount["mountPath"], host_path=source,
                                readonly=bool(mount.get("readOnly"))))
    # What kubelet adds to every pod: the service account's token, CA and namespace; the API server's address.
    mounts.append(cri.Mount(container_path="/var/run/secrets/kubernetes.io/serviceaccount",
                            host_path=str(service_account), readonly=True))
    envs = {"NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api_port)}
    assert [e["name"] for e in CONTAINER["env"]] == ["NODE_NAME"]
    limits = CONTAINER["resources"]["limits"]
    assert limits == {"cpu": "200m", "memory": "256Mi"}
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=CONTAINER["name"]), image=cri.ImageSpec(image=_image_of_make_image()),
        command=CONTAINER["command"], args=CONTAINER["args"],
        envs=[cri.KeyValue(key=k, value=v.encode()) for k, v in envs.items()], mounts=mounts, log_path="koordlet.log",
        linux=cri.LinuxContainerConfig(
            # limits 200m / 256Mi, requests 0: kubelet's values for them
            resources=cri.LinuxContainerResources(cpu_shares=2, cpu_period=100000, cpu_quota=20000,
                                                  memory_limit_in_bytes=256 << 20),
            security_context=cri.LinuxContainerSecurityContext(privileged=privileged, namespace_options=host)))
    return sandbox, config


def _koordlet_pod_as_kubelet_lists_it(uid: str, container_id: str) -> dict[str, Any]:
    return {"metadata": {"name": "koordlet-drop1", "namespace": SA_NAMESPACE, "uid": uid,
                         "labels": koord.DAEMONSET_POD["metadata"]["labels"]},
            "spec": {"nodeName": NODE, "hostNetwork": True,
                     "containers": [{"name": "koordlet", "resources": CONTAINER["resources"]}]},
            "status": {"phase": "Running", "qosClass": "Burstable",
                       "containerStatuses": [{"name": "koordlet", "ready": True,
                                              "containerID": f"containerd://{container_id}"}]}}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 (loopback)
        return response.read().decode()


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass
class _Cluster:
    """What the koordlet pod meets on its node: containerd 2.1 with NRI at the host's /var/run/nri/nri.sock, the
    project's API server with what Koordinator's chart applies (its CRDs from the facts, its koordlet's service account,
    koordlet-role and binding), and kubelet's /pods, both authorizing koordlet's service-account token."""

    tmp_path: Path
    api: Any = None
    kubelet: Any = None
    client: Any = None
    pods: Any = None
    service_account: Path = field(init=False)

    def seed(self) -> None:
        from tests.deploy.deploy_paths import koordinators_chart, service_account_volume
        from tests.support.apiserver import create_objects

        path = koordinators_chart()
        create_objects(self.api, path.crds)
        create_objects(self.api, path.rbac)
        self.service_account = service_account_volume(self.api, *path.account, self.tmp_path / "serviceaccount")
        self.api.seed(self.kubelet.node_object({"capacity": {"cpu": "2", "memory": "8Gi"},
                                                "allocatable": {"cpu": "2", "memory": "8Gi"}}))
        # koord-manager makes the NodeMetric; koordlet fills its status
        self.api.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                       "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 60, "reportIntervalSeconds": 10}}})


@contextmanager
def _koordinators_node(tmp_path: Path) -> Iterator[_Cluster]:
    from tests.deploy.test_image import _import, build_image_archive
    from tests.support.apiserver import ApiServer
    from tests.support.containerd import Containerd
    from tests.support.cri import CriClient, PodFactory
    from tests.support.kubelet import Kubelet

    archive = build_image_archive()
    containerd = Containerd(run_dir=f"/run/koordlet-py/dropin-{os.getpid()}/containerd",
                            root_dir=f"/var/lib/koordlet-py/dropin-{os.getpid()}/containerd", version="2.1",
                            nri_socket=NRI_SOCKET)
    containerd.up()
    cluster = _Cluster(tmp_path)
    cluster.client = CriClient(containerd.socket)
    cluster.pods = PodFactory(cluster.client)
    try:
        _import(containerd.socket, archive)
        with ApiServer(crd_dir=None) as api, Kubelet(api, NODE, {"kind": "PodList", "apiVersion": "v1",
                                                                 "metadata": {}, "items": []}) as kubelet:
            cluster.api, cluster.kubelet = api, kubelet
            cluster.seed()
            yield cluster
    finally:
        cluster.pods.cleanup()
        cluster.client.close()
        containerd.down()
        containerd.remove_dirs()


@pytest.mark.containerd
@pytest.mark.serial  # the DaemonSet's host paths, port 9316 on the host network, the image build's out/image
@pytest.mark.owns_node_paths  # chart_host_dirs makes the DaemonSet's /var/run/koordlet dirs and removes them after
@pytest.mark.timeout(900)  # it may be the one that builds the image (scripts/build-image.sh)
def test_the_image_runs_as_koordinators_koordlet_with_exactly_its_chart(
        chart_host_dirs: list[str], tmp_path: Path) -> None:
    from tests.deploy.test_image import _container_log, be_pod_gets_its_batch_values
    from tests.support.waiting import wait_for
    from wire import cri_pb2 as cri

    with _koordinators_node(tmp_path) as node:
        api, client = node.api, node.client
        uid = str(uuid.uuid4())
        empty_dir = tmp_path / "metric-data"
        empty_dir.mkdir()
        sandbox, config = _cri_pod(uid, node.service_account, int(api.url.rsplit(":", 1)[1]), empty_dir,
                                   tmp_path / "logs")
        sid = node.pods.run_pod(sandbox)
        cid = node.pods.create_container(sid, sandbox, config)
        node.kubelet.payload["items"] = [_koordlet_pod_as_kubelet_lists_it(uid, cid)]  # as a real kubelet lists it
        started = time.monotonic()
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
        log_file = tmp_path / "logs" / "koordlet.log"
        logs = lambda: log_file.read_text() if log_file.exists() else _container_log(client, cid)  # noqa: E731

        assert wait_for(lambda: "NRI: registered as 00-koordlet_nri" in logs(), 30), \
            "\n".join(line for line in logs().splitlines() if "NRI" in line or "koordlet.agent" in line)
        registered_s = time.monotonic() - started
        assert registered_s < 10.0, logs()
        assert wait_for(lambda: _metric(_get(f"http://127.0.0.1:{METRICS_PORT}/metrics"),
                                        "koordlet_nri_registered") == 1.0, 30), logs()
        be_pod_gets_its_batch_values(client)  # through NRI: the client is containerd's own
        assert wait_for(lambda: ((api.get_object("nodemetrics", NODE) or {}).get("status") or {})
                        .get("nodeMetric"), 90), logs()
        assert wait_for(lambda: api.get_object("noderesourcetopologies", NODE), 60), logs()
        assert [(r.verb, r.path) for r in api.requests() if r.status == 422] == []
        # Koordinator's role, nothing else: kubelet let /pods through nodes/proxy, nothing was refused
        account = "system:serviceaccount:koordinator-system:koordlet"
        assert node.kubelet.requests[-1].user == account and node.kubelet.refusals() == []
        assert [(r.verb, r.path) for r in api.requests() if r.status in (401, 403)] == []
        assert {r.user for r in api.requests() if r.user != "kubernetes-admin"} == {account, f"system:node:{NODE}"}
        assert re.search(r"\((401|403)\)|HTTP 40[13]", logs()) is None, logs()
        status = client.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10).status
        assert status.state == cri.CONTAINER_RUNNING, logs()
        assert "accepted but not used" not in logs()  # the chart passes no flag we leave unused
        assert "Traceback" not in logs(), logs()
        print(f"NRI registration {registered_s:.1f} s after StartContainer; "
              f"ran {time.monotonic() - started:.0f} s, still running")


def test_the_device_object_of_a_gpu_node_validates_against_koordinators_crd(tmp_path: Path) -> None:
    """The image has no GPU, so the Device object is shown here: koordlet with the tests' fake NVML (two H100s,
    demo/fake_gpu_koordlet.py) in a process on this host, the chart's args, kubelet's dir read-only as the chart
    mounts it, against the API server serving Koordinator v1.8.0's CRDs from the recorded facts."""
    import sys

    from tests.deploy.deploy_paths import koordinators_chart
    from tests.support.apiserver import ApiServer, Credentials, create_objects, write_kubeconfig
    from tests.support.containerd import CGROUP_ROOT
    from tests.support.kubelet import Kubelet
    from tests.support.proxy import free_port
    from tests.support.waiting import wait_for

    if os.geteuid() != 0:
        pytest.skip("needs root to mount kubelet's dir read-only")
    kubelet_dir = tmp_path / "var-lib-kubelet"
    (kubelet_dir / "device-plugins").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(kubelet_dir), str(kubelet_dir)], check=True, timeout=30)
    proc = None
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(kubelet_dir)], check=True, timeout=30)
        with ApiServer(crd_dir=None) as api, Kubelet(api, NODE) as kubelet:
            path = koordinators_chart()
            create_objects(api, path.crds + path.rbac)
            api.seed(kubelet.node_object())
            namespace, account = path.account
            token = api.service_account_token(namespace, account)
            kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig", Credentials(account, token=token))
            (tmp_path / "token").write_text(token)
            (tmp_path / "hooks").mkdir()
            args = [sys.executable, "-m", "demo.fake_gpu_koordlet", *CONTAINER["args"],
                    "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}",
                    f"-addr=127.0.0.1:{free_port()}", f"-kubeconfig={kubeconfig}", "-enable-nri-runtime-hook=false",
                    f"-var-lib-kubelet-dir={kubelet_dir}", f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}",
                    f"-runtime-hooks-config-path={tmp_path / 'hooks'}",
                    f"-prediction-checkpoint-filepath={tmp_path / 'prediction'}",
                    f"-system-config-record-file={tmp_path / 'originals.json'}",
                    f"-kubelet-token-file={tmp_path / 'token'}"]
            env = {**os.environ, "NODE_NAME": NODE, "agent_mode": "hostMode", "PYTHONPATH": str(ROOT)}
            log_path = tmp_path / "koordlet.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            logs = lambda: log_path.read_text(errors="replace")  # noqa: E731
            assert wait_for(lambda: api.get_object("devices", NODE), 60), logs()
            device = api.get_object("devices", NODE)
            assert [d["type"] for d in device["spec"]["devices"]] == ["gpu", "gpu"]
            assert "GPU device plugin off" in logs() and "is not writable here" in logs()
            assert [r for r in api.requests() if r.status == 422] == []
            assert proc.poll() is None, logs()
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        subprocess.run(["umount", str(kubelet_dir)], check=False, timeout=30)


def test_the_readmes_command_on_koordinators_chart_renders_the_recorded_pod_with_our_image(
        koordinator_chart: Path) -> None:
    """With Koordinator's chart at hand: `helm template` with the README's exact --set arguments renders the
    koordlet DaemonSet recorded in koordinator_v1_8_0.py, our image in it, and its role as recorded."""
    from tests.deploy.tools import documents, tool

    command = _readme_command()
    sets = [arg for flag, arg in zip(command, command[1:], strict=False) if flag == "--set"]
    done = subprocess.run([tool("helm"), "template", "koordinator", str(koordinator_chart), "--namespace",
                           koord.NAMESPACE, *(x for s in sets for x in ("--set", s))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = documents(done.stdout)
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "koordlet"]
    spec = daemonset["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["image"] == _readme_push_target()
    recorded = koord.DAEMONSET_POD["spec"]["containers"][0]
    assert {k: v for k, v in container.items() if k != "image"} == {k: v for k, v in recorded.items() if k != "image"}
    assert spec["volumes"] == koord.DAEMONSET_POD["spec"]["volumes"]
    [role] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "koordlet-role"]
    assert role["rules"] == koord.KOORDLET_ROLE_RULES
