"""koordlet's logs: klog's flags (-v, -vmodule, -logtostderr, -log_dir ...) and -logging-format=text|json."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet import logs
from koordlet.config import parse_config
from koordlet.main import log_command_line_notes

ENV = {"NODE_NAME": "node-1"}


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _setup(argv: list[str], environ: dict[str, str] | None = None) -> io.StringIO:
    stderr = io.StringIO()
    logs.setup(parse_config(argv, ENV).logging, environ=environ or {}, stderr=stderr)
    return stderr


def _emit_each_level(name: str = "koordlet.statesinformer.informer") -> None:
    log = logging.getLogger(name)
    log.info("info line")
    log.log(logs.V4, "v4 line")
    log.debug("debug line")
    log.error("error line")


@pytest.mark.parametrize(("argv", "seen"), [
    ([], {"info line", "error line"}),
    (["--v=4"], {"info line", "v4 line", "error line"}),
    (["-v", "10"], {"info line", "v4 line", "debug line", "error line"}),
])
def test_v_lets_through_klogs_verbosity_levels(argv: list[str], seen: set[str]) -> None:
    stderr = _setup(argv)
    _emit_each_level()
    assert {line.rsplit(": ", 1)[1] for line in stderr.getvalue().splitlines()} == seen


def test_koordlet_log_level_overrides_v_for_every_module() -> None:
    stderr = _setup(["-v=10"], {"KOORDLET_LOG_LEVEL": "WARNING"})
    _emit_each_level()
    assert stderr.getvalue().splitlines()[-1].endswith("error line") and len(stderr.getvalue().splitlines()) == 1


def test_vmodule_raises_one_modules_verbosity_only() -> None:
    stderr = _setup(["-vmodule=test_logs=10,other*=2"])
    logging.getLogger("koordlet.x").debug("here: this file is test_logs.py")
    logging.getLogger("koordlet.x").log(logs.V4, "v4 here too")
    assert "here: this file is test_logs.py" in stderr.getvalue() and "v4 here too" in stderr.getvalue()


def test_json_lines_carry_time_level_logger_message_and_the_pod() -> None:
    stderr = _setup(["-logging-format=json", "-v=4"])
    log = logging.getLogger("koordlet.runtimehooks")
    log.warning("value dropped", extra=logs.pod_fields("batch/spark-1", "executor"))
    log.log(logs.V4, "pods: %d", 3)
    try:
        raise ValueError("bad annotation")
    except ValueError:
        log.exception("hook failed", extra=logs.pod_fields("batch/spark-1"))
    first, second, third = (json.loads(line) for line in stderr.getvalue().splitlines())
    assert first["level"] == "WARNING" and first["logger"] == "koordlet.runtimehooks"
    assert first["message"] == "value dropped" and (first["pod"], first["container"]) == ("batch/spark-1", "executor")
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert (second["level"], second["v"], second["message"]) == ("INFO", 4, "pods: 3") and "pod" not in second
    assert third["pod"] == "batch/spark-1" and "ValueError: bad annotation" in third["error"]


def test_an_unknown_logging_format_is_refused() -> None:
    from koordlet.config import ConfigError

    with pytest.raises(ConfigError, match='invalid value "xml" for flag -logging-format'):
        parse_config(["-logging-format=xml"], ENV)


def test_without_logtostderr_logs_go_to_a_klog_named_file_and_errors_to_stderr(tmp_path: Path) -> None:
    stderr = _setup(["-logtostderr=false", f"-log_dir={tmp_path}"])
    _emit_each_level()
    link = tmp_path / "koordlet.INFO"
    assert link.is_symlink() and os.readlink(link).startswith("koordlet.") and ".log.INFO." in os.readlink(link)
    written = link.read_text()
    assert "info line" in written and "error line" in written
    assert stderr.getvalue().count("\n") == 1 and "error line" in stderr.getvalue()  # -stderrthreshold=ERROR


def test_alsologtostderr_and_stderrthreshold_choose_what_stderr_gets(tmp_path: Path) -> None:
    stderr = _setup(["--logtostderr=false", f"--log_file={tmp_path / 'k.log'}", "--alsologtostderr"])
    _emit_each_level()
    assert "info line" in stderr.getvalue() and "info line" in (tmp_path / "k.log").read_text()
    stderr = _setup(["-logtostderr=false", f"-log_file={tmp_path / 'k2.log'}", "-stderrthreshold=WARNING"])
    logging.getLogger("koordlet.y").warning("warned")
    assert "warned" in stderr.getvalue()


def test_a_full_log_file_starts_again(tmp_path: Path) -> None:
    path = tmp_path / "k.log"
    path.write_text("x" * (1 << 20) + "\n")  # already at -log_file_max_size=1 (MB): appended at start, as klog
    _setup(["-logtostderr=false", f"-log_file={path}", "-log_file_max_size=1"])
    logging.getLogger("koordlet.z").info("after the limit")
    assert path.read_text().strip().endswith("after the limit") and path.stat().st_size < 1000


def test_legacy_stderr_threshold_behavior_false_applies_the_threshold_to_logtostderr() -> None:
    stderr = _setup(["-legacy_stderr_threshold_behavior=false", "-stderrthreshold=WARNING"])
    _emit_each_level()
    assert stderr.getvalue().splitlines() and all("error line" in line for line in stderr.getvalue().splitlines())


def test_skip_headers_drops_time_level_and_logger() -> None:
    stderr = _setup(["-skip_headers"])
    logging.getLogger("koordlet.q").info("bare")
    assert stderr.getvalue() == "bare\n"


def test_unused_flags_are_named_in_one_line_at_start(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(["-tsdb-path=/metric-data/", "-enable-pprof", "-v=4", "--housekeeping_interval=5s",
                           "-tsdb-path=/again"], ENV)
    with caplog.at_level(logging.INFO, logger="koordlet.main"):
        log_command_line_notes(config)
    # the other notes of the start (a root dir this host lacks, say) are other lines: the unused flags are one
    lines = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert lines == ["accepted but not used by koordlet-py (docs/configuration.md): -tsdb-path, -enable-pprof, "
                     "-housekeeping_interval"]
