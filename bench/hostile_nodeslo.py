"""Hostile NodeSLO files against the file watcher: what each costs and how it ends.

Runs the watcher (``NodeSLOFileWatcher`` into a ``StatesInformer``) of the koordlet tree named by ``--code``
(default: this one), so the same script measures a before and an after:

    python bench/hostile_nodeslo.py [--code /path/to/old/tree] [--json]
    python bench/hostile_nodeslo.py --process [--code ...] [--json]   # the alias bomb on a koordlet process

For each hostile file: seconds until the watcher is done with it, RSS growth of this process, whether the
last good spec stayed, how it ended (``N log line(s)`` = rejected without a traceback, N rejection
lines within a second; ``traceback`` = an exception escaped into a log or a thread's excepthook; ``taken`` = the
file was applied), and the same file through one direct ``load_node_slo_file`` call. Then how many times the
watcher opened an unchanged file in 3 s (counted from the outside, by inotify open events). ``--process``
starts ``python -m koordlet.main`` in local mode on a private containerd and writes the alias bomb into its
NodeSLO file: RSS before/peak/after, and ``/healthz`` answers (2 s timeout) over 10 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GOOD = "resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: 55}\n"


def alias_bomb(levels: int = 8, width: int = 9) -> str:
    """Billion laughs: 8 levels of 9 aliases (~420 bytes naming 9**9 strings), aimed at a field the spec walks."""
    lines = [f"a0: &a0 [{','.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nresourceQOSStrategy: *a{levels}\n"


HOSTILE: dict[str, bytes] = {
    "alias_bomb.yaml": alias_bomb().encode(),
    "nested_lists.yaml": b"[" * 20000 + b"]" * 20000 + b"\n",
    "deep_mapping.yaml": ("x:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(200))).encode(),
    # the six values PyYAML's constructors refuse with ValueError
    "huge_integer.yaml": b"resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: "
                         + b"9" * 5000 + b"}\n",
    "bad_month.yaml": b"resourceUsedThresholdWithBE: {enable: 2026-13-45}\n",
    "february_30.yaml": b"resourceUsedThresholdWithBE: {enable: 2026-02-30}\n",
    "hour_25.yaml": b"resourceUsedThresholdWithBE: {enable: 2026-01-01 25:00:00}\n",
    "int_tag_not_a_number.yaml": b"resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: !!int abc}\n",
    "float_tag_not_a_number.yaml": b"resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: !!float abc}\n",
    "nul_byte.yaml": b"resourceUsedThresholdWithBE:\n  enable: \x00\n",
    "python_tag.yaml": b"spec: !!python/object/apply:os.system ['true']\n",
    "not_utf8.yaml": b"resourceUsedThresholdWithBE:\n  enable: \xff\xfe\n",
    "tab_indent.yaml": b"a:\n\t- b\n",
    "spec_is_a_list.yaml": b"kind: NodeSLO\napiVersion: v1\nspec: [1, 2]\n",
    "kind_is_a_number.yaml": b"kind: 5\napiVersion: v1\nspec: {}\n",
    "thresholds_list.yaml": b"resourceUsedThresholdWithBE: [1, 2]\n",
    "too_large.yaml": b"# " + b"x" * (1 << 20) + b"\n",
}


def _parse_once(path: Path) -> tuple[float, str]:
    """One direct ``load_node_slo_file`` call: seconds, and how it ended (the exception type or ``taken``)."""
    from koordlet.statesinformer.nodeslo_file import load_node_slo_file

    started = time.perf_counter()
    try:
        load_node_slo_file(str(path))
        ended = "taken"
    except Exception as exc:  # noqa: BLE001 - what escapes is what is measured
        ended = type(exc).__name__
    return time.perf_counter() - started, ended


def rss_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:")) / 1024


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")  # VmHWM := VmRSS (proc(5), clear_refs)


class _Outcomes(logging.Handler):
    """Log records and uncaught thread exceptions, to tell a counted rejection from a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.thread_errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def excepthook(self, args: threading.ExceptHookArgs) -> None:
        self.thread_errors.append(f"{args.exc_type.__name__}: {str(args.exc_value)[:100]}")

    def clear(self) -> None:
        self.records.clear()
        self.thread_errors.clear()


