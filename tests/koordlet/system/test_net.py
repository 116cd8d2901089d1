"""The node's default route interface and link speed, from fixture /proc and /sys trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.system.net import UplinkError, default_route_interface, link_speed_bps

ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"


def test_default_route_interface_is_the_up_default_route_with_the_lowest_metric(tmp_path: Path) -> None:
    route = tmp_path / "net" / "route"
    route.parent.mkdir()
    route.write_text(
        ROUTE_HEADER
        + "eth9\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n"  # down: skipped
        + "eth1\t00000000\t010200C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n"
        + "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        + "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    )
    assert default_route_interface(str(tmp_path)) == "eth0"
    route.write_text(ROUTE_HEADER + "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
    with pytest.raises(UplinkError, match="no default route"):
        default_route_interface(str(tmp_path))
    with pytest.raises(UplinkError):
        default_route_interface(str(tmp_path / "absent"))


def test_link_speed_unknown_is_zero(tmp_path: Path) -> None:
    assert link_speed_bps("eth0", str(tmp_path)) == 0
    speed = tmp_path / "class" / "net" / "eth0" / "speed"
    speed.parent.mkdir(parents=True)
    speed.write_text("-1\n")  # what virtual links report
    assert link_speed_bps("eth0", str(tmp_path)) == 0
    speed.write_text("25000\n")
    assert link_speed_bps("eth0", str(tmp_path)) == 25_000_000_000
