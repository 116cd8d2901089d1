"""koordlet's health: ``/healthz`` (liveness) and ``/readyz`` (readiness) from named checks.

``/healthz`` is 503 until the start is complete (a ``startupProbe`` on it gives a slow start its time), then
fails when any part it watches is stale past a bound that follows the part's own interval:

- ``qosmanager``, ``collectors``, ``reconciler``: the loop finished no tick for longer than 3 × its period +
  grace (a strategy or a collector stuck in a tick, or the loop's thread gone);
- ``states``: the informer never synced, or its last pod list is older than 3 × ``-kubelet-sync-interval`` +
  grace (kubelet or the CRI not answering: koordlet would act on pods that may be gone);
- ``nri`` (NRI on): the runtime's NRI socket is there and koordlet has not been registered for longer than its
  backoff cap + connect timeout + grace, or its connection loop ended.

A refusal (a 401 or 403 of the API server or kubelet, koordlet.access) is different: a restart does not change
RBAC or a credential. So ``/healthz`` names it, ``[!]access: kubelet refused GET …/pods/ (403): … the rule that
allows it: …``, but does not fail for it (the ``states`` check of an informer kept from syncing by a refusal says
so, and passes); ``/readyz`` fails while one is in force. koordlet stays up, unready, and says why.

The grace (:data:`DEFAULT_GRACE_S`) covers one slow tick on a loaded node; the factor 3 a loop that missed two
periods. A node without an NRI socket (containerd 1.6, NRI switched off) is no failure: the proxy serves there.

``/readyz`` is 200 once the start is complete and the states informer has synced. Both bodies follow the
API server's: ``ok`` when passing (``?verbose`` lists every check), else one ``[+]name ok`` / ``[-]name failed:
why`` line per check, then ``healthz check failed``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from koordlet.access import Refusals
from koordlet.metrics import Reply
from koordlet.ticker import TickerThread

if TYPE_CHECKING:
    from koordlet.runtimehooks.nri import NriPlugin
    from koordlet.statesinformer.informer import StatesInformer

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
STALE_PERIODS = 3


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    noted: bool = False  # passes, but has something to say in every answer (a refusal)


Check = Callable[[], tuple[bool, str]]  # (passes, what it saw)


def loop_check(loop: TickerThread, grace_s: float) -> Check:
    """Stale when ``loop`` finished no tick for 3 × its period + ``grace_s`` (stuck in a tick, or its thread
    gone)."""

    def check() -> tuple[bool, str]:
        beat = loop.heartbeat()
        bound = STALE_PERIODS * loop.period_s + grace_s
        if not beat.running:
            return False, "not running"
        if not beat.alive:
            return False, "its thread ended"
        if beat.since_progress_s > bound:
            busy = f"; a tick has run {beat.busy_s:.1f} s" + (f" in {beat.doing}" if beat.doing else "") \
                if beat.busy_s else ""
            return False, f"no tick finished for {beat.since_progress_s:.1f} s (bound {bound:.1f} s){busy}"
        return True, f"last tick {beat.since_progress_s:.1f} s ago (bound {bound:.1f} s)"

    return check


def states_check(states: StatesInformer, grace_s: float, monotonic: Callable[[], float] = time.monotonic,
                 refused: Callable[[], bool] = lambda: False) -> Check:
    """Fails before the informer's first sync, and when its last pod list is older than 3 × its sync interval +
    ``grace_s`` (kubelet or the CRI not answering: koordlet would act on pods that may be gone); passes while
    ``refused()`` (kubelet or the API server refuses what the states need: a restart would not help, the access check
    says why)."""

    def check() -> tuple[bool, str]:
        bound = STALE_PERIODS * states.sync_interval_s + grace_s
        last = states.last_pod_sync
        error = f": {states.last_pod_sync_error}" if states.last_pod_sync_error else ""
        if refused():
            return True, "a refusal keeps the states from syncing (see access)" + error
        if not states.has_synced():
            return False, "not synced" + error
        if last is None:
            return False, "no pod list taken yet" + error
        age = monotonic() - last
        if age > bound:
            return False, f"last pod list {age:.1f} s old (bound {bound:.1f} s){error}"
        return True, f"synced, last pod list {age:.1f} s old (bound {bound:.1f} s)"

    return check


def nri_check(plugin: NriPlugin, socket_present: Callable[[str], bool], grace_s: float,
              monotonic: Callable[[], float] = time.monotonic) -> Check:
    """Fails when the runtime offers NRI (its socket is there) and koordlet has not been registered for longer than
    its backoff cap + connect timeout + ``grace_s``, or when the plugin's connection loop ended."""
    config = plugin.config
    bound = config.backoff_cap_s + config.connect_timeout_s + grace_s

    def check() -> tuple[bool, str]:
        if not plugin.loop_alive:
            return False, "the NRI connection loop ended"
        down_since = plugin.down_since
        if down_since is None:
            return True, "registered"
        if not socket_present(config.socket_path):
            return True, f"no NRI socket at {config.socket_path}: the runtime offers no NRI"
        down = monotonic() - down_since
        if down > bound:
            return False, f"not registered at {config.socket_path} for {down:.1f} s (bound {bound:.1f} s)"
        return True, f"not registered for {down:.1f} s (bound {bound:.1f} s)"

    return check