class _NoPods:
    name = "none"

    def list_pods(self) -> tuple:
        return ()


def _threshold(informer) -> int:  # type: ignore[no-untyped-def]
    return informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent


def hostile_files(directory: Path) -> list[dict]:
    from koordlet.api.nodeslo import default_node_slo_spec
    from koordlet.statesinformer.informer import StatesInformer
    from koordlet.statesinformer.nodeslo_file import NodeSLOFileWatcher

    outcomes = _Outcomes()
    logging.getLogger().addHandler(outcomes)
    logging.getLogger().setLevel(logging.INFO)
    threading.excepthook = outcomes.excepthook
    path = directory / "slo.yaml"
    path.write_text(GOOD)
    informer = StatesInformer(_NoPods(), count_error=lambda source: None, needs_node=False)
    watcher = NodeSLOFileWatcher(str(path), informer, settle_s=0.05)
    watcher.start()
    rows = []
    try:
        for name, content in HOSTILE.items():
            path.write_text(GOOD)
            time.sleep(0.3)
            outcomes.clear()
            _reset_peak_rss()
            before = rss_mib()
            started = time.monotonic()
            path.write_bytes(content)
            while time.monotonic() - started < 60.0 and not (
                    outcomes.records or outcomes.thread_errors or _threshold(informer) != 55):
                time.sleep(0.005)
            took = time.monotonic() - started - 0.05  # less the settle delay
            time.sleep(1.0)  # then one second more: a watcher that re-reads its file logs again
            tracebacks = [r for r in outcomes.records if r.exc_info] + outcomes.thread_errors
            rejected = [r for r in outcomes.records if "NodeSLO rejected" in r.getMessage()]
            if tracebacks:
                ended = "traceback"
            elif rejected:
                ended = f"{len(rejected)} log line(s)"
            else:
                ended = "taken" if _threshold(informer) != 55 or informer.node_slo() == default_node_slo_spec() \
                    else "nothing logged"
            one = directory / f"once-{name}"
            one.write_bytes(content)
            parse_s, parse_ended = _parse_once(one)
            rows.append({"file": name, "bytes": len(content), "seconds": round(max(took, 0.0), 3),
                         "parse_once_s": round(parse_s, 3), "parse_once_ended": parse_ended,
                         "rss_peak_growth_mib": round(rss_mib(field="VmHWM") - before, 1),
                         "last_good_kept": _threshold(informer) == 55,
                         "ended": ended, "error": (outcomes.thread_errors or [""])[0] or
                         next((r.getMessage()[:100] for r in outcomes.records if r.exc_info), "")})
    finally:
        watcher.stop()
        logging.getLogger().removeHandler(outcomes)
    return rows


