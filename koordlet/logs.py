"""koordlet's logs: klog's flags as Koordinator's koordlet takes them, and ``-logging-format=text|json``.

Verbosity. klog's ``V(n)`` is the Python level ``INFO - n``: ``-v=N`` lets through every record at a level of at
least ``INFO - N``. So ``-v=0`` (the default) shows INFO and above; ``-v=4`` (Koordinator's chart) adds the
records logged at :data:`V4` (per-object detail off the hot paths: the pods the states informer sees change);
``-v=10`` and above add ``logger.debug`` (every cgroup write, every hook answer). A hot path never logs at a
level ``-v=4`` lets through, so Koordinator's default costs nothing (docs/benchmarks.md has the measurement).
``-vmodule=pattern=N,...`` sets N for the modules whose file name (without ``.py``; the path when the pattern
has a ``/``) matches the glob ``pattern``. The environment variable ``KOORDLET_LOG_LEVEL`` (a level name or
number), when set, overrides ``-v`` for every module.

Where logs go (klog's rules, klog v2.130.1 as in Koordinator v1.8.0): ``-logtostderr`` (default true) sends
everything to stderr. With ``-logtostderr=false`` logs go to ``-log_file``, or else to a file named as klog names
it in ``-log_dir`` (default: the temp dir) with a ``koordlet.INFO`` link to it; records at ``-stderrthreshold``
(default ERROR) and above also go to stderr, all of them with ``-alsologtostderr``. ``-log_file_max_size`` (MB,
0: no limit) starts the file again when it is full. ``-skip_headers`` drops time, level and logger from text
lines. ``-legacy_stderr_threshold_behavior=false`` (klog v2.140 and later) applies ``-stderrthreshold`` to
``-logtostderr`` too.

Format: ``text`` (``<time> <LEVEL> <logger>: <message>``) or ``json``, one object a line with ``time`` (RFC 3339,
UTC, microseconds), ``level``, ``logger``, ``message``, ``v`` for a V(n) record, ``pod`` and ``container`` where
the call gave them (``extra=pod_fields(pod_key, container)``), and ``error`` with an exception's traceback.
"""

from __future__ import annotations

import fnmatch
import getpass
import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from koordlet import goflag

V4 = logging.INFO - 4  # klog V(4): Koordinator's chart runs with --v=4
FORMATS = ("text", "json")
_SEVERITIES = ("INFO", "WARNING", "ERROR", "FATAL")
_SEVERITY_LEVEL = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENV_LOG_LEVEL = "KOORDLET_LOG_LEVEL"

for _n in range(1, 10):  # V(1)..V(9) records are klog INFO records
    logging.addLevelName(logging.INFO - _n, "INFO")


def v_level(verbosity: int) -> int:
    """The Python level of klog's ``V(verbosity)``."""
    return max(logging.INFO - verbosity, 1)


def pod_fields(pod: str, container: str = "") -> dict[str, str]:
    """``extra=`` for a log call about a pod (``namespace/name``) and maybe one of its containers."""
    return {"pod": pod, "container": container} if container else {"pod": pod}


def _strconv_int32(text: str) -> int:
    """strconv.ParseInt(s, 10, 32) with Go's error text (klog's Level.Set)."""
    return goflag.parse_int(text, 10, 32)


def _severity(text: str) -> int:
    """klog's -stderrthreshold: a severity name (any case) or its number."""
    if text.upper() in _SEVERITIES:
        return _SEVERITIES.index(text.upper())
    return _strconv_int32(text)


def _vmodule(text: str) -> tuple[tuple[str, int], ...]:
    """klog's -vmodule: ``pattern=N`` pairs separated by commas; N = 0 is dropped."""
    pairs = []
    for item in text.split(","):
        if not item:
            continue
        pattern, _, level = item.partition("=")
        if item.count("=") != 1 or not pattern or not level:
            raise ValueError("syntax error: expect comma-separated list of filename=N")
        try:
            verbosity = _strconv_int32(level)
        except ValueError as err:
            raise ValueError("syntax error: expect comma-separated list of filename=N") from err
        if verbosity < 0:
            raise ValueError("negative value for vmodule level")
        if verbosity:
            pairs.append((pattern, verbosity))
    return tuple(pairs)


