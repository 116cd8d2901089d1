"""The audit log: Koordinator's event lines, rotation within the disk space, verbosity, the newest-first reader
across rotated files, the ``/events`` handler's paging (tokens, limits, expiry) and filters, and the plan
runner auditing what it really wrote, its resctrl actions and its evictions, with the plan's figures."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes.client
import pytest

from koordlet import audit
from koordlet.actuator import PlanRunner
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.plan import CgroupWrite, Evictions, Plan, ResctrlGroup, ResctrlWrite, Victim, WriteStep
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from tests.koordlet.qosmanager.factory import seed_pod
from tests.support.apiserver import ApiServer

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CID = "c0ffee" * 10 + "c0de"  # a 64-hex container id, the container's cgroupfs dir name


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def _auditor(tmp_path: Path, **overrides: int) -> tuple[audit.Auditor, _Clock]:
    clock = _Clock()
    return audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "log"), **overrides), clock), clock


def _lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "log/audit.log").read_text().splitlines()]


def test_defaults_are_koordinators() -> None:
    config = audit.AuditConfig()
    assert (config.log_dir, config.verbose, config.max_disk_space_mb) == ("/var/log/koordlet", 3, 16)
    assert (config.max_concurrent_readers, config.default_events_limit, config.max_events_limit) == (4, 256, 2048)
    assert config.max_file_size_bytes == 2 << 20 and config.max_files == 8
    with pytest.raises(audit.AuditConfigError):
        audit.AuditConfig(max_disk_space_mb=1)


def test_an_event_is_one_json_line_with_koordinators_fields_and_levels_above_verbose_are_dropped(
        tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    auditor.log(audit.LEVEL_EVICTION, audit.Owner(audit.TYPE_POD, "ns", "web", "main"), "BEMemoryEvict", "why")
    auditor.log(audit.LEVEL_TASKS, audit.NODE, "ApplyTasks", "not written at verbose 3")
    auditor.log(audit.LEVEL_UPDATE, audit.NODE, "AdjustBEByNodeCPUUsage", "figures")
    (pod, node) = _lines(tmp_path)
    assert pod == {"createdAt": "2026-03-01T12:00:01+00:00", "type": "pod", "namespace": "ns", "name": "web",
                   "container": "main", "reason": "BEMemoryEvict", "message": "why"}
    assert node == {"createdAt": "2026-03-01T12:00:02+00:00", "type": "node", "reason": "AdjustBEByNodeCPUUsage",
                    "message": "figures"}
    assert audit.Event.from_json(json.dumps(pod).encode()).created_at == T0 + timedelta(seconds=1)
    assert oct((tmp_path / "log").stat().st_mode & 0o777) == "0o755"


def test_the_log_rotates_and_stays_within_its_disk_space(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path, max_disk_space_mb=2, max_file_size_bytes=256 << 10)  # 8 files
    message = "x" * 1000
    for i in range(3000):  # ~3 MB of events
        auditor.log(audit.LEVEL_UPDATE, audit.NODE, "Fill", f"{i} {message}")
    files = sorted(os.listdir(tmp_path / "log"))
    assert "audit.log" in files and len(files) == 8
    assert all(name == "audit.log" or (name.startswith("audit-2026-03-01-12-") and name.endswith("-0.log"))
               for name in files)
    total = sum((tmp_path / "log" / name).stat().st_size for name in files)
    assert total <= 2 << 20
    events = audit.read_events(str(tmp_path / "log"))
    numbers = [int(e.message.split()[0]) for e in events]
    assert numbers[0] == 2999 and numbers == sorted(numbers, reverse=True)  # newest first, none lost inside
    assert numbers == list(range(2999, 2999 - len(numbers), -1))


def test_rotated_files_keep_their_order_across_a_dst_fall_back_and_a_clock_set_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """America/New_York, 2025-11-02: 01:00-01:59 comes twice (EDT, then EST). With names in local time the file
    rotated at 01:10 EST (the newest) would sort before the one of 01:50 EDT and be the next one removed."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        moments = iter([datetime(2025, 11, 2, 5, 50, tzinfo=UTC) + timedelta(minutes=10 * i) for i in range(6)]
                       + [datetime(2025, 11, 2, 5, 0, tzinfo=UTC)] * 2)  # then the clock is set back an hour
        config = audit.AuditConfig(log_dir=str(tmp_path / "log"), max_disk_space_mb=1, max_file_size_bytes=100 << 10)
        log = audit.EventLog(config, clock=lambda: next(moments).astimezone())  # local time, as by default
        line = "x" * 1000
        for i in range(8 * 100):  # 8 rotations of 100 events; config.max_files is 10
            log.log(audit.LEVEL_UPDATE, audit.Event(T0, message=f"{i} {line}"))
        log.close()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    names = [os.path.basename(path) for path in audit.rotated_files(str(tmp_path / "log"))]
    assert names == ["audit-2025-11-02-05-50-00-0.log", "audit-2025-11-02-06-00-00-0.log",
                     "audit-2025-11-02-06-10-00-0.log", "audit-2025-11-02-06-20-00-0.log",
                     "audit-2025-11-02-06-30-00-0.log", "audit-2025-11-02-06-40-00-0.log",
                     "audit-2025-11-02-06-40-00-1.log", "audit-2025-11-02-06-40-00-2.log"]
    numbers = [int(e.message.split()[0]) for e in audit.read_events(str(tmp_path / "log"))]
    assert numbers == list(range(799, -1, -1))  # newest first, none lost
    # two more rotations: the two oldest files go, never a newer one
    log = audit.EventLog(config, clock=lambda: datetime(2025, 11, 2, 7, tzinfo=UTC))
    for i in range(800, 1000):
        log.log(audit.LEVEL_UPDATE, audit.Event(T0, message=f"{i} {line}"))
    log.close()
    numbers = [int(e.message.split()[0]) for e in audit.read_events(str(tmp_path / "log"))]
    assert numbers == list(range(999, 999 - len(numbers), -1)) and len(numbers) >= 800


