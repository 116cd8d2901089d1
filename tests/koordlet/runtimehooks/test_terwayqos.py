"""``TerwayQoS``: ``global_bps_config`` and ``pod.json`` in a Terway QoS dir, laid out and encoded as
Koordinator's terwayqos hook writes them for terway-qos (lines ``<field> <bytes/s>``; a JSON map of pod uid to
Koordinator's Pod struct), kept in step with NodeSLO and the pods, removed when the policy is not terway-qos,
left alone on a bad rate, and audited."""

from __future__ import annotations

import json
from pathlib import Path

from koordlet import audit
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.runtimehooks.terwayqos import NODE_CONFIG, POD_CONFIG, TerwayQoSWriter, node_config, pod_config
from koordlet.statesinformer.api import StaticStates
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.waiting import wait_for

LAYOUT = KubeCgroupLayout()


def _slo(policy: str = "terway-qos", ls: dict | None = None, be: dict | None = None, total: str = "1000M"):
    return parse_node_slo_spec({
        "systemStrategy": {"totalNetworkBandwidth": total},
        "resourceQOSStrategy": {
            "policies": {"netQOSPolicy": policy},
            "lsClass": {"networkQOS": ls or {"enable": True, "ingressRequest": "100M", "ingressLimit": "800M",
                                            "egressRequest": 10, "egressLimit": 90}},
            "beClass": {"networkQOS": be or {"enable": True, "ingressRequest": 0, "ingressLimit": "200M",
                                            "egressRequest": 0, "egressLimit": 20}},
        }})


PODS = (
    PodMeta("web", "shop", "u-web", labels={"koordinator.sh/qosClass": "LS"}, kube_qos=KubeQoS.BURSTABLE,
            annotations={"koordinator.sh/networkQOS": '{"ingressLimit":"80M","egressLimit":"40M"}'}),
    PodMeta("spark", "batch", "u-spark", labels={"koordinator.sh/qosClass": "BE"}, kube_qos=KubeQoS.BESTEFFORT),
    PodMeta("dns", "kube-system", "u-dns", kube_qos=KubeQoS.GUARANTEED),
    PodMeta("agent", "kube-system", "u-agent", labels={"koordinator.sh/qosClass": "SYSTEM"},
            kube_qos=KubeQoS.BURSTABLE),
    PodMeta("broken", "shop", "u-broken", kube_qos=KubeQoS.BURSTABLE,
            annotations={"koordinator.sh/networkQOS": '{"ingressLimit": 5}'}),
)


def test_global_bps_config_is_koordinators_text_in_bytes_per_second() -> None:
    assert node_config(_slo()) == (
        "hw_tx_bps_max 125000000\nhw_rx_bps_max 125000000\n"
        "offline_l1_tx_bps_min 12500000\noffline_l1_tx_bps_max 112500000\n"
        "offline_l1_rx_bps_min 12500000\noffline_l1_rx_bps_max 100000000\n"
        "offline_l2_tx_bps_min 0\noffline_l2_tx_bps_max 25000000\n"
        "offline_l2_rx_bps_min 0\noffline_l2_rx_bps_max 25000000\n")
    off = node_config(_slo(be={"enable": False}))
    assert "offline_l2_rx_bps_max 0\n" in off


def test_pod_json_has_each_pods_prio_cgroup_and_limits() -> None:
    pods = json.loads(pod_config(PODS, LAYOUT))
    assert list(pods) == ["u-agent", "u-dns", "u-spark", "u-web"]  # sorted by uid; the broken pod left out
    assert pods["u-web"] == {"podName": "web", "podNamespace": "shop", "podUID": "u-web", "prio": 1,
                             "cgroupDir": "/sys/fs/cgroup/net_cls/kubepods/burstable/podu-web",
                             "qosConfig": {"ingressBandwidth": 10_000_000, "egressBandwidth": 5_000_000}}
    assert {uid: pod["prio"] for uid, pod in pods.items()} == {"u-agent": 0, "u-dns": 1, "u-spark": 2, "u-web": 1}
    assert pods["u-spark"]["cgroupDir"] == "/sys/fs/cgroup/net_cls/kubepods/besteffort/podu-spark"
    assert pods["u-dns"]["qosConfig"] == {"ingressBandwidth": 0, "egressBandwidth": 0}
    assert pod_config(PODS, LAYOUT).startswith('{"u-agent":{"podName":"agent","podNamespace":"kube-system"')


def test_the_writer_follows_nodeslo_and_pods_and_audits(tmp_path: Path) -> None:
    auditor = audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "audit")))
    audit.install(auditor)
    states = StaticStates(pods=PODS[:2], node_slo=_slo())
    qos_dir = tmp_path / "terway" / "qos"
    writer = TerwayQoSWriter(states, LAYOUT, str(qos_dir), interval_s=3600)
    writer.start()
    try:
        assert wait_for(lambda: (qos_dir / POD_CONFIG).exists() and (qos_dir / NODE_CONFIG).exists(), 5.0)
        assert set(json.loads((qos_dir / POD_CONFIG).read_text())) == {"u-web", "u-spark"}
        before = writer.syncs
        states.set_pods(PODS)  # a pod callback wakes the writer
        assert wait_for(lambda: len(json.loads((qos_dir / POD_CONFIG).read_text())) == 4, 5.0)
        assert oct((qos_dir / POD_CONFIG).stat().st_mode & 0o777) == "0o644"
        states.set_node_slo(_slo(ls={"enable": True, "ingressLimit": "2000M"}))  # above the total: refused
        assert wait_for(lambda: writer.syncs > before + 1, 5.0)
        assert "offline_l1_rx_bps_max 100000000" in (qos_dir / NODE_CONFIG).read_text()  # kept as it was
        states.set_node_slo(_slo(policy="tc"))
        assert wait_for(lambda: not (qos_dir / POD_CONFIG).exists() and not (qos_dir / NODE_CONFIG).exists(), 5.0)
    finally:
        writer.stop()
        audit.install(None)
        auditor.close()
    messages = [e.message for e in reversed(audit.read_events(str(tmp_path / "audit")))]
    assert messages[0].startswith(f"{qos_dir / NODE_CONFIG} to hw_tx_bps_max 125000000")
    assert any(m.startswith(f"removed {qos_dir / POD_CONFIG}") for m in messages)
