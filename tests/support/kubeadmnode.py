"""A node's kubelet as kubeadm's packages lay it out, and a stand-in kubelet that reads its runtime endpoint as kubelet
does.

The layout (``KubeadmLayout``): ``kubelet.service`` (the package's unit, ``ExecStart=/usr/bin/kubelet``), its drop-in
``kubelet.service.d/10-kubeadm.conf`` (the variables, ``EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env`` and
``EnvironmentFile=-/etc/default/kubelet``, and ``ExecStart=`` reset to ``kubelet $KUBELET_KUBECONFIG_ARGS
$KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS``), the deb package's empty
``KUBELET_EXTRA_ARGS=`` in /etc/default/kubelet (the rpm's is /etc/sysconfig/kubelet), and what ``kubeadm join``
writes: kubeadm-flags.env and /var/lib/kubelet/config.yaml. kubeadm 1.27 and later put the runtime endpoint in the
config file (``containerRuntimeEndpoint``); earlier ones passed ``--container-runtime-endpoint`` in
kubeadm-flags.env. Both are laid out here.

The stand-in (``python -m tests.support.kubeadmnode ARGS``, for systemd to run in place of /usr/bin/kubelet) takes
kubelet's command line and resolves the endpoint with kubelet's precedence: a command-line flag over the
``--config-dir`` files (the last that sets it) over the ``--config`` file, and of a flag given twice the last (pflag);
kubelet's default when none sets it. It writes what it got to ``$KUBELET_STANDIN_REPORT`` and stdout, then calls the
endpoint as a starting kubelet does: ``Version``, then ``ListPodSandbox`` every second (its relist), until SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml

from tests.support.cri import CriClient
from wire import cri_pb2 as cri

# kubelet's default containerRuntimeEndpoint (KubeletConfiguration v1beta1 since 1.27).
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"
CONTAINERD_ENDPOINT = "unix:///var/run/containerd/containerd.sock"
PAUSE = "--pod-infra-container-image=registry.k8s.io/pause:3.10"


@dataclass(frozen=True, slots=True)
class KubeadmLayout:
    """kubelet's unit and files as kubeadm's packages and ``kubeadm join`` leave them, under ``root``.

    ``flag_in_kubeadm_args``: kubeadm before 1.27 (the endpoint a flag in kubeadm-flags.env, none in config.yaml).
    ``rpm``: /etc/sysconfig/kubelet instead of /etc/default/kubelet. ``unit_dir``: where the package put the unit
    (pkgs.k8s.io's debs and rpms: /usr/lib/systemd/system; a test guest whose /usr is read-only: /etc/systemd/system).
    """

    root: Path
    binary: str = "/usr/bin/kubelet"
    unit_dir: str = "/usr/lib/systemd/system"
    flag_in_kubeadm_args: bool = False
    rpm: bool = False
    extra_args: str = ""

    @property
    def extra_args_file(self) -> str:
        return "/etc/sysconfig/kubelet" if self.rpm else "/etc/default/kubelet"

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def files(self) -> dict[str, str]:
        """Every file of the layout, by its path on the node."""
        kubeadm_args = PAUSE + (f" --container-runtime-endpoint={CONTAINERD_ENDPOINT}"
                                if self.flag_in_kubeadm_args else "")
        config = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                  "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
                  "authorization": {"mode": "Webhook"}, "cgroupDriver": "systemd",
                  "clusterDNS": ["10.96.0.10"], "clusterDomain": "cluster.local"}
        if not self.flag_in_kubeadm_args:
            config["containerRuntimeEndpoint"] = CONTAINERD_ENDPOINT
        return {
            f"{self.unit_dir}/kubelet.service": (
                "[Unit]\nDescription=kubelet: The Kubernetes Node Agent\n"
                "Documentation=https://kubernetes.io/docs/\nWants=network-online.target\n"
                "After=network-online.target\n\n"
                f"[Service]\nExecStart={self.binary}\nRestart=always\nStartLimitInterval=0\nRestartSec=10\n\n"
                "[Install]\nWantedBy=multi-user.target\n"),
            f"{self.unit_dir}/kubelet.service.d/10-kubeadm.conf": (
                "# kubeadm's drop-in: the kubeconfig and config flags, kubeadm's own flags from the file kubeadm\n"
                "# init/join writes, and the operator's KUBELET_EXTRA_ARGS from the package's environment file.\n"
                "[Service]\n"
                'Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf'
                ' --kubeconfig=/etc/kubernetes/kubelet.conf"\n'
                'Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"\n'
                "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\n"
                f"EnvironmentFile=-{self.extra_args_file}\n"
                "ExecStart=\n"
                f"ExecStart={self.binary} $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS "
                "$KUBELET_EXTRA_ARGS\n"),
            self.extra_args_file: f"KUBELET_EXTRA_ARGS={self.extra_args}\n",
            "/var/lib/kubelet/kubeadm-flags.env": f'KUBELET_KUBEADM_ARGS="{kubeadm_args}"\n',
            "/var/lib/kubelet/config.yaml": yaml.safe_dump(config, sort_keys=False),
        }

    def write(self) -> dict[str, bytes]:
        """Lay the files out; returns their bytes by node path (what an uninstall must put back)."""
        written = {}
        for node_path, text in self.files().items():
            path = self.path(node_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written[node_path] = text.encode()
        return written

    def contents(self) -> dict[str, bytes]:
        return {node_path: self.path(node_path).read_bytes() for node_path in self.files()}

    def remove(self) -> None:
        for node_path in self.files():
            self.path(node_path).unlink(missing_ok=True)
        drop_ins = self.path(f"{self.unit_dir}/kubelet.service.d")
        if drop_ins.is_dir() and not any(drop_ins.iterdir()):
            drop_ins.rmdir()


def _flag_values(argv: list[str], name: str) -> list[str]:
    """Every value of --NAME in argv, in order (``--NAME=V`` and ``--NAME V``), as pflag reads them."""
    values = []
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            values.append(arg.split("=", 1)[1])
        elif arg == f"--{name}" and i + 1 < len(argv):
            values.append(argv[i + 1])
    return values


def _from_config(path: str) -> str | None:
    with open(path) as handle:
        config = yaml.safe_load(handle) or {}
    return config.get("containerRuntimeEndpoint") or None


def runtime_endpoint(argv: list[str]) -> tuple[str, str]:
    """The CRI endpoint kubelet uses with this command line, and where it came from."""
    flags = _flag_values(argv, "container-runtime-endpoint")
    if flags:
        return flags[-1], "flag --container-runtime-endpoint"
    endpoint, source = DEFAULT_ENDPOINT, "kubelet's default"
    configs = _flag_values(argv, "config")
    if configs and (found := _from_config(configs[-1])):
        endpoint, source = found, f"config {configs[-1]}"
    for directory in _flag_values(argv, "config-dir")[-1:]:
        for drop_in in sorted(Path(directory).glob("*.conf")):
            if found := _from_config(str(drop_in)):
                endpoint, source = found, f"config-dir {drop_in}"
    return endpoint, source


def main(argv: list[str]) -> int:
    endpoint, source = runtime_endpoint(argv)
    report = {"endpoint": endpoint, "source": source, "argv": argv, "pid": os.getpid()}
    print(f"kubelet stand-in: container runtime endpoint {endpoint} ({source})", flush=True)
    if path := os.environ.get("KUBELET_STANDIN_REPORT"):
        Path(path).write_text(json.dumps(report) + "\n")
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    client = CriClient(endpoint.removeprefix("unix://"))
    try:
        while not stopping:
            try:
                client.runtime.Version(cri.VersionRequest(), timeout=10)
                client.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10)
            except grpc.RpcError as err:  # kubelet logs a failed relist and tries again
                print(f"kubelet stand-in: CRI call to {endpoint} failed: {err}", flush=True)
            time.sleep(1)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