def test_the_owner_index_is_rebuilt_whole_while_other_threads_resolve() -> None:
    """Two lists of pods take turns; every resolving thread always finds its pod (a shared index cleared and
    refilled by another thread would answer \"pod<uid>\" with no name meanwhile)."""
    lists = [tuple(PodMeta(f"p{i}", "ns", f"{i:04d}") for i in range(200)) + (PodMeta("web", "ns", "1234"),)
             for _ in range(2)]
    turn = [0]

    def pods() -> tuple[PodMeta, ...]:
        turn[0] += 1
        return lists[turn[0] % 2]

    resolve = audit.pod_owner_resolver(pods)
    wrong: list[audit.Owner] = []

    def work() -> None:
        for _ in range(2000):
            owner = resolve("kubepods/besteffort/pod1234")
            if owner.name != "web":
                wrong.append(owner)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not wrong, wrong[:3]


def test_a_line_that_is_not_an_event_is_skipped(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    auditor.log(audit.LEVEL_UPDATE, audit.NODE, "A", "first")
    with open(tmp_path / "log/audit.log", "ab") as f:
        f.write(b"{not json\n[1,2]\n")
    auditor.log(audit.LEVEL_UPDATE, audit.NODE, "B", "second")
    assert [e.message for e in audit.read_events(str(tmp_path / "log"))] == ["second", "first"]


def _fill(auditor: audit.Auditor, count: int) -> None:
    for i in range(count):
        owner = audit.Owner(audit.TYPE_POD, "ns", f"pod-{i % 3}") if i % 2 else audit.NODE
        auditor.log(audit.LEVEL_UPDATE, owner, "R", f"event {i}")


def _json_page(handler: audit.EventsHandler, **query: str) -> tuple[int, dict]:
    answer = handler({k: [v] for k, v in query.items()}, ["application/json"])
    return answer.status, json.loads(answer.body) if answer.status == 200 else {}


def test_pages_go_newest_first_and_a_token_continues_until_the_end(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    _fill(auditor, 26)
    handler = auditor.handler
    status, page = _json_page(handler, size="10")
    assert status == 200 and [e["message"] for e in page["Events"]] == [f"event {i}" for i in range(25, 15, -1)]
    token = page["NextPageToken"]
    auditor.log(audit.LEVEL_UPDATE, audit.NODE, "R", "after the reading started")  # not in this reading
    _, page = _json_page(handler, size="1", pageToken=token)
    assert [e["message"] for e in page["Events"]] == ["event 15"] and page["NextPageToken"] == token
    seen = []
    while True:
        _, page = _json_page(handler, size="5", pageToken=token)
        seen += [e["message"] for e in page["Events"]]
        if not page["NextPageToken"]:
            break
    assert seen == [f"event {i}" for i in range(14, -1, -1)]
    assert handler({"pageToken": [token]}, []).status == 200  # still known: an empty last page


def test_text_answers_one_line_per_event_and_the_token_in_a_header(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    _fill(auditor, 5)
    answer = auditor.handler({"size": ["3"]}, ["text/html"])
    lines = answer.body.decode().splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["event 4", "event 3", "event 2"]
    assert answer.headers["Next-Page-Token"]
    last = auditor.handler({"size": ["3"], "pageToken": [answer.headers["Next-Page-Token"]]}, [])
    assert len(last.body.decode().splitlines()) == 2 and "Next-Page-Token" not in last.headers


def test_bad_queries_get_koordinators_status_codes(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    _fill(auditor, 3)
    handler = auditor.handler
    assert handler({"size": ["2049"]}, []).status == 400
    assert b"exceeds the limit(2048)" in handler({"size": ["2049"]}, []).body
    assert handler({"size": ["-1"]}, []).status == 400
    assert handler({"size": ["ten"]}, []).status == 400
    assert handler({"pageToken": ["not-a-token"]}, []).status == 409
    assert handler({"since": ["yesterday"]}, []).status == 400
    assert handler({"pod": ["a/b/c"]}, []).status == 400


def test_readers_expire_after_their_ttl_and_beyond_the_concurrent_maximum(tmp_path: Path) -> None:
    now = [0.0]
    config = audit.AuditConfig(log_dir=str(tmp_path / "log"))
    audit.EventLog(config).log(0, audit.Event(T0, message="x"))
    handler = audit.EventsHandler(config, clock=lambda: now[0])
    tokens = [handler({"size": ["0"]}, []).headers["Next-Page-Token"] for _ in range(5)]
    assert handler({"pageToken": [tokens[0]]}, []).status == 409  # the oldest of five went
    assert all(handler({"size": ["0"], "pageToken": [t]}, []).status == 200 for t in tokens[1:])
    now[0] += 601
    assert handler({"pageToken": [tokens[1]]}, []).status == 409


def test_filters_keep_one_pods_events_within_a_time_range(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    _fill(auditor, 12)  # event i at T0 + i + 1 s; odd events belong to pod-(i % 3)
    status, page = _json_page(auditor.handler, pod="ns/pod-1")
    assert [e["message"] for e in page["Events"]] == ["event 7", "event 1"]
    _, page = _json_page(auditor.handler, namespace="ns", since=(T0 + timedelta(seconds=6)).isoformat(),
                         until=str((T0 + timedelta(seconds=10)).timestamp()))
    assert [e["message"] for e in page["Events"]] == ["event 9", "event 7", "event 5"]
    _, page = _json_page(auditor.handler, pod="pod-2", size="1")
    assert [e["message"] for e in page["Events"]] == ["event 11"] and page["NextPageToken"]
    _, page = _json_page(auditor.handler, pageToken=page["NextPageToken"])
    assert [e["message"] for e in page["Events"]] == ["event 5"] and not page["NextPageToken"]


def _tree(tmp_path: Path) -> ResourceExecutor:
    base = tmp_path / "sys/fs/cgroup/cpu/kubepods/besteffort"
    for rel in ("", "pod1234", f"pod1234/{CID}"):
        (base / rel).mkdir(parents=True, exist_ok=True)
        (base / rel / "cpu.cfs_quota_us").write_text("-1\n")
    resctrl = tmp_path / "resctrl"
    (resctrl / "BE").mkdir(parents=True)
    (resctrl / "BE/schemata").write_text("")
    return ResourceExecutor(CgroupFS(str(tmp_path / "sys/fs/cgroup"), CgroupVersion.V1), resctrl_root=str(resctrl))


def test_the_runner_audits_what_it_wrote_with_the_plans_figures_and_the_owner(tmp_path: Path) -> None:
    auditor, _ = _auditor(tmp_path)
    pod = PodMeta("web", "ns", "1234", containers=(ContainerMeta("main", CID),))
    auditor.set_owner_resolver(audit.pod_owner_resolver(lambda: (pod,)))
    runner = PlanRunner(_tree(tmp_path), auditor=auditor)
    plan = Plan(steps=(WriteStep((CgroupWrite("cpu.cfs_quota_us", "kubepods/besteffort", 20000),)),
                       WriteStep((CgroupWrite("cpu.cfs_quota_us", f"kubepods/besteffort/pod1234/{CID}", 10000),),
                                 reason="CFSQuotaBurst", why="throttled 0.40")),
                resctrl=(ResctrlGroup("BE"), ResctrlWrite("BE", "schemata", "L3:0=f\n")),
                reason="AdjustBEByNodeCPUUsage", why="BE budget 0.20 cores")
    runner.run(plan, "cpusuppress")
    runner.run(plan, "cpusuppress")  # the same values again: skipped by the executor, nothing audited
    events = list(reversed(audit.read_events(str(tmp_path / "log"))))
    assert [(e.type, e.name, e.container, e.reason) for e in events] == [
        ("node", "", "", "AdjustBEByNodeCPUUsage"), ("pod", "web", "main", "CFSQuotaBurst"),
        ("group", "resctrl", "", "AdjustBEByNodeCPUUsage"), ("group", "resctrl", "", "AdjustBEByNodeCPUUsage")]
    assert events[0].message == ("cpu.cfs_quota_us of kubepods/besteffort to 20000 by cpusuppress: "
                                 "BE budget 0.20 cores")
    assert events[1].message.endswith("to 10000 by cpusuppress: throttled 0.40")
    assert events[3].message == "resctrl BE schemata to 'L3:0=f' by cpusuppress: BE budget 0.20 cores"
    assert PlanRunner(_tree(tmp_path / "other"), auditor=None).run(plan, "x").written == 2  # no audit, no error


def test_an_eviction_is_audited_with_its_outcome_and_figures(
        tmp_path: Path, server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    auditor, _ = _auditor(tmp_path)
    free = seed_pod(server, "free", "BE", "BestEffort", app="free")
    runner = PlanRunner(_tree(tmp_path), Evictor("node-1", api_client=api_client), auditor=auditor)
    victims = (Victim(free, 300.0, "node memory usage 72% >= threshold 70%"),)
    runner.run(Plan(evictions=(Evictions("BEMemoryEvict", 200.0, victims),)), "memoryevict")
    (event,) = audit.read_events(str(tmp_path / "log"))
    assert (event.type, event.namespace, event.name, event.reason) == ("pod", "default", "free", "BEMemoryEvict")
    assert event.message == ("evicted by memoryevict to release 200 of which this pod holds 300: "
                             "node memory usage 72% >= threshold 70%")


def test_the_agents_auditor_is_used_once_installed(tmp_path: Path) -> None:
    runner = PlanRunner(_tree(tmp_path))
    plan = Plan(steps=(WriteStep((CgroupWrite("cpu.cfs_quota_us", "kubepods/besteffort", 30000),)),))
    auditor, _ = _auditor(tmp_path)
    audit.install(auditor)
    try:
        runner.run(plan, "reconciler")
    finally:
        audit.install(None)
    (event,) = audit.read_events(str(tmp_path / "log"))
    assert event.reason == "reconciler"
    assert event.message == "cpu.cfs_quota_us of kubepods/besteffort to 30000 by reconciler"
    assert audit.events_handler()({}, []).body == b""  # auditing off: an empty answer, as Koordinator's
