"""procfs readers: fixture files in the kernel's real formats, plus the live /proc of this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from koordlet.system import procfs

# Copied from this machine's /proc/stat (Linux 6.18), intr line shortened.
PROC_STAT = b"""cpu  8970 3 2260 664876 348 7 113 165 0 0
cpu0 1416 1 733 336040 100 3 53 123 0 0
cpu1 7553 2 1527 328836 247 4 60 42 0 0
intr 260400 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 8 0 0 0 0 677 60 0 67 1 33009 0 4169
ctxt 383259
btime 1795414421
processes 4939
procs_running 3
procs_blocked 0
softirq 194839 0 38600 5 6981 33009 0 3 90230 0 26011
"""

MEMINFO = b"""MemTotal:       24683656 kB
MemFree:        24416956 kB
MemAvailable:   24382920 kB
Buffers:             760 kB
Cached:            99768 kB
SwapCached:            0 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""

# Linux Documentation/accounting/psi.rst format.
PSI_MEMORY = b"""some avg10=0.54 avg60=0.36 avg300=0.24 total=5644114
full avg10=0.10 avg60=0.05 avg300=0.01 total=2227822
"""
PSI_CPU_OLD_KERNEL = b"some avg10=1.50 avg60=0.75 avg300=0.25 total=123\n"


def _write(root: Path, rel: str, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_proc_stat_busy_ticks_exclude_idle_iowait_and_steal(tmp_path: Path) -> None:
    _write(tmp_path, "stat", PROC_STAT)
    stat = procfs.read_proc_stat(str(tmp_path))
    # user+nice+system+irq+softirq = 8970+3+2260+7+113
    assert stat.node.busy_ticks == 11353
    assert stat.node.total_ticks == 8970 + 3 + 2260 + 664876 + 348 + 7 + 113 + 165
    assert [cpu for cpu, _ in stat.per_cpu] == [0, 1]
    assert stat.per_cpu[1][1].busy_ticks == 7553 + 2 + 1527 + 4 + 60


def test_proc_stat_without_cpu_line_is_a_parse_error() -> None:
    with pytest.raises(procfs.ProcParseError):
        procfs.parse_proc_stat(b"intr 1 2 3\nctxt 5\n")


def test_meminfo_converts_kb_to_bytes_and_usage_is_total_minus_available(tmp_path: Path) -> None:
    _write(tmp_path, "meminfo", MEMINFO)
    info = procfs.read_meminfo(str(tmp_path))
    assert info.mem_total_bytes == 24683656 * 1024
    assert info.mem_available_bytes == 24382920 * 1024
    assert info.used_bytes == (24683656 - 24382920) * 1024
    assert info.used_with_page_cache_bytes == (24683656 - 24416956) * 1024
    assert procfs.parse_meminfo_fields(MEMINFO)["HugePages_Total"] == 0


def test_meminfo_without_memavailable_falls_back_to_free_buffers_cached() -> None:
    info = procfs.parse_meminfo(b"MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 50 kB\n")
    assert info.mem_available_bytes == 160 * 1024


def test_psi_parses_some_and_full_lines(tmp_path: Path) -> None:
    _write(tmp_path, "pressure/memory", PSI_MEMORY)
    psi = procfs.read_psi(procfs.node_psi_path("memory", str(tmp_path)))
    assert psi.some == procfs.PsiLine(avg10=0.54, avg60=0.36, avg300=0.24, total_us=5644114)
    assert psi.full is not None and psi.full.total_us == 2227822


def test_psi_without_full_line_reports_none() -> None:
    psi = procfs.parse_psi(PSI_CPU_OLD_KERNEL)
    assert psi.full is None and psi.some.avg10 == 1.5


@pytest.mark.parametrize("bad", [b"", b"some avg10=x avg60=1 avg300=1 total=1\n", b"weird 1\n", b"some avg10\n"])
def test_psi_rejects_malformed_files(bad: bytes) -> None:
    with pytest.raises(procfs.ProcParseError):
        procfs.parse_psi(bad)


def test_node_psi_supported_is_false_without_pressure_dir(tmp_path: Path) -> None:
    assert procfs.node_psi_supported(str(tmp_path)) is False
    _write(tmp_path, "pressure/cpu", PSI_CPU_OLD_KERNEL)
    assert procfs.node_psi_supported(str(tmp_path)) is True


def test_pid_cpu_ticks_handles_spaces_and_parens_in_command_name() -> None:
    line = b"4940 (my (odd) cmd) R 4894 4894 3497 0 -1 4194304 98 0 0 0 17 5 0 0 20 0 1 0 338851 3133440 358\n"
    assert procfs.parse_pid_cpu_ticks(line) == 22


def test_kept_file_rereads_fresh_content_and_grows_its_buffer(tmp_path: Path) -> None:
    path = tmp_path / "big"
    big = b"x" * 200_000
    path.write_bytes(big)
    kept = procfs.KeptFile(str(path))
    try:
        assert kept.read() == big
        path.write_bytes(b"small\n")
        assert kept.read() == b"small\n"
    finally:
        kept.close()


def test_read_file_bytes_reads_files_larger_than_one_chunk(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"y" * 150_000)
    assert procfs.read_file_bytes(str(path)) == b"y" * 150_000


def test_live_proc_stat_through_kept_file_advances() -> None:
    kept = procfs.KeptFile("/proc/stat")
    try:
        first = procfs.parse_proc_stat(kept.read())
        time.sleep(0.05)
        second = procfs.parse_proc_stat(kept.read())
    finally:
        kept.close()
    assert second.node.total_ticks > first.node.total_ticks
    assert len(first.per_cpu) == os.cpu_count()


def test_live_meminfo_and_clock_ticks_are_sane() -> None:
    info = procfs.read_meminfo()
    assert 0 < info.used_bytes < info.mem_total_bytes
    assert procfs.clock_ticks_per_second() == os.sysconf("SC_CLK_TCK")


def test_live_pid_cpu_ticks_of_a_burning_child_grow() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        first = procfs.read_pid_cpu_ticks(child.pid)
        time.sleep(0.3)
        second = procfs.read_pid_cpu_ticks(child.pid)
    finally:
        child.kill()
        child.wait()
    assert second > first


def test_kept_files_reuse_descriptors_up_to_the_budget(tmp_path: Path) -> None:
    paths = []
    for index in range(3):
        path = tmp_path / f"f{index}"
        path.write_bytes(b"%d\n" % index)
        paths.append(str(path))
    files = procfs.KeptFiles(max_open=2)
    try:
        assert [files.read(p) for p in paths] == [b"0\n", b"1\n", b"2\n"]
        assert len(files) == 2  # the third file was read without keeping a descriptor
        Path(paths[0]).write_bytes(b"changed\n")  # same inode, new content
        assert files.read(paths[0]) == b"changed\n"
        files.forget([paths[0]])
        assert len(files) == 1
        assert files.read(paths[2]) == b"2\n" and len(files) == 2
    finally:
        files.close()
    assert len(files) == 0


def test_kept_files_read_large_files_in_full_and_missing_ones_raise(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"z" * 100_000)
    files = procfs.KeptFiles()
    try:
        assert files.read(str(big)) == b"z" * 100_000
        with pytest.raises(FileNotFoundError):
            files.read(str(tmp_path / "missing"))
    finally:
        files.close()
