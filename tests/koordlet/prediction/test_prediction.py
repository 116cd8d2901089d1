"""The peak predictor on synthetic usage series whose answers are worked out by hand from the bucket layout
(Koordinator pkg/koordlet/prediction): a steady pod, a spiky pod, a pod inside its 24 h cold start, a restart in
the middle that keeps the answer, checkpoints that are corrupt or foreign, and the pods that go.

Bucket arithmetic used below (CPU: first 0.025 cores, ×1.05; memory: first 5 MiB, ×1.05). A value v falls in
bucket floor(log(v × 0.05 / first + 1) / log 1.05), and a percentile answers the END of its bucket,
first × (1.05^(b+1) − 1) / 0.05:
  0.5 cores  → bucket 14 → 0.025 × (1.05^15 − 1) / 0.05 = 0.53946 → 539m
  3.0 cores  → bucket 39 → 3.01999 → 3019m;   3.6 cores → 3.7786 → 3778m;   0 → bucket 0 → 0.025 → 25m
  1 GiB      → bucket 49 → 5 MiB × (1.05^50 − 1) / 0.05 = 1097586419;   512 MiB → bucket 37 → 564708223
  1.75 GiB   → 1951729732;   0 → 5 MiB = 5242880
The safety margin (10 %) multiplies and truncates: 539 → 592, 3019 → 3320, 1097586419 → 1207345060.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from koordlet.api.keys import LABEL_QOS_CLASS
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.prediction.predictor import ANNOTATION_NODE_RAW_ALLOCATABLE, predict_prod
from koordlet.prediction.server import NODE_UID, PredictionConfig, PredictServer, node_item_uid
from koordlet.statesinformer.api import NodeInfo

GiB, MiB = 1 << 30, 1 << 20
T0 = 1_700_000_000.0
DAY = 86400.0


def _pod(name: str, qos: str, cpu_milli: int, memory: int, created_at: float) -> PodMeta:
    return PodMeta(name, "default", f"uid-{name}", labels={LABEL_QOS_CLASS: qos},
                   kube_qos=KubeQoS.BESTEFFORT if qos == "BE" else KubeQoS.BURSTABLE, phase="Running",
                   containers=(ContainerMeta("main", requests={"cpu": cpu_milli, "memory": memory}),),
                   created_at=created_at)


END = T0 + 59 * 60  # the time of the last training round
STEADY = _pod("steady", "LS", 4000, 4 * GiB, END - 2 * DAY)
SPIKY = _pod("spiky", "LS", 4000, 2 * GiB, END - 2 * DAY)
YOUNG = _pod("young", "LS", 1000, GiB, END - 3600)  # inside the 24 h cold start
BATCH = _pod("batch", "BE", 0, 0, END - 2 * DAY)
PODS = (STEADY, SPIKY, YOUNG, BATCH)
NODE = NodeInfo("node-1", capacity={"cpu": 16000, "memory": 32 * GiB}, allocatable={"cpu": 16000, "memory": 32 * GiB})


def _usage(minute: int) -> dict[str, tuple[float, float]]:
    """Each pod's (cores, bytes) in a minute: spiky runs at 3.0 cores one minute in ten, else at 0.2."""
    return {STEADY.uid: (0.5, GiB), SPIKY.uid: (3.0 if minute % 10 == 9 else 0.2, 512 * MiB),
            YOUNG.uid: (0.1, 256 * MiB), BATCH.uid: (1.0, GiB)}


def _feed(cache: MetricCache, minute: int) -> float:
    """Six samples in the minute before round ``minute`` (pods, and the node = Σ pods + 0.5 cores, 1 GiB of
    system); returns the round's time."""
    now = T0 + minute * 60
    usage = _usage(minute)
    node_cpu = sum(c for c, _ in usage.values()) + 0.5
    node_memory = sum(m for _, m in usage.values()) + GiB
    for offset in range(55, 0, -10):
        t = now - offset
        for uid, (cpu, memory) in usage.items():
            cache.append(SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: uid}), t, cpu)
            cache.append(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: uid}), t, memory)
        cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), t, node_cpu)
        cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), t, node_memory)
    return now