class Health:
    """The named checks behind ``/healthz`` and ``/readyz``; parts add theirs as they are built."""

    def __init__(self, started: Callable[[], bool], grace_s: float = DEFAULT_GRACE_S) -> None:
        self._started = started
        self.grace_s = grace_s
        self._checks: dict[str, Check] = {}
        self._synced: Callable[[], bool] = lambda: False
        self._failing: frozenset[str] = frozenset()
        self._refusals: Refusals | None = None

    def add(self, name: str, check: Check) -> None:
        self._checks[name] = check

    def watch_loop(self, name: str, loop: TickerThread) -> None:
        self.add(name, loop_check(loop, self.grace_s))

    def watch_states(self, states: StatesInformer) -> None:
        self.add("states", states_check(states, self.grace_s,
                                        refused=lambda: bool(self._refusals and self._refusals.blocking_states())))
        self._synced = states.has_synced

    def watch_access(self, refusals: Refusals) -> None:
        """The refusals of the API server and kubelet: named by /healthz (without failing it), failing /readyz."""
        self._refusals = refusals

    def _access(self) -> list[CheckResult]:
        if self._refusals is None:
            return []
        refused = self._refusals.current()
        if not refused:
            return [CheckResult("access", True, "neither the API server nor kubelet refuses koordlet")]
        detail = "; ".join(refusal.describe() for refusal in refused)
        return [CheckResult("access", True, detail + " (a restart does not help: grant the rule)", noted=True)]

    def watch_nri(self, plugin: NriPlugin, socket_present: Callable[[str], bool]) -> None:
        self.add("nri", nri_check(plugin, socket_present, self.grace_s))

    def results(self) -> list[CheckResult]:
        results = []
        for name, check in list(self._checks.items()):
            try:
                ok, detail = check()
            except Exception as err:  # noqa: BLE001 - a broken check is a failed check, not a dead endpoint
                ok, detail = False, f"check raised {type(err).__name__}: {err}"
            results.append(CheckResult(name, ok, detail))
        self._log_changes(results)
        return results + self._access()

    def _log_changes(self, results: Sequence[CheckResult]) -> None:
        failing = frozenset(r.name for r in results if not r.ok)
        for result in results:
            if result.name in failing - self._failing:
                logger.warning("health check %s failed: %s", result.name, result.detail)
            elif result.name in self._failing - failing:
                logger.info("health check %s passes again", result.name)
        self._failing = failing

    def healthz(self, query: Mapping[str, Sequence[str]], accept: Sequence[str] = ()) -> Reply:
        if not self._started():
            return _reply([CheckResult("started", False, "the start is not complete")], "healthz", query)
        return _reply(self.results(), "healthz", query)

    def readyz(self, query: Mapping[str, Sequence[str]], accept: Sequence[str] = ()) -> Reply:
        results = [CheckResult("started", self._started(), "the start is complete" if self._started() else
                               "the start is not complete"),
                   CheckResult("states", self._synced(), "synced" if self._synced() else "not synced")]
        if self._refusals is not None:
            blocking = [r.describe() for r in self._refusals.current() if r.blocks_work]
            results.append(CheckResult("access", not blocking, "; ".join(blocking) or "nothing refused"))
        return _reply(results, "readyz", query)


def _reply(results: Sequence[CheckResult], what: str, query: Mapping[str, Sequence[str]]) -> Reply:
    passed = all(r.ok for r in results)
    if passed and "verbose" not in query and not any(r.noted for r in results):
        return Reply.text(200, "ok")
    lines = [f"[!]{r.name}: {r.detail}" if r.noted else f"[+]{r.name} ok: {r.detail}" if r.ok else
             f"[-]{r.name} failed: {r.detail}" for r in results]
    lines.append(f"{what} check {'passed' if passed else 'failed'}")
    return Reply.text(200 if passed else 503, "\n".join(lines))
