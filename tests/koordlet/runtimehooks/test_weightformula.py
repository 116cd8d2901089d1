"""The runtime's cpu.shares → cpu.weight formula (koordlet/runtimehooks/weightformula.py): the flag, and the decision
from the weights the runtime wrote. The observation on the real kernel, with runc 1.1.5 and 1.3.6, is
test_weight_formula_v2.py (the v2 guest)."""

from __future__ import annotations

import pytest

from koordlet.api.pod import ContainerMeta
from koordlet.config import ConfigError, parse_config
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks.weightformula import Observation, WeightFormulaSource, decide, kubelet_shares
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.resources import WeightFormula, formulas_giving

LINEAR, QUADRATIC = WeightFormula.LINEAR, WeightFormula.QUADRATIC


def _seen(shares: int, weight: int, name: str = "ns/pod/c") -> Observation:
    return Observation(name, shares, weight, formulas_giving(shares, weight))


def test_one_informative_weight_names_the_runtimes_formula() -> None:
    assert decide([_seen(1024, 100)]) is QUADRATIC
    assert decide([_seen(1024, 39), _seen(512, 20)]) is LINEAR


def test_weights_that_say_nothing_or_disagree_decide_nothing() -> None:
    assert decide([]) is None
    assert decide([_seen(2, 1), _seen(262144, 10000)]) is None  # both formulas give these
    assert decide([_seen(1024, 50)]) is None  # neither: set by hand
    assert decide([_seen(1024, 100), _seen(1024, 39)]) is None  # two runtimes on one node
    assert decide([_seen(1024, 50), _seen(1024, 100)]) is QUADRATIC  # the one that says something decides


def test_kubelets_shares_come_from_the_cpu_request() -> None:
    assert kubelet_shares(ContainerMeta("c", requests={"cpu": 1000})) == 1024
    assert kubelet_shares(ContainerMeta("c", requests={"cpu": 100})) == 102
    assert kubelet_shares(ContainerMeta("c", requests={"memory": 1 << 20})) is None


def _executor() -> ResourceExecutor:
    return ResourceExecutor(CgroupFS.detect())


@pytest.mark.parametrize(("setting", "formula"), [("linear", LINEAR), ("quadratic", QUADRATIC)])
def test_a_named_formula_is_the_executors_from_the_start(setting: str, formula: WeightFormula) -> None:
    executor = _executor()
    source = WeightFormulaSource(setting, executor, KubeCgroupLayout())
    assert executor.weight_formula is formula
    assert source.update(()) is formula


def test_auto_writes_the_linear_formula_until_the_runtime_is_read_and_never_reads_on_v1() -> None:
    executor = _executor()
    source = WeightFormulaSource("auto", executor, KubeCgroupLayout())
    assert executor.weight_formula is LINEAR
    if executor.cgroup_fs.version is CgroupVersion.V1:
        assert source.update(()) is LINEAR and source.observed is None


def test_an_unknown_setting_is_refused_on_the_command_line_and_by_the_source() -> None:
    with pytest.raises(ConfigError, match="auto, linear or quadratic"):
        parse_config(["-cgroup-v2-weight-formula=cubic"], {"NODE_NAME": "n"})
    assert parse_config([], {"NODE_NAME": "n"}).cgroup_v2_weight_formula == "auto"
    with pytest.raises(ValueError, match="cubic"):
        WeightFormulaSource("cubic", _executor(), KubeCgroupLayout())
