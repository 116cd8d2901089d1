"""The koordlet command line: parses the flags (Koordinator's, Go's rules), sets up logging, raises the open-file
limit, and hands the agent (koordlet/agent/lifecycle.py) its configuration; SIGTERM/SIGINT stop it, and the process
exits 0 after a clean stop (2 on a bad command line, 1 when the start failed).

``koordlet explain <namespace>/<name>`` asks a running koordlet why a pod has what it has (koordlet.debug.explain).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Sequence

from kubernetes.config.config_exception import ConfigException

from koordlet import logs
from koordlet.agent.lifecycle import Koordlet
from koordlet.config import ConfigError, KoordletConfig, missing_root_dirs, parse_config
from koordlet.gpu.nvml import NvmlModule

logger = logging.getLogger(__name__)

_NOFILE_CEILING = 1 << 20


def raise_nofile_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (the collectors keep cgroup files open); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            logger.warning("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, err)
    return soft


def log_command_line_notes(config: KoordletConfig) -> None:
    """One line naming the flags given that Koordinator's koordlet has and koordlet-py does not act on
    (koordlet/compatflags.py), one for arguments Go's flag rules leave unread, and one for each kernel filesystem
    root the flags name that is not there (config.missing_root_dirs)."""
    if config.unused_flags:
        logger.info("accepted but not used by koordlet-py (docs/configuration.md): %s",
                    ", ".join(f"-{name}" for name in config.unused_flags))
    if config.ignored_args:
        logger.warning("%r is not a flag, so it and what follows are ignored, as Go's flag package does: %s",
                       config.ignored_args[0], " ".join(config.ignored_args))
    for line in missing_root_dirs(config):
        logger.warning("%s", line)


def main(argv: Sequence[str] | None = None, nvml: NvmlModule | None = None) -> int:
    """The daemon; ``nvml``: the NVML module (default pynvml; the demo passes the tests' fake NVML). ``koordlet
    explain <namespace>/<name>`` asks a running koordlet why a pod has what it has (koordlet.debug.explain)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["explain"]:
        from koordlet.debug.explain import main as explain

        return explain(args[1:])
    try:
        config = parse_config(args, os.environ)
    except ConfigError as err:
        print(err if err.usage else f"koordlet: {err}", file=sys.stderr, end="\n" + err.usage)  # Go's flag: as is
        return 2
    logs.setup(config.logging)
    log_command_line_notes(config)
    soft = raise_nofile_limit()
    logger.info("RLIMIT_NOFILE soft limit %d", soft)
    stop_requested = threading.Event()
    agent = Koordlet(config, nvml=nvml)

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        stop_requested.set()
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except (OSError, ValueError, RuntimeError, ConfigException) as err:
        logger.error("koordlet failed to start: %s", err)
        agent.stop()
        return 1
    while not stop_requested.wait(1.0):
        pass
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
