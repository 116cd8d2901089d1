"""Hook server registrations: JSON files in /etc/runtime/hookserver.d (docs/koordinator.md §2.4).

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock",
     "failure-policy": "Ignore",            # or "Fail"; absent means Ignore
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", ...]}

The directory is watched (watchdog/inotify) and re-scanned on every event, so a file added,
changed or removed takes effect within a second without a restart. A malformed file is logged
with its name and the reason, counted, and ignored; the other registrations keep working.
Registrations are kept in file-name order, the order in which hook servers are called.

A hook type this proxy does not know is left out of its registration with a warning, as Koordinator's proxy
ignores it, so that a newer hook server's file (one listing a hook added after this proxy) still works; a file
with no known hook type at all is refused.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger(__name__)


class HookType(StrEnum):
    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"
    # koordlet-py's extension (proto/hookapi.proto): the CRI UpdatePodSandboxResources call, a pod-level resize
    PRE_UPDATE_POD_SANDBOX_RESOURCES = "PreUpdatePodSandboxResources"

    @property
    def rpc_path(self) -> str:
        return f"/runtime.v1alpha1.RuntimeHookService/{self.value}Hook"

    @property
    def is_post(self) -> bool:
        return self.value.startswith("Post")


class FailurePolicy(StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


class ConfigError(ValueError):
    """A registration file that cannot be used; the message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class HookServer:
    name: str  # file name, e.g. "koordlet.json"
    endpoint: str  # unix socket path
    failure_policy: FailurePolicy
    hooks: frozenset[HookType]


# A registration is a few lines of JSON; anything far larger is not one.
MAX_REGISTRATION_BYTES = 64 << 10


def parse_registration(name: str, text: str) -> HookServer:
    if len(text) > MAX_REGISTRATION_BYTES:
        raise ConfigError(f"{name}: larger than {MAX_REGISTRATION_BYTES} bytes")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{name}: not valid JSON: nested too deep") from None
    except ValueError as err:  # JSONDecodeError, and integers too long to convert
        raise ConfigError(f"{name}: not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{name}: expected a JSON object, got {type(doc).__name__}")
    endpoint = doc.get("remote-endpoint")
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ConfigError(f"{name}: remote-endpoint must be a non-empty socket path")
    endpoint = endpoint.strip().removeprefix("unix://")
    if not os.path.isabs(endpoint):
        raise ConfigError(f"{name}: remote-endpoint {endpoint!r} is not an absolute unix socket path")
    policy_text = doc.get("failure-policy") or "Ignore"
    try:
        policy = FailurePolicy(policy_text)
    except ValueError:
        raise ConfigError(f"{name}: failure-policy must be Fail or Ignore, not {policy_text!r}") from None
    return HookServer(name, endpoint, policy, _hook_types(name, doc.get("runtime-hooks")))


def _hook_types(name: str, hooks_raw: object) -> frozenset[HookType]:
    """The known hook types of a registration's ``runtime-hooks`` (the module docstring: unknown ones are left out)."""
    if not isinstance(hooks_raw, list) or not hooks_raw:
        raise ConfigError(f"{name}: runtime-hooks must be a non-empty list of hook types")
    hooks = set()
    unknown = []
    for item in hooks_raw:
        try:
            hooks.add(HookType(item))
        except ValueError:
            unknown.append(item)
    known = ", ".join(h.value for h in HookType)
    if not hooks:
        raise ConfigError(f"{name}: no known runtime hook in {hooks_raw!r:.200} (known: {known})")
    if unknown:
        log.warning("%s: runtime hooks %r are not known to this proxy and are left out (known: %s)",
                    name, unknown, known)
    return frozenset(hooks)


class Registry:
    """The current registrations of a directory, kept up to date by a watchdog observer."""

    def __init__(self, directory: str, on_error: Callable[[str, str], None] | None = None) -> None:
        self.directory = directory
        self._servers: tuple[HookServer, ...] = ()
        self._errors: dict[str, str] = {}
        self._on_error = on_error
        self._lock = threading.Lock()
        self._observer: Observer | None = None

    @property
    def servers(self) -> tuple[HookServer, ...]:
        return self._servers

    def matching(self, hook: HookType) -> tuple[HookServer, ...]:
        return tuple(s for s in self._servers if hook in s.hooks)

    def scan(self) -> None:
        """Re-read every *.json file; replace the registrations at once."""
        servers: list[HookServer] = []
        errors: dict[str, str] = {}
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            names = []
        for name in names:
            path = os.path.join(self.directory, name)
            if not name.endswith(".json") or not os.path.isfile(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    servers.append(parse_registration(name, f.read(MAX_REGISTRATION_BYTES + 1)))
            except (ConfigError, OSError, UnicodeDecodeError) as err:
                errors[name] = str(err)
        with self._lock:
            new_errors = {n: e for n, e in errors.items() if self._errors.get(n) != e}
            self._errors = errors
            if tuple(servers) != self._servers:
                log.info("hook servers: %s", ", ".join(f"{s.name} -> {s.endpoint}" for s in servers) or "none")
            self._servers = tuple(servers)
        for name, reason in new_errors.items():
            log.error("ignoring hook server registration %s: %s", name, reason)
            if self._on_error is not None:
                self._on_error(name, reason)

    def start(self) -> None:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        self.scan()
        registry = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type not in ("opened", "closed_no_write"):
                    registry.scan()

        self._observer = Observer(timeout=0.2)
        self._observer.schedule(_Handler(), self.directory, recursive=False)
        self._observer.daemon = True
        self._observer.start()

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(5)
            self._observer = None