def unchanged_file_opens(directory: Path, seconds: float = 3.0) -> int:
    """How many times the watcher opens its unchanged file in ``seconds``, seen by a separate inotify watch."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    from koordlet.statesinformer.informer import StatesInformer
    from koordlet.statesinformer.nodeslo_file import NodeSLOFileWatcher

    path = directory / "unchanged.yaml"
    path.write_text(GOOD)
    opens: list[float] = []

    class Count(FileSystemEventHandler):
        def on_opened(self, event) -> None:  # type: ignore[no-untyped-def]
            if os.fsdecode(event.src_path) == str(path):
                opens.append(time.monotonic())

    counter = Observer()
    counter.schedule(Count(), str(directory), recursive=False)
    counter.start()
    time.sleep(0.3)
    informer = StatesInformer(_NoPods(), count_error=lambda source: None, needs_node=False)
    watcher = NodeSLOFileWatcher(str(path), informer)
    try:
        watcher.start()
        time.sleep(seconds)
    finally:
        watcher.stop()
        counter.stop()
        counter.join(5)
    return len(opens)


def koordlet_process(directory: Path, code: Path) -> dict:
    """The alias bomb written into a running koordlet's NodeSLO file: its RSS and /healthz over 10 s."""
    import grpc

    from tests.support import stack
    from tests.support.containerd import Containerd
    from tests.support.stack import BE_ANNOTATIONS, BE_LABELS, KoordletProcess, http_get
    from wire import hookapi_pb2 as hookapi
    from wire import hookapi_pb2_grpc as hookapi_grpc

    stack.REPO = code  # the koordlet process runs (cwd, PYTHONPATH) the code measured

    containerd = Containerd(f"/run/koordlet-py/bench-slo-{os.getpid()}/containerd",
                            f"/var/lib/koordlet-py/bench-slo-{os.getpid()}/containerd")
    containerd.up()
    (directory / "slo.yaml").write_text(GOOD)
    (directory / "hooks").mkdir()
    koordlet = KoordletProcess(directory, containerd.socket, str(directory / "hooks"))
    try:
        koordlet.start()
        assert koordlet.proc is not None
        pid = koordlet.proc.pid
        time.sleep(2.0)
        before = rss_mib(pid)
        (directory / "slo.yaml").write_text(alias_bomb())
        peak, answered, failed, slowest = before, 0, 0, 0.0
        hooks_ok, hooks_failed, hook_slowest = 0, 0, 0.0
        request = hookapi.ContainerResourceHookRequest(
            pod_meta=hookapi.PodSandboxMetadata(name="job", namespace="ns", uid="u1"),
            container_meta=hookapi.ContainerMetadata(name="job"), pod_annotations=BE_ANNOTATIONS,
            pod_labels=BE_LABELS, pod_cgroup_parent="/kubepods/besteffort/podu1",
            container_resources=hookapi.LinuxContainerResources(cpu_period=100000))
        with grpc.insecure_channel(f"unix://{koordlet.hook_socket}") as channel:
            stub = hookapi_grpc.RuntimeHookServiceStub(channel)
            end = time.monotonic() + 10.0
            while time.monotonic() < end:
                started = time.monotonic()
                try:
                    ok = "ok" in http_get(f"http://127.0.0.1:{koordlet.port}/healthz", timeout_s=2.0)
                except OSError:
                    ok = False
                slowest = max(slowest, time.monotonic() - started)
                answered, failed = answered + ok, failed + (not ok)
                started = time.monotonic()
                try:
                    stub.PreCreateContainerHook(request, timeout=2.0)
                    hooks_ok += 1
                except grpc.RpcError:
                    hooks_failed += 1
                hook_slowest = max(hook_slowest, time.monotonic() - started)
                peak = max(peak, rss_mib(pid))
                time.sleep(0.25)
        log = koordlet.log_path.read_text(errors="replace")
        return {"bomb_bytes": len(alias_bomb()), "rss_before_mib": round(before, 1), "rss_peak_mib": round(peak, 1),
                "rss_after_10s_mib": round(rss_mib(pid), 1), "healthz_ok": answered, "healthz_failed": failed,
                "healthz_slowest_s": round(slowest, 2), "hook_calls_ok": hooks_ok, "hook_calls_failed": hooks_failed,
                "hook_call_slowest_s": round(hook_slowest, 2), "tracebacks_in_log": log.count("Traceback"),
                "rejection_lines_in_log": log.count("NodeSLO rejected")}
    finally:
        koordlet.kill()
        containerd.down()
        containerd.remove_dirs()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--process", action="store_true", help="the alias bomb against a real koordlet process")
    ap.add_argument("--code", type=Path, default=REPO, help="the koordlet tree to measure (default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    code = args.code.resolve()
    with tempfile.TemporaryDirectory(prefix="hostile-slo-") as tmp:
        if args.process:
            sys.path.insert(0, str(REPO))  # the test support of this tree starts the process
            result: dict = {"code": str(code), "process": koordlet_process(Path(tmp), code)}
        else:
            sys.path.insert(0, str(code))
            result = {"code": str(code), "files": hostile_files(Path(tmp)),
                      "unchanged_file_opens_in_3s": unchanged_file_opens(Path(tmp))}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"code: {code}")
    if "process" in result:
        for key, value in result["process"].items():
            print(f"  {key}: {value}")
        return 0
    for row in result["files"]:
        print(f"  {row['file']:28s} {row['bytes']:8d} B  watcher {row['seconds']:7.3f} s"
              f" RSS peak {row['rss_peak_growth_mib']:+6.1f} MiB kept {row['last_good_kept']!s:5s} {row['ended']:18s}"
              f" | one parse {row['parse_once_s']:7.3f} s {row['parse_once_ended']:16s} {row['error'][:60]}")
    print(f"  unchanged file opened {result['unchanged_file_opens_in_3s']} times in 3 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
