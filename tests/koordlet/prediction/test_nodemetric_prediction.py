"""The predictor's fields on NodeMetric (Koordinator's ``prodReclaimableMetric`` and ``prodPeakMetric``): through
the project's API server, which validates the object against deploy/crds, and in local mode's YAML file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from koordlet.kubeapi import CustomObjects
from koordlet.metriccache import MetricCache
from koordlet.prediction.predictor import predict_prod
from koordlet.prediction.server import PredictServer
from koordlet.reporters.nodemetric import NodeMetricReporter, ReportOutcome
from tests.koordlet.prediction.test_prediction import END, NODE, PODS, _server, _train
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.nodeusage import with_node_usage

NAME = NODE.name


@pytest.fixture
def trained_with_cache(tmp_path: Path) -> tuple[PredictServer, MetricCache]:
    cache = MetricCache()
    server = _server(tmp_path, cache=cache)
    _train(server, cache, range(60))
    return server, cache


@pytest.fixture
def custom(server: ApiServer) -> Iterator[CustomObjects]:
    with kube_api_client(server) as client:
        yield CustomObjects(client)


def _reporter(server: PredictServer, cache: MetricCache, **kwargs: object) -> NodeMetricReporter:
    def prod_prediction(pods, now):
        return predict_prod(pods, NODE, server.prediction, now, 24 * 3600.0, 10)

    return NodeMetricReporter(NAME, cache, lambda: PODS, wall_clock=lambda: END, prod_prediction=prod_prediction,
                              **kwargs)  # type: ignore[arg-type]


def test_prod_reclaimable_and_peak_reach_the_api_server(server: ApiServer, custom: CustomObjects,
                                                        trained_with_cache) -> None:
    predictor, cache = trained_with_cache
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NAME},
                 "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}}})
    assert _reporter(predictor, cache, custom_api=custom).report_once() is ReportOutcome.UPDATED
    status = server.get_object("nodemetrics", NAME)["status"]
    assert [p["name"] for p in status["podsMetric"]] == ["batch", "spiky", "steady", "young"]
    # the figures of test_prediction.test_prod_reclaimable_and_peak_worked_by_hand
    assert status["prodReclaimableMetric"] == {"resource": {"resources": {"cpu": "4088m", "memory": "4156177834"}}}
    assert status["prodPeakMetric"] == {"resource": {"resources": {"cpu": "4912m", "memory": "3360014934"}}}


def test_before_the_first_training_reclaimable_is_empty_and_peak_absent(server: ApiServer, custom: CustomObjects,
                                                                        tmp_path: Path) -> None:
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NAME}})
    untrained = _server(tmp_path / "empty")
    cache = with_node_usage(MetricCache(), END)
    assert _reporter(untrained, cache, custom_api=custom).report_once() is ReportOutcome.UPDATED
    status = server.get_object("nodemetrics", NAME)["status"]
    assert status["prodReclaimableMetric"] == {"resource": {}} and "prodPeakMetric" not in status


def test_local_mode_file_shows_them(tmp_path: Path, trained_with_cache) -> None:
    predictor, cache = trained_with_cache
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    assert _reporter(predictor, cache, report_dir=str(report_dir)).report_once() is ReportOutcome.WRITTEN
    text = (report_dir / f"nodemetric-{NAME}.yaml").read_text()
    obj = yaml.safe_load(text)
    assert obj["status"]["prodReclaimableMetric"]["resource"]["resources"] == {"cpu": "4088m", "memory": "4156177834"}
    assert obj["status"]["prodPeakMetric"]["resource"]["resources"]["cpu"] == "4912m"
    print("\n" + text)