def _server(tmp_path: Path, pods=PODS, cache: MetricCache | None = None) -> PredictServer:
    return PredictServer(PredictionConfig(checkpoint_dir=str(tmp_path / "ckpt")), lambda: pods,
                         cache or MetricCache())


def _train(server: PredictServer, cache: MetricCache, minutes: range) -> None:
    for minute in minutes:
        server.train(_feed(cache, minute))


def _predict(server: PredictServer, pods=PODS, node: NodeInfo | None = NODE):
    return predict_prod(pods, node, server.prediction, END, 24 * 3600.0, 10)


@pytest.fixture
def trained(tmp_path: Path) -> PredictServer:
    cache = MetricCache()
    server = _server(tmp_path, cache=cache)
    _train(server, cache, range(60))
    return server


def test_a_steady_pod_peaks_at_the_end_of_its_bucket(trained: PredictServer) -> None:
    prediction = trained.prediction(STEADY.uid)
    assert prediction is not None
    assert prediction.cpu_milli["p95"] == 539 and prediction.memory_bytes["p98"] == 1097586419
    assert prediction.cpu_milli["max"] == 539  # one bucket: every percentile is its end


def test_a_spiky_pod_peaks_at_its_spikes_not_its_average(trained: PredictServer) -> None:
    prediction = trained.prediction(SPIKY.uid)
    assert prediction is not None
    # 54 minutes at 0.2 cores (bucket 6, ends at 203m), 6 at 3.0: the low bucket holds ~90 % of the weight, so
    # p60 is 203m but p95 lands in the spike bucket
    assert prediction.cpu_milli["p60"] == 203 and prediction.cpu_milli["p95"] == 3019
    assert prediction.memory_bytes["p98"] == 564708223


def test_the_node_items_sys_and_the_priority_classes(trained: PredictServer) -> None:
    assert trained.uids() == {STEADY.uid, SPIKY.uid, YOUNG.uid, BATCH.uid, NODE_UID,
                              *(node_item_uid(c) for c in ("koord-prod", "koord-mid", "koord-batch", "koord-free", "",
                                                           "sys"))}
    sys = trained.prediction(node_item_uid("sys"))
    assert sys is not None and (sys.cpu_milli["p95"], sys.memory_bytes["p98"]) == (539, 1097586419)  # 0.5, 1 GiB
    prod = trained.prediction(node_item_uid("koord-prod"))
    # steady + spiky + young: 0.8 cores, or 3.6 in the spike minutes (p95: 3778m); 1.75 GiB
    assert prod is not None and (prod.cpu_milli["p95"], prod.memory_bytes["p98"]) == (3778, 1951729732)
    none = trained.prediction(node_item_uid(""))
    assert none is not None and (none.cpu_milli["p95"], none.memory_bytes["p98"]) == (25, 5242880)  # zeros
    batch = trained.prediction(node_item_uid("koord-batch"))
    assert batch is not None and batch.cpu_milli["p95"] == 1035  # the BE pod: 1.0 core


def test_prod_reclaimable_and_peak_worked_by_hand(trained: PredictServer) -> None:
    result = _predict(trained)
    # per pod: steady peak 592m / 1207345060 (request 4000m / 4 GiB), spiky 3320m / 621179045 (4000m / 2 GiB),
    #   young (1 h old) unpredicted: its request 1000m / 1 GiB counts into the peak only.
    #   reclaimable = min(Σ(request − peak) = 3408 + 680, allocatable − Σ peak = 16000 − 3912) = 4088m;
    #   memory min(3087622236 + 1526304603, 32 GiB − 1828524105) = 4613926839
    # per class: peak = (sys 539 + prod 3778 + none 25) × 1.1 = 4776m; (1097586419 + 1951729732 + 5242880) × 1.1
    #   = 3360014934; reclaimable = min(requests 9000m − 4776, 16000 − 4776) = 4224m; 7 GiB − 3360014934 =
    #   4156177834
    assert dict(result.reclaimable) == {"cpu": 4088, "memory": 4156177834}  # the smaller of the two
    # peak: per pod 3912 + 1000 = 4912m, 1828524105 + 1 GiB = 2902265929; the larger of the two
    assert dict(result.peak) == {"cpu": 4912, "memory": 3360014934}


