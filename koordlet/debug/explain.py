"""``koordlet explain <namespace>/<name>``: why a pod has the settings it has, for a person.

It asks a node's koordlet for ``/debug/pods/<namespace>/<name>`` (and ``/debug/nodeslo``) and prints them: what
each hook plugin answered when the pod and its containers were created, the values in their cgroup files now,
the last things koordlet did to them and to their QoS dirs, and the QoS strategies with the one that acts next.

    koordlet explain default/batch-job                        # koordlet on this node, local mode (loopback)
    koordlet explain default/batch-job --server http://10.0.0.7:9316 --token-file token
    koordlet explain default/batch-job --server https://node-1:9316 --ca-file ca.crt --token-file token

With an API server, the endpoint wants a bearer token of a user allowed to ``get`` ``nodes/proxy`` of that node
(``kubectl create token <service account>``); ``--json`` prints the endpoint's answer as it came. An ``https://``
server (koordlet with ``-tls-cert-file``) is verified against ``--ca-file`` (else the system's CAs).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO

DEFAULT_SERVER = "http://127.0.0.1:9316"
TIMEOUT_S = 10.0


class ExplainError(Exception):
    """The node's koordlet could not be asked, or refused (the message says why and what to do)."""


def fetch(server: str, path: str, token: str = "", ca_file: str = "") -> Any:
    request = urllib.request.Request(server.rstrip("/") + path, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        context = ssl.create_default_context(cafile=ca_file or None) if server.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace").strip()
        hint = {401: " (give --token or --token-file)", 403: " (the token's user needs get on nodes/proxy)"}
        raise ExplainError(f"{server}{path}: {err.code} {detail}{hint.get(err.code, '')}") from err
    except (urllib.error.URLError, OSError) as err:
        raise ExplainError(f"cannot reach koordlet at {server}: {getattr(err, 'reason', err)}") from err
    except ValueError as err:
        raise ExplainError(f"{server}{path}: not JSON: {err}") from err


def _fields(changes: dict[str, Any] | None) -> str:
    if not changes:
        return "no change"
    return ", ".join(f"{key}={value}" for key, value in changes.items())


def _hook_record(out: list[str], title: str, record: dict[str, Any] | None) -> None:
    if record is None:
        out.append(f"  {title}: nothing recorded (created before koordlet started and not reconciled yet, or the "
                   "pod skips koordlet's hooks)")
        return
    out.append(f"  {title}: {record['stage']} via {record['by']} at {record['at']}")
    if record["note"]:
        out.append(f"    {record['note']}")
    for answer in record["plugins"]:
        said = f"skipped: {answer['error']}" if answer["error"] else _fields(answer["answered"])
        out.append(f"    {answer['plugin']:<18} {said}")
    for rejected in record["rejected"]:
        out.append(f"    dropped {rejected['key']}={rejected['value']}: {rejected['reason']}")
    if record["note"] == "":
        out.append(f"    => {_fields(record['result'])}")


def render(pod: dict[str, Any], slo: dict[str, Any] | None = None) -> str:
    """The endpoint's answer as text."""
    info = pod["pod"]
    out = [f"Pod {info['namespace']}/{info['name']} (uid {info['uid']}) on node {pod['node']}",
           f"  QoS {info['qosClass']}, kube QoS {info['kubeQoS'] or '?'}, phase {info['phase'] or '?'}"
           + (", skips koordlet's hooks (label runtimeproxy.koordinator.sh/skip-hookserver)" if info["skipsHooks"]
              else "")]
    origin = pod["nodeSLO"]
    where = {"apiserver": f"NodeSLO {origin['detail']} (resourceVersion {origin['resourceVersion']})",
             "file": f"file {origin['path']} ({origin['detail']})"}.get(origin["source"],
                                                                         f"defaults ({origin['detail']})")
    out.append(f"  NodeSLO from {where}")
    if slo is not None and slo.get("lastRejected"):
        out.append(f"  a newer NodeSLO was refused at {slo['lastRejected']['at']}: {slo['lastRejected']['reason']}")

    hooks = pod["hooks"]
    out.append("\nHook plugins at creation:")
    if not hooks["running"]:
        out.append("  koordlet's runtime hooks are not running on this node")
    else:
        _hook_record(out, "pod", hooks["pod"])
        for name, record in hooks["containers"].items():
            _hook_record(out, f"container {name}", record)
    if hooks["notRun"]:
        out.append("  not run: " + ", ".join(f"{item['plugin']} ({item['why']})" for item in hooks["notRun"]))

    out.append("\nCgroup files now:")
    for cgroup in pod["cgroups"]:
        title = "pod" if cgroup["level"] == "pod" else f"container {cgroup['container']}"
        out.append(f"  {title} ({cgroup['cgroupVersion']} {cgroup['dir']}):")
        out += [f"    {name} = {value}" for name, value in cgroup["values"].items()] or ["    (no files readable)"]

    out.append("\nLast actions on the pod and its QoS dirs (newest first):")
    for action in pod["actions"] or ():
        reason = f" [{action['reason']}]" if action["reason"] else ""
        out.append(f"  {action['at']} {action['by']}: {action['what']} ({action['where']}){reason}")
        if action["why"]:
            out.append(f"      {action['why']}")
    if not pod["actions"]:
        out.append("  none recorded")

    out.append("\nQoS strategies:")
    for row in pod["strategies"]:
        state = {True: "on", False: "off by NodeSLO", None: "not run yet"}[row["active"]]
        touches = ", its last plan touched this pod" if row["touchesPod"] else ""
        out.append(f"  {row['name']:<12} {state}, every {row['intervalS']:g} s, next in {row['nextInS']:.1f} s"
                   f"{touches}")
        if row["touchesPod"] and (row["lastReason"] or row["lastWhy"]):
            out.append(f"      {row['lastReason']}: {row['lastWhy']}".rstrip(": "))
    if not pod["strategies"]:
        out.append("  the QoS manager is not running on this node")
    out.append(f"Next to act on this pod: {pod['next'] or 'none of the active strategies touched it last time'}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koordlet explain", description="Why a pod has the settings it has.")
    parser.add_argument("pod", metavar="NAMESPACE/NAME")
    parser.add_argument("--server", default=DEFAULT_SERVER, help=f"koordlet's address (default {DEFAULT_SERVER})")
    parser.add_argument("--token", default="", help="bearer token of a user allowed to get nodes/proxy")
    parser.add_argument("--token-file", default="", help="file holding that token")
    parser.add_argument("--ca-file", default="",
                        help="CA certificates an https:// server's certificate must chain to (the cluster's CA, or "
                             "the node's kubelet.crt when kubelet signed its own)")
    parser.add_argument("--json", action="store_true", help="print the endpoint's JSON")
    args = parser.parse_args(argv)
    out = stdout or sys.stdout
    namespace, _, name = args.pod.partition("/")
    if not namespace or not name:
        parser.error("give the pod as NAMESPACE/NAME")
    token = args.token
    try:
        if args.token_file:
            with open(args.token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        path = f"/debug/pods/{urllib.parse.quote(namespace, safe='')}/{urllib.parse.quote(name, safe='')}"
        pod = fetch(args.server, path, token, args.ca_file)
        if args.json:
            out.write(json.dumps(pod, indent=2) + "\n")
            return 0
        out.write(render(pod, fetch(args.server, "/debug/nodeslo", token, args.ca_file)))
    except (ExplainError, OSError) as err:
        print(f"koordlet explain: {err}", file=sys.stderr)
        return 1
    return 0
