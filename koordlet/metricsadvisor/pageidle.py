"""The cold page collector's page-idle passes, in their own thread (``coldpage-scan``), so that the collectors'
single thread and the QoS snapshot they feed never wait for one.

A pass reads the bitmap, ``/proc/kpageflags`` and ``/proc/kpagecgroup`` for every page frame (16 bytes a page and
the kernel's work per page: 2 GiB on a 512 GiB node) to count the file pages left idle since the previous pass,
then marks every page idle again through the executor. Both halves go a chunk of
:data:`~koordlet.system.coldpage.CHUNK_PAGES` pages at a time (about 1 MiB read); after each chunk the thread pauses
so that the pass takes at most ``cpu_share`` of one CPU (its own CPU time, kernel time included, measured per
chunk), and a stop is seen within one chunk. The collector asks for a pass (:meth:`PageIdleScanner.request`) once
per cold age and reads the last finished count (:attr:`PageIdleScanner.latest`), which the thread replaces
whole: one writer, readers take a reference.

Thread: started by the first request, stopped by :meth:`PageIdleScanner.stop` (the collector's ``close``); it
blocks only on its own reads and marks and on its pauses, and owns the descriptors of the pass under way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from koordlet import audit
from koordlet.system.coldpage import CHUNK_PAGES, IdlePages, IdleScan
from koordlet.ticker import join_thread

logger = logging.getLogger(__name__)

DEFAULT_CPU_SHARE = 0.25
THREAD_NAME = "coldpage-scan"

Mark = Callable[[int, int], int]  # (first page, pages) -> pages covered, 0 past the end: the executor's mark


@dataclass(frozen=True, slots=True)
class PassStats:
    """The last finished pass: page frames read and marked, its wall time, its thread's CPU time (kernel time
    included), and the longest chunk (CPU seconds) between two pauses."""

    counted_pages: int
    marked_pages: int
    seconds: float
    cpu_seconds: float
    longest_chunk_cpu_s: float


class _Stopped(Exception):
    pass


class PageIdleScanner:
    def __init__(self, sys_dir: str, proc_dir: str, mark: Mark, cpu_share: float = DEFAULT_CPU_SHARE) -> None:
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu share {cpu_share} outside (0, 1]")
        self._sys_dir = sys_dir
        self._proc_dir = proc_dir
        self._mark = mark
        self._cpu_share = cpu_share
        self._lock = threading.Lock()  # guards the request flags and the thread handle
        self._wanted: bool | None = None  # a pass asked for (True: count before marking)
        self._busy = False
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.latest: IdlePages | None = None  # the last count (replaced whole by the thread)
        self.last_pass: PassStats | None = None
        self.passes = 0
        self._failing = False

    # -- the collector's side ------------------------------------------------------------------------------------
    def request(self, count: bool) -> bool:
        """Ask for a pass (``count``: count the idle pages before marking them again); False while one is under
        way or asked for already."""
        with self._lock:
            if self._busy or self._wanted is not None or self._stop.is_set():
                return False
            self._wanted = count
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
        self._wake.set()
        return True

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._busy or self._wanted is not None

    def stop(self, timeout_s: float = 5.0) -> bool:
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread, self._thread = self._thread, None
        return join_thread(thread, THREAD_NAME, timeout_s)

    # -- the thread ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                count, self._wanted = self._wanted, None
                self._busy = count is not None
            if count is None:
                continue
            try:
                self._pass(count)
            except _Stopped:
                return
            except Exception as err:  # noqa: BLE001 - a daemon loop: log, keep the last count, go on
                if not self._failing:
                    logger.warning("page-idle pass failed (the last count stands): %s", err)
                self._failing = True
            else:
                if self._failing:
                    logger.info("page-idle passes work again")
                self._failing = False
            finally:
                with self._lock:
                    self._busy = False

    def _pass(self, count: bool) -> None:
        started, cpu_started = time.monotonic(), time.thread_time()
        longest = 0.0
        counted = 0
        if count:
            with IdleScan(self._sys_dir, self._proc_dir) as scan:
                while True:
                    chunk_cpu = time.thread_time()
                    if not scan.step():
                        break
                    longest = max(longest, self._pace(chunk_cpu))
                self.latest = scan.result()
                counted = scan.next_page
        marked = 0
        while True:
            chunk_cpu = time.thread_time()
            covered = self._mark(marked, CHUNK_PAGES)
            if covered <= 0:
                break
            marked += covered
            longest = max(longest, self._pace(chunk_cpu))
        stats = PassStats(counted, marked, time.monotonic() - started, time.thread_time() - cpu_started, longest)
        self.last_pass = stats
        self.passes += 1
        logger.debug("page-idle pass: %s", stats)
        auditor = audit.current()
        if auditor is not None and auditor.wants(audit.LEVEL_TASKS):
            auditor.log(audit.LEVEL_TASKS, audit.NODE, "ColdPageMark",
                        f"page_idle/bitmap: {marked} page frames marked idle by coldpage in {stats.seconds:.1f} s")

    def _pace(self, chunk_cpu_started: float) -> float:
        """Pause after a chunk so the pass stays within its CPU share; the chunk's CPU seconds."""
        spent = time.thread_time() - chunk_cpu_started
        pause = spent * (1 - self._cpu_share) / self._cpu_share
        if self._stop.wait(pause) if pause > 0 else self._stop.is_set():
            raise _Stopped
        return spent
