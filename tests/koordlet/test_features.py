"""The one table of feature gates (koordlet/features.py): config parsing, docs/feature-gates.md, and the code
agree with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from koordlet import features
from koordlet.config import DEFAULT_FEATURE_GATES, parse_config, parse_feature_gates

REPO = Path(__file__).resolve().parents[2]
# Where a gate could be read: everything but the table itself and the flag parser that accepts every name.
_SOURCES = [p for root in ("koordlet", "hooks") for p in sorted((REPO / root).rglob("*.py"))
            if p.relative_to(REPO).as_posix() not in ("koordlet/features.py", "koordlet/config.py")]


def _literal(name: str) -> re.Pattern[str]:
    return re.compile(rf"""["']{re.escape(name)}["']""")


def test_every_koordinator_gate_is_in_the_table_once_with_its_stage() -> None:
    names = [g.name for g in features.GATES]
    assert len(names) == len(set(names)) == 40
    assert [g.name for g in features.GATES if not g.koordinator] == ["BEPSIThrottle"]  # koordlet-py's own
    assert set(features.BETA_GATES) == {"BECPUSuppress", "CPUBurst", "RdtResctrl", "NodeTopologyReport",
                                        "GroupIdentity", "CPUSetAllocator", "BatchResource"}
    assert dict(DEFAULT_FEATURE_GATES) == {g.name: g.default for g in features.GATES}


def test_every_gate_is_accepted_on_the_command_line() -> None:
    text = ",".join(f"{g.name}=true" for g in features.GATES)
    assert all(parse_feature_gates(text).values())


@pytest.mark.parametrize("gate", [g for g in features.GATES if g.acts], ids=lambda g: g.name)
def test_a_gate_marked_implemented_is_read_where_the_table_says(gate: features.Gate) -> None:
    assert gate.where, f"{gate.name}: implemented but no module named"
    for module in gate.where:
        assert _literal(gate.name).search((REPO / module).read_text()), f"{module} never names {gate.name}"


def test_every_gate_acts_and_a_gate_marked_not_implemented_would_be_read_nowhere() -> None:
    """Every gate acts today (docs/feature-gates.md); a gate ever marked not implemented must be read nowhere."""
    for gate in (g for g in features.GATES if not g.acts):
        readers = [p.relative_to(REPO).as_posix() for p in _SOURCES if _literal(gate.name).search(p.read_text())]
        assert readers == [], f"{gate.name} is read by {readers}: mark it implemented in koordlet/features.py"
        assert not gate.where
    assert [g.name for g in features.GATES if not g.acts] == []


def test_the_docs_table_is_the_code_table() -> None:
    page = (REPO / "docs" / "feature-gates.md").read_text()
    block = re.search(r"<!-- feature-gates:begin -->\n(.*?)\n<!-- feature-gates:end -->", page, re.S)
    assert block is not None, "docs/feature-gates.md lost its feature gate table"
    assert block.group(1) == features.readme_table()


def test_only_gates_that_are_on_and_inert_are_named() -> None:
    assert features.inert_enabled(DEFAULT_FEATURE_GATES) == []  # every gate on by default acts
    inert = [g.name for g in features.GATES if not g.acts]
    acting_alpha = next(g.name for g in features.GATES if g.acts and not g.default)
    gates = parse_feature_gates(",".join([f"{name}=true" for name in inert[:2]] +
                                         ["NodeTopologyReport=false", f"{acting_alpha}=true"]))
    assert features.inert_enabled(gates) == inert[:2]
    if inert:
        assert features.inert_message(gates) == ("feature gates on but not implemented by koordlet-py "
                                                  f"(accepted, no effect): {', '.join(inert[:2])}")
    assert features.inert_message(parse_feature_gates(f"NodeTopologyReport=false,{acting_alpha}=true")) is None


def test_all_alpha_switches_koordinators_alpha_gates_but_not_koordlet_pys_own() -> None:
    config = parse_config(["-feature-gates=AllAlpha=true"], {"NODE_NAME": "n"})
    assert config.gate("BEMemoryEvict") and not config.gate("BEPSIThrottle")
    assert parse_config(["-feature-gates=AllAlpha=true,BEPSIThrottle=true"], {"NODE_NAME": "n"}).gate("BEPSIThrottle")


def test_all_alpha_names_every_inert_alpha_gate() -> None:
    config = parse_config(["-feature-gates=AllAlpha=true"], {"NODE_NAME": "n"})
    named = features.inert_enabled(config.feature_gates)
    assert set(named) == {g.name for g in features.GATES if not g.acts}
    assert len(named) == sum(1 for g in features.GATES if not g.acts and not g.default)
