"""A real Prometheus server for tests: Debian 12's 2.42 (scripts/fetch-tools.sh prometheus), on the loopback address
and a free port, its own config and data dir in the test's temp dir, stopped by PID. Debian 12's build has no
Kubernetes service discovery (Debian took it out); a test of a ``kubernetes_sd_configs`` job runs Debian 13's 2.53
(``binary="prometheus-2.53"``)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import tool
from tests.support.proxy import free_port


class PrometheusServer:
    def __init__(self, workdir: Path, targets: dict[str, str], rule_files: Sequence[Path] = (),
                 interval_s: int = 1, scrape_configs: Sequence[dict[str, Any]] = (),
                 binary: str = "prometheus") -> None:
        """``targets``: job name -> ``host:port`` scraped every ``interval_s``; ``scrape_configs``: more jobs as
        written; ``rule_files`` evaluated as often; ``binary``: the scripts/fetch-tools.sh tool to run."""
        self.workdir = workdir
        self.binary = binary
        self.port = free_port()
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s",
                       "scrape_timeout": f"{interval_s}s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [*({"job_name": job, "static_configs": [{"targets": [address]}]}
                                 for job, address in targets.items()), *scrape_configs],
        }))
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [tool(self.binary), f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + self.log_path.read_text(errors="replace")[-3000:])
            try:
                self.api("/api/v1/status/buildinfo")
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not answer:\n" + self.log_path.read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise RuntimeError(f"{path}: {answer}")
        return answer["data"]

    def query(self, expr: str) -> list[dict]:
        """The instant vector (or a scalar as one sample) ``expr`` gives now."""
        data = self.api("/api/v1/query", query=expr)
        return data["result"] if data["resultType"] in ("vector", "matrix") else [{"value": data["result"]}]

    def targets_up(self) -> dict[str, str]:
        """job -> health of its (one) target."""
        return {t["labels"]["job"]: t["health"] for t in self.api("/api/v1/targets")["activeTargets"]}

    def wait_up(self, timeout_s: float) -> None:
        """Until every target's last scrape succeeded."""
        deadline = time.monotonic() + timeout_s
        while set((health := self.targets_up()).values()) != {"up"}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"targets not up after {timeout_s:.0f} s: {health}")
            time.sleep(0.5)

    def metadata(self) -> set[str]:
        """The metric families the targets' last scrapes described (``# TYPE`` lines), samples or not."""
        return {entry["metric"] for entry in self.api("/api/v1/targets/metadata")}