def test_a_young_pod_is_predicted_once_its_cold_start_is_over(trained: PredictServer) -> None:
    grown = PodMeta(**{**{f: getattr(YOUNG, f) for f in YOUNG.__slots__}, "created_at": END - 2 * DAY})
    result = _predict(trained, (STEADY, SPIKY, grown, BATCH))
    # young's model: 0.1 cores (bucket 3 ends at 0.025 × (1.05^4 − 1) / 0.05 = 0.10775 → 107m, ×1.1 = 117),
    # 256 MiB (bucket 26 ends at 286623669, ×1.1 = 315286035): per-pod peak 3912 + 117 = 4029m, nothing
    # unpredicted any more; requests still count in full per pod: reclaimable 4088 + (1000 − 117) = 4971m
    young = trained.prediction(YOUNG.uid)
    assert young is not None and (young.cpu_milli["p95"], young.memory_bytes["p98"]) == (107, 286623669)
    assert result.peak["cpu"] == max(4029, 4776)
    assert result.reclaimable["cpu"] == min(4971, 4224)


def test_a_restart_in_the_middle_keeps_the_answer(tmp_path: Path, trained: PredictServer) -> None:
    cache = MetricCache()
    first = _server(tmp_path / "a", cache=cache)
    _train(first, cache, range(30))
    assert first.checkpoint(T0 + 29 * 60) == 11  # every model (at most 12 a step), none saved before
    restarted = _server(tmp_path / "a", cache=cache)
    assert restarted.restore() == 11
    _train(restarted, cache, range(30, 60))
    for uid in trained.uids():
        assert restarted.prediction(uid) == trained.prediction(uid), uid
    assert _predict(restarted) == _predict(trained)


def test_checkpoints_in_koordinators_format(trained: PredictServer, tmp_path: Path) -> None:
    trained.checkpoint(END)
    data = json.loads((tmp_path / "ckpt" / STEADY.uid).read_text())
    assert set(data) == {"UID", "CPU", "Memory", "LastUpdated"} and data["UID"] == STEADY.uid
    assert data["CPU"]["bucketWeights"] == {"14": 10000}  # one bucket, scaled to the checkpoint maximum
    assert data["CPU"]["referenceTimestamp"].endswith("Z") and data["CPU"]["totalWeight"] > 0
    assert trained.checkpoint(END + 60) == 0  # none again within the 10 min checkpoint interval


def test_corrupt_foreign_and_stale_checkpoints_are_set_aside_or_removed(trained: PredictServer,
                                                                       tmp_path: Path) -> None:
    trained.checkpoint(END)
    directory = tmp_path / "ckpt"
    (directory / SPIKY.uid).write_text("{not json")
    (directory / "not ours!").write_text("x")
    (directory / BATCH.uid).write_text(json.dumps({"UID": "x", "CPU": {"bucketWeights": {"999": 1},
                                                                       "referenceTimestamp": "2024-01-01T00:00:00Z"},
                                                   "Memory": {"referenceTimestamp": "2024-01-01T00:00:00Z"}}))
    (directory / "huge").write_text(" " * (70 << 10))
    (directory / ".tmp-half-written").write_text("{")
    (directory / "uid-gone").write_text((directory / STEADY.uid).read_text())  # a pod gone while we were down
    restarted = _server(tmp_path)
    assert restarted.restore() == 9  # steady, young, the node and its six items
    assert sorted(os.listdir(directory)) == sorted([".set-aside", STEADY.uid, YOUNG.uid, NODE_UID,
                                                    *(node_item_uid(c) for c in ("koord-prod", "koord-mid",
                                                                                 "koord-batch", "koord-free", "",
                                                                                 "sys"))])
    aside = sorted(name.rsplit(".", 1)[0] for name in os.listdir(directory / ".set-aside"))
    assert aside == sorted([SPIKY.uid, "not ours!", BATCH.uid, "huge"])
    assert restarted.prediction(STEADY.uid) == trained.prediction(STEADY.uid)