def _logging_format(text: str) -> str:
    if text not in FORMATS:
        raise ValueError(f"unsupported log format {text!r}: use text or json")
    return text


@dataclass(frozen=True, slots=True)
class LogOptions:
    verbosity: int = 0  # -v
    vmodule: tuple[tuple[str, int], ...] = ()  # -vmodule
    to_stderr: bool = True  # -logtostderr
    also_to_stderr: bool = False  # -alsologtostderr
    log_dir: str = ""  # -log_dir
    log_file: str = ""  # -log_file
    log_file_max_size_mb: int = 1800  # -log_file_max_size
    stderr_threshold: int = 2  # -stderrthreshold: ERROR
    skip_headers: bool = False  # -skip_headers
    legacy_stderr_threshold: bool = True  # -legacy_stderr_threshold_behavior
    format: str = "text"  # -logging-format


# flag -> (kind, LogOptions field)
_FLAGS: dict[str, tuple[goflag.Kind, str, str]] = {
    "v": (goflag.value_kind("Level", _strconv_int32, zero="0"), "verbosity", "number for the log level verbosity"),
    "vmodule": (goflag.value_kind("moduleSpec", _vmodule), "vmodule",
                "comma-separated list of pattern=N settings for file-filtered logging"),
    "logtostderr": (goflag.BOOL, "to_stderr", "log to standard error instead of files"),
    "alsologtostderr": (goflag.BOOL, "also_to_stderr", "log to standard error as well as files"),
    "log_dir": (goflag.STRING, "log_dir", "if non-empty, write log files in this directory"),
    "log_file": (goflag.STRING, "log_file", "if non-empty, use this log file"),
    "log_file_max_size": (goflag.UINT64, "log_file_max_size_mb",
                          "the largest size a log file reaches, in megabytes; 0: no limit"),
    "stderrthreshold": (goflag.value_kind("severity", _severity, zero="0"), "stderr_threshold",
                        "logs at or above this threshold go to stderr"),
    "skip_headers": (goflag.BOOL, "skip_headers", "if true, avoid header prefixes in the log messages"),
    "legacy_stderr_threshold_behavior": (goflag.BOOL, "legacy_stderr_threshold",
                                         "if false, -stderrthreshold applies with -logtostderr too (klog >= 2.140)"),
    "logging-format": (goflag.value_kind("string", _logging_format), "format", "log format: text or json"),
}
_DEST_PREFIX = "logs__"


def add_flags(flags: goflag.FlagSet) -> None:
    defaults = LogOptions()
    for name, (kind, attribute, usage) in _FLAGS.items():
        flags.add(name, kind, getattr(defaults, attribute), usage, dest=_DEST_PREFIX + attribute)


def options_from_flags(values: dict[str, object]) -> LogOptions:
    """Take the logging flags' values out of ``values``."""
    taken = {key.removeprefix(_DEST_PREFIX): values.pop(key) for key in [k for k in values
                                                                        if k.startswith(_DEST_PREFIX)]}
    return LogOptions(**taken)  # type: ignore[arg-type]


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, v, pod, container, error."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.gmtime(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{int((record.created % 1) * 1_000_000):06d}Z"
        level = record.levelname
        line: dict[str, object] = {"time": stamp, "level": level, "logger": record.name,
                                   "message": record.getMessage()}
        if logging.DEBUG <= record.levelno < logging.INFO:
            line["v"] = logging.INFO - record.levelno
        for key in ("pod", "container"):
            value = getattr(record, key, None)
            if value:
                line[key] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _ModuleVerbosity(logging.Filter):
    """-vmodule: a record passes at its module's verbosity, else at the global one."""

    def __init__(self, verbosity: int, patterns: tuple[tuple[str, int], ...]) -> None:
        super().__init__()
        self._global = v_level(verbosity)
        self._patterns = patterns
        self._by_path: dict[str, int] = {}

    def _threshold(self, record: logging.LogRecord) -> int:
        known = self._by_path.get(record.pathname)
        if known is None:
            known = self._global
            path = record.pathname.removesuffix(".py")
            for pattern, verbosity in self._patterns:
                if fnmatch.fnmatchcase(path if "/" in pattern else record.module, pattern):
                    known = v_level(verbosity)
                    break
            self._by_path[record.pathname] = known
        return known

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self._threshold(record)


