"""bench/fleet.py runs koordlet-py's client and the reference side by side and says what each sent: a short run of
a small fleet, the figures held to what each client's discipline makes certain (not to a measured number)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_small_fleet_steady_state_is_measured_for_both_clients() -> None:
    done = subprocess.run([sys.executable, "bench/fleet.py", "--nodes", "12", "--scenarios", "steady", "--json",
                           "--no-debug-flood"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    ours, reference = report["results"]
    assert (ours["client"], reference["client"]) == ("koordlet-py", "Koordinator (reference)")
    assert ours["scenario"] == reference["scenario"] == "steady" and ours["nodes"] == 12
    # koordlet-py: no consistent read, the NodeMetric status written without a read before it, two watches a node
    assert ours["consistent_reads_per_s"] == 0
    assert "get nodemetrics" not in ours["requests_by_resource"]
    assert ours["requests_by_resource"]["update nodemetrics/status"] > 0
    assert ours["watches_per_node"] == 2 and ours["connections_per_node"] == 3
    # the reference: four informers a node, its NodeMetric from the informer's cache too
    assert reference["watches_per_node"] == 4 and "get nodemetrics" not in reference["requests_by_resource"]
    for figures in (ours, reference):
        assert 0.8 < figures["requests_per_node_min"]["update"] < 1.2  # a NodeMetric report a minute, on average
        assert figures["bytes_per_s"] > 0 and figures["steady_mean_per_s"] == figures["mean_per_s"]
    assert "5000 nodes" in report["how"]