def test_a_pod_list_of_a_then_none_then_a_keeps_the_model_of_a(tmp_path: Path) -> None:
    """One round without the pod (an informer resync that missed it) costs nothing: the model, its checkpoint and
    what it learnt stay, and the next round adds to it."""
    cache = MetricCache()
    lists = [(STEADY,), (), (STEADY,)]
    server = PredictServer(PredictionConfig(checkpoint_dir=str(tmp_path / "ckpt")), lambda: lists[0], cache)
    server.train(_feed(cache, 0))
    server.checkpoint(T0)
    learnt = server.prediction(STEADY.uid)
    lists.pop(0)
    server.train(_feed(cache, 1))
    assert server.prediction(STEADY.uid) == learnt and (tmp_path / "ckpt" / STEADY.uid).exists()
    server.gc(T0 + 60)
    assert STEADY.uid in server.uids()
    lists.pop(0)
    server.train(_feed(cache, 2))
    same = PredictServer(PredictionConfig(), lambda: (STEADY,), cache)  # the same two rounds, never missing
    same.train(T0)
    same.train(T0 + 120)
    assert server.prediction(STEADY.uid) == same.prediction(STEADY.uid)


def test_a_gone_pods_model_and_checkpoint_go_once_stale_for_the_expiration_time(tmp_path: Path) -> None:
    """Koordinator v1.8.0 gcModels: a model goes when now − its last update > the expiration (30 min)."""
    cache = MetricCache()
    pods = [STEADY, BATCH]
    server = PredictServer(PredictionConfig(checkpoint_dir=str(tmp_path / "ckpt")), lambda: tuple(pods), cache)
    _train(server, cache, range(3))
    server.checkpoint(T0 + 120)
    pods.remove(STEADY)
    _train(server, cache, range(3, 33))  # 30 more rounds: steady last updated at T0 + 120
    assert server.gc(T0 + 120 + 30 * 60) == [] and STEADY.uid in server.uids()
    assert server.gc(T0 + 121 + 30 * 60) == [STEADY.uid]
    assert not (tmp_path / "ckpt" / STEADY.uid).exists()
    assert len(server.uids()) == 1 + 7  # batch, the node and six node items: bounded by the pods


@pytest.fixture
def immutable(tmp_path: Path):
    """Files made immutable (chattr +i: even root cannot unlink them), made mutable again after the test."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr")
    made: list[Path] = []

    def make(path: Path) -> Path:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"this filesystem has no immutable attribute: {done.stderr.strip()}")
        made.append(path)
        return path

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_leftover_temp_file_that_cannot_be_removed_does_not_stop_the_restore_nor_the_training(
        tmp_path: Path, trained: PredictServer, immutable) -> None:
    trained.checkpoint(END)
    directory = tmp_path / "ckpt"
    for name in (".tmp-half-written", f"{SPIKY.uid}.tmp"):  # ours, and Koordinator's temp name
        (directory / name).write_text("{")
        immutable(directory / name)
    cache = MetricCache()
    restarted = _server(tmp_path, cache=cache)
    assert restarted.restore() == 11
    assert restarted.prediction(STEADY.uid) == trained.prediction(STEADY.uid)
    assert (directory / ".tmp-half-written").exists()  # left, logged
    # the daemon's tick: restore, then training, every tick
    ticking = PredictServer(PredictionConfig(checkpoint_dir=str(directory)), lambda: PODS, cache,
                            clock=lambda: _feed(cache, 60))
    ticking._tick()
    ticking._tick()
    assert ticking.synced and len(ticking.uids()) == 11


def test_raw_allocatable_and_unknown_node(trained: PredictServer) -> None:
    node = NodeInfo("node-1", annotations={ANNOTATION_NODE_RAW_ALLOCATABLE: json.dumps({"cpu": "5", "memory": "8Gi"})},
                    allocatable={"cpu": 16000, "memory": 32 * GiB})
    result = _predict(trained, node=node)
    # per pod: min(4088, 5000 − 3912 = 1088); per class: min(4224, 5000 − 4776 = 224) → 224m
    assert result.reclaimable["cpu"] == 224
    no_node = _predict(trained, node=None)
    assert no_node.reclaimable is None and no_node.peak is not None and "node" in no_node.problem


def test_no_prediction_before_the_first_training(tmp_path: Path) -> None:
    result = _predict(_server(tmp_path))
    assert result.reclaimable is None and result.peak is None and "sys" in result.problem
