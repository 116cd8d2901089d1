"""koord-runtime-proxy: the CRI proxy between kubelet and the container runtime.

Under systemd it serves the listening socket of ``koord-runtime-proxy.socket`` (socket activation) and reports
readiness (``Type=notify``); started by hand it binds --koord-runtimeproxy-endpoint itself."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvloop

from wire.systemd import Notifier, listen_fds, listening_unix_socket

from .backend import probe_version
from .server import ProxyOptions, ProxyServer, StartupError

log = logging.getLogger("runtimeproxy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="koord-runtime-proxy", description=__doc__)
    p.add_argument("--koord-runtimeproxy-endpoint", default="/var/run/koord-runtimeproxy/runtimeproxy.sock",
                   help="unix socket kubelet connects to (--container-runtime-endpoint)")
    p.add_argument("--remote-runtime-service-endpoint", default="/var/run/containerd/containerd.sock",
                   help="unix socket of the container runtime's CRI service")
    p.add_argument("--runtime-hook-server-key", default="runtimeproxy.koordinator.sh/skip-hookserver",
                   help="pod label that makes the proxy skip hooks for a pod")
    p.add_argument("--runtime-hook-server-val", default="true", help="value of that label")
    p.add_argument("--metrics-bind-address", default="127.0.0.1:9318",
                   help="host:port of /metrics, /healthz and /readyz (0.0.0.0:9318 or [::]:9318 for every "
                        "address, a node IP for one); empty to disable")
    p.add_argument("--drain-timeout", type=float, default=10.0,
                   help="seconds to let in-flight calls finish on SIGTERM")
    p.add_argument("--backend-probe-timeout", type=float, default=5.0,
                   help="seconds to wait for the runtime's Version answer at start")
    p.add_argument("--runtime-hook-config-dir", default="/etc/runtime/hookserver.d",
                   help="directory of hook server registration files (*.json), watched for changes")
    p.add_argument("--runtime-hook-timeout", type=float, default=2.0,
                   help="deadline of one hook server call, seconds")
    p.add_argument("--store-checkpoint-path", default="/var/lib/koord-runtimeproxy/store.json",
                   help="checkpoint of the pod/container store, rewritten atomically on change ('' = none)")
    p.add_argument("--store-gc-interval", type=float, default=60.0,
                   help="seconds between sweeps of store entries the runtime no longer has")
    p.add_argument("--max-recv-message-size", type=int, default=16 << 20,
                   help="largest request message of a hooked call, in bytes (containerd's default); larger ones, "
                        "or compressed ones that inflate past it, get RESOURCE_EXHAUSTED")
    p.add_argument("--handshake-timeout", type=float, default=10.0,
                   help="seconds a new kubelet connection has to send the HTTP/2 preface and its first frame")
    p.add_argument("--stall-timeout", type=float, default=30.0,
                   help="seconds a kubelet connection may stay silent in the middle of a frame before it is closed")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def _split_host_port(value: str) -> tuple[str, int]:
    if not value:
        return "", -1
    host, _, port = value.rpartition(":")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} out of range")
    return host.removeprefix("[").removesuffix("]") or "0.0.0.0", number


def _systemd_socket(listen: str) -> int | None:
    """The listening socket systemd passed (``koord-runtime-proxy.socket``), as an fd; None when not socket
    activated. Raises ValueError when what systemd passed cannot serve CRI."""
    fds = listen_fds()
    if not fds:
        return None
    chosen = next((fd for fd in fds if fd.name == "cri"), fds[0] if len(fds) == 1 else None)
    if chosen is None:
        raise ValueError(f"systemd passed {len(fds)} sockets ({', '.join(fd.name for fd in fds)}) and none is "
                         "named 'cri' (FileDescriptorName=cri in the socket unit)")
    sock = listening_unix_socket(chosen)
    bound = sock.getsockname()
    sock.detach()  # the fd stays open: the server takes it
    if bound != listen and os.path.realpath(bound) != os.path.realpath(listen):
        log.warning("systemd's socket is %s, not --koord-runtimeproxy-endpoint %s: serving systemd's", bound, listen)
    return chosen.fd


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        host, port = _split_host_port(args.metrics_bind_address)
    except ValueError:
        print(f"koord-runtime-proxy: bad --metrics-bind-address {args.metrics_bind_address!r}", file=sys.stderr)
        return 2
    backend = args.remote_runtime_service_endpoint.removeprefix("unix://")
    listen = args.koord_runtimeproxy_endpoint.removeprefix("unix://")
    notifier = Notifier()  # read before anything can fail, so that a failed start is not left to time out
    try:
        listen_fd = _systemd_socket(listen)
    except (ValueError, OSError) as err:
        print(f"koord-runtime-proxy: bad socket from systemd: {err}", file=sys.stderr)
        return 1
    try:
        version = probe_version(backend, args.backend_probe_timeout)
    except ConnectionError as err:
        print(f"koord-runtime-proxy: container runtime at {backend} is not reachable: {err}", file=sys.stderr)
        return 1
    log.info("runtime at %s: %s", backend, version)
    options = ProxyOptions(
        listen_path=listen,
        backend_path=backend,
        skip_label_key=args.runtime_hook_server_key,
        skip_label_value=args.runtime_hook_server_val,
        metrics_host=host,
        metrics_port=port,
        drain_timeout_s=args.drain_timeout,
        hook_config_dir=args.runtime_hook_config_dir,
        hook_timeout_s=args.runtime_hook_timeout,
        checkpoint_path=args.store_checkpoint_path or None,
        store_gc_interval_s=args.store_gc_interval,
        max_message_bytes=args.max_recv_message_size,
        handshake_timeout_s=args.handshake_timeout,
        stall_timeout_s=args.stall_timeout,
        listen_fd=listen_fd,
    )
    try:
        uvloop.run(ProxyServer(options, notifier=notifier).run())
    except StartupError as err:
        print(f"koord-runtime-proxy: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