class _SizeBoundFile(logging.StreamHandler):  # type: ignore[type-arg]
    """klog's log file: appended to at start; when it would grow past the limit, a new one is started (a new
    timestamped name in -log_dir, or -log_file truncated)."""

    def __init__(self, options: LogOptions) -> None:
        self._options = options
        self._limit = options.log_file_max_size_mb << 20
        super().__init__(self._open(startup=True))

    def _open(self, startup: bool) -> TextIO:
        options = self._options
        if options.log_file:
            return open(options.log_file, "a" if startup else "w", encoding="utf-8")  # noqa: SIM115
        directory = options.log_dir or tempfile.gettempdir()
        host = socket.gethostname().split(".")[0] or "unknownhost"
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknownuser"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"koordlet.{host}.{user}.log.INFO.{stamp}.{os.getpid()}"
        handle = open(os.path.join(directory, name), "a", encoding="utf-8")  # noqa: SIM115
        link = os.path.join(directory, "koordlet.INFO")
        try:
            os.unlink(link)
        except FileNotFoundError:
            pass
        try:
            os.symlink(name, link)
        except OSError:
            pass  # the link is a convenience, as in klog
        return handle

    def emit(self, record: logging.LogRecord) -> None:
        if self._limit and self.stream.tell() >= self._limit:
            self.acquire()
            try:
                self.stream.close()
                self.stream = self._open(startup=False)
            finally:
                self.release()
        super().emit(record)

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            super().close()


def _root_level(options: LogOptions, environ: Mapping[str, str]) -> int:
    override = environ.get(ENV_LOG_LEVEL, "").strip()
    if override:
        level = logging.getLevelName(override.upper())
        if isinstance(level, int):
            return level
        if override.isdigit():
            return int(override)
    finest = max([options.verbosity, *(v for _, v in options.vmodule)])
    return v_level(finest)


def setup(options: LogOptions, environ: Mapping[str, str] | None = None, stderr: TextIO | None = None) -> None:
    """Install the root logger's handlers for ``options`` (replacing any there)."""
    environ = os.environ if environ is None else environ
    stderr = sys.stderr if stderr is None else stderr
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    formatter: logging.Formatter = (JsonFormatter() if options.format == "json"
                                    else logging.Formatter("%(message)s" if options.skip_headers else _TEXT_FORMAT))
    threshold = _SEVERITY_LEVEL.get(options.stderr_threshold, logging.CRITICAL)
    handlers: list[logging.Handler] = []
    to_stderr = logging.StreamHandler(stderr)
    if options.to_stderr:
        if not options.legacy_stderr_threshold:
            to_stderr.setLevel(threshold)
        handlers.append(to_stderr)
    else:
        handlers.append(_SizeBoundFile(options))
        if not options.also_to_stderr:
            to_stderr.setLevel(threshold)
        handlers.append(to_stderr)
    module_filter = _ModuleVerbosity(options.verbosity, options.vmodule) if options.vmodule else None
    for handler in handlers:
        handler.setFormatter(formatter)
        if module_filter is not None and not environ.get(ENV_LOG_LEVEL, "").strip():
            handler.addFilter(module_filter)
        root.addHandler(handler)
    root.setLevel(_root_level(options, environ))
