"""KubeletPodSource against the project's HTTPS kubelet (tests/support/kubelet.py), which authenticates and
authorizes koordlet's requests through the project's API server as a real kubelet does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.access import Refusals
from koordlet.api.qos import KubeQoS, PriorityClass, QoSClass
from koordlet.statesinformer.informer import PodSourceError
from koordlet.statesinformer.kubelet import KubeletPodSource, PodParseError, kubelet_url, pod_meta_from_pod
from koordlet.system.cgroup import CgroupDriver
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.apiserver import ApiServer
from tests.support.kubelet import BE_UID, LS_UID, Kubelet, grant_kubelet_access, kubelet_pod_list

LAYOUT = KubeCgroupLayout(CgroupDriver.CGROUPFS, "/")
READER = "system:serviceaccount:default:kubelet-reader"


@pytest.fixture
def kubelet(server: ApiServer) -> Iterator[Kubelet]:
    with Kubelet(server, "node-1") as running:
        yield running


@pytest.fixture
def token(server: ApiServer, kubelet: Kubelet, tmp_path: Path) -> str:
    """A token file of a service account that may get nodes/pods (what kubelet asks first for /pods)."""
    path = tmp_path / "token"
    path.write_text(grant_kubelet_access(server) + "\n")
    return str(path)


def test_pods_from_kubelet_https_with_token_become_pod_metas(kubelet: Kubelet, token: str) -> None:
    source = KubeletPodSource(kubelet.url, LAYOUT, token_file=token)
    web, spark = source.list_pods()
    [request] = kubelet.requests
    assert (request.path, request.status, request.user) == ("/pods/", 200, READER)
    assert request.authorization == f"Bearer {Path(token).read_text().strip()}"
    assert (web.namespace, web.name, web.uid, web.phase) == ("shop", "web-0", LS_UID, "Running")
    assert web.kube_qos is KubeQoS.GUARANTEED and web.qos_class is QoSClass.LSR
    assert web.priority == 9500 and web.priority_class is PriorityClass.PROD
    assert web.cgroup_parent == f"/kubepods/pod{LS_UID}"
    main = web.container("web")
    assert main is not None and main.container_id == "a" * 64 and main.runtime == "containerd"
    assert main.requests == {"cpu": 2000, "memory": 1 << 30} and main.limits == main.requests
    init = web.container("init")
    assert init is not None and init.is_init and init.container_id == "b" * 64
    assert spark.kube_qos is KubeQoS.BESTEFFORT and spark.qos_class is QoSClass.BE
    assert spark.cgroup_parent == f"/kubepods/besteffort/pod{BE_UID}"
    executor = spark.container("executor")
    assert executor is not None and executor.container_id == ""  # not created yet
    assert executor.requests == {"kubernetes.io/batch-cpu": 1000, "kubernetes.io/batch-memory": 2 << 30}
    assert web.ips == ("10.244.1.7", "fd00:10:244:1::7") and spark.ips == ()  # Pending: no IP yet


def test_client_certificate_authenticates_to_kubelet(server: ApiServer, kubelet: Kubelet) -> None:
    server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "koordlet-kubelet-api"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "system:kubelet-api-admin"}, "subjects": [{"kind": "User", "name": "koordlet"}]})
    cert = server.client_credentials("koordlet").cert
    assert cert is not None
    source = KubeletPodSource(kubelet.url, LAYOUT, token_file="", client_cert=str(cert.cert),
                              client_key=str(cert.key))
    assert len(source.list_pods()) == 2
    [request] = kubelet.requests
    assert (request.client_cert_user, request.user, request.authorization) == ("koordlet", "koordlet", "")


def test_empty_pod_list_is_a_failure(kubelet: Kubelet, token: str) -> None:
    kubelet.payload = {"kind": "PodList", "items": []}
    with pytest.raises(PodSourceError, match="empty pod list"):
        KubeletPodSource(kubelet.url, LAYOUT, token_file=token).list_pods()


def test_a_refusal_names_the_call_the_user_and_the_rule_and_ends_when_the_call_is_allowed(
        server: ApiServer, kubelet: Kubelet, token: str, tmp_path: Path) -> None:
    refusals = Refusals()
    with pytest.raises(PodSourceError, match=r"^kubelet did not authenticate koordlet for GET "
                                             r"https://127\.0\.0\.1:\d+/pods/ \(401\): kubelet did not accept"):
        KubeletPodSource(kubelet.url, LAYOUT, refusals=refusals).list_pods()  # no credential at all
    stats_only = tmp_path / "stats-only"
    stats_only.write_text(grant_kubelet_access(server, account="stats-only", subresources=("stats",)))
    source = KubeletPodSource(kubelet.url, LAYOUT, token_file=str(stats_only), refusals=refusals)
    with pytest.raises(PodSourceError) as refused:
        source.list_pods()
    assert str(refused.value).startswith(
        f"kubelet refused GET {kubelet.url}/pods/ (403): user system:serviceaccount:default:stats-only may not get "
        'nodes/pods or nodes/proxy; the rule that allows it: {apiGroups: [""], resources: ["nodes/pods"], '
        'verbs: ["get"]} on kubelet 1.33+ (KubeletFineGrainedAuthz), or {apiGroups: [""], resources: '
        '["nodes/proxy"], verbs: ["get"]} on older kubelets')
    [current] = refusals.current()
    assert (current.source, current.code, current.resource) == ("kubelet", 403, "nodes/pods or nodes/proxy")
    assert len(KubeletPodSource(kubelet.url, LAYOUT, token_file=token, refusals=refusals).list_pods()) == 2
    assert refusals.current() == []


def test_http_errors_and_timeouts_are_failures(kubelet: Kubelet, token: str) -> None:
    kubelet.status = 500
    with pytest.raises(PodSourceError, match="HTTP 500"):
        KubeletPodSource(kubelet.url, LAYOUT, token_file=token).list_pods()
    kubelet.status, kubelet.delay_s = 200, 0.6
    with pytest.raises(PodSourceError, match="timed out"):
        KubeletPodSource(kubelet.url, LAYOUT, token_file=token, timeout_s=0.2).list_pods()


def test_unknown_address_is_a_failure_not_a_crash() -> None:
    with pytest.raises(PodSourceError, match="not known"):
        KubeletPodSource(lambda: None, LAYOUT).list_pods()


def test_pod_with_bad_quantity_is_skipped_others_kept(kubelet: Kubelet, token: str) -> None:
    kubelet.payload["items"][1]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "lots"
    pods = KubeletPodSource(kubelet.url, LAYOUT, token_file=token).list_pods()
    assert [p.name for p in pods] == ["web-0"]


def test_kube_qos_derived_when_status_lacks_it() -> None:
    pod = kubelet_pod_list()["items"][0]
    del pod["status"]["qosClass"]
    assert pod_meta_from_pod(pod, LAYOUT).kube_qos is KubeQoS.GUARANTEED
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert pod_meta_from_pod(pod, LAYOUT).kube_qos is KubeQoS.BURSTABLE
    pod["spec"]["containers"][0]["resources"] = {}
    # kubelet's ComputePodQOS counts init containers: a Guaranteed init container beside a BestEffort one
    assert pod_meta_from_pod(pod, LAYOUT).kube_qos is KubeQoS.BURSTABLE
    pod["spec"]["initContainers"][0]["resources"] = {}
    assert pod_meta_from_pod(pod, LAYOUT).kube_qos is KubeQoS.BESTEFFORT


def test_pod_ip_falls_back_to_the_single_pod_ip_field() -> None:
    pod = kubelet_pod_list()["items"][0]
    del pod["status"]["podIPs"]  # older kubelets set podIP only
    assert pod_meta_from_pod(pod, LAYOUT).ips == ("10.244.1.7",)


def test_systemd_layout_and_cgroup_root_shape_the_cgroup_parent() -> None:
    layout = KubeCgroupLayout(CgroupDriver.SYSTEMD, "/")
    pod = pod_meta_from_pod(kubelet_pod_list()["items"][1], layout)
    assert pod.cgroup_parent == ("/kubepods.slice/kubepods-besteffort.slice/"
                                 f"kubepods-besteffort-pod{BE_UID.replace('-', '_')}.slice")


def test_pod_without_uid_is_rejected() -> None:
    pod = kubelet_pod_list()["items"][0]
    del pod["metadata"]["uid"]
    with pytest.raises(PodParseError):
        pod_meta_from_pod(pod, LAYOUT)


def test_kubelet_url_from_node_addresses_and_daemon_endpoint() -> None:
    node = {"status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                     {"type": "InternalIP", "address": "10.0.0.7"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}}
    assert kubelet_url(node) == "https://10.0.0.7:10250"
    assert kubelet_url(node, port=11250) == "https://10.0.0.7:11250"
    assert kubelet_url(node, insecure=True) == "http://10.0.0.7:10255"
    assert kubelet_url(node, address_type="ExternalIP") is None


# ----------------------------------------------------------------------------- in-place resize, pod-level resources


def _resized_web_pod() -> dict:
    """web-0 after ``kubectl patch --subresource resize`` raised its cpu to 3 and memory to 2Gi: the spec holds the
    new amounts; kubelet has admitted them (allocatedResources) but still reports the old ones enacted."""
    pod = kubelet_pod_list()["items"][0]
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3", "memory": "2Gi"},
                                                 "limits": {"cpu": "3", "memory": "2Gi"}}
    pod["status"]["containerStatuses"][0]["allocatedResources"] = {"cpu": "3", "memory": "2Gi"}
    pod["status"]["containerStatuses"][0]["resources"] = {"requests": {"cpu": "2", "memory": "1Gi"},
                                                          "limits": {"cpu": "2", "memory": "1Gi"}}
    pod["status"]["conditions"] = [{"type": "PodResizeInProgress", "status": "True"}]
    return pod


def test_a_resize_not_yet_enacted_leaves_the_container_with_what_kubelet_reports() -> None:
    web = pod_meta_from_pod(_resized_web_pod(), LAYOUT).container("web")
    assert web is not None
    assert web.requests == {"cpu": 2000, "memory": 1 << 30}
    assert web.limits == {"cpu": 2000, "memory": 1 << 30}


def test_a_resize_kubelet_enacted_gives_the_container_its_new_amounts() -> None:
    pod = _resized_web_pod()
    pod["status"]["containerStatuses"][0]["resources"] = {"requests": {"cpu": "3", "memory": "2Gi"},
                                                          "limits": {"cpu": "3", "memory": "2Gi"}}
    web = pod_meta_from_pod(pod, LAYOUT).container("web")
    assert web is not None
    assert (web.requests["cpu"], web.limits["memory"]) == (3000, 2 << 30)


def test_admitted_requests_count_when_kubelet_reports_no_enacted_ones() -> None:
    pod = _resized_web_pod()
    del pod["status"]["containerStatuses"][0]["resources"]
    web = pod_meta_from_pod(pod, LAYOUT).container("web")
    assert web is not None
    assert web.requests == {"cpu": 3000, "memory": 2 << 30}  # allocatedResources
    assert web.limits == {"cpu": 3000, "memory": 2 << 30}  # the spec: nothing reported


def test_status_resources_keep_the_spec_extended_resources() -> None:
    """kubelet reports cpu and memory only (convertContainerStatusResources): batch-cpu stays the spec's."""
    pod = kubelet_pod_list()["items"][1]
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    pod["status"]["containerStatuses"] = [{"name": "executor", "containerID": "containerd://" + "c" * 64,
                                           "resources": {"requests": {"cpu": "250m"}}}]
    executor = pod_meta_from_pod(pod, LAYOUT).container("executor")
    assert executor is not None
    assert executor.requests == {"cpu": 250, "kubernetes.io/batch-cpu": 1000, "kubernetes.io/batch-memory": 2 << 30}


def test_a_bad_quantity_in_the_status_fails_the_pod_not_the_list() -> None:
    pod = _resized_web_pod()
    pod["status"]["containerStatuses"][0]["resources"]["limits"]["memory"] = "lots"
    with pytest.raises(PodParseError, match="memory"):
        pod_meta_from_pod(pod, LAYOUT)


def _pod_level_pod() -> dict:
    """A pod whose limits are set at pod level only (KEP-2837): its containers set none."""
    pod = kubelet_pod_list()["items"][0]
    del pod["status"]["qosClass"]
    del pod["spec"]["initContainers"]
    pod["spec"]["containers"][0]["resources"] = {}
    pod["spec"]["containers"].append({"name": "sidecar", "image": "envoy", "resources": {}})
    pod["spec"]["resources"] = {"requests": {"cpu": "1", "memory": "512Mi"},
                                "limits": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "1Gi"}}
    return pod


def test_pod_level_resources_are_read_and_decide_the_kube_qos() -> None:
    meta = pod_meta_from_pod(_pod_level_pod(), LAYOUT)
    assert meta.pod_requests == {"cpu": 1000, "memory": 512 << 20}
    assert meta.pod_limits == {"cpu": 2000, "memory": 1 << 30}  # ephemeral-storage is no pod-level resource
    assert meta.kube_qos is KubeQoS.BURSTABLE  # BestEffort containers, but the pod-level amounts decide
    pod = _pod_level_pod()
    pod["spec"]["resources"] = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    assert pod_meta_from_pod(pod, LAYOUT).kube_qos is KubeQoS.GUARANTEED


def test_pod_level_amounts_follow_what_kubelet_enacted() -> None:
    pod = _pod_level_pod()
    pod["status"]["resources"] = {"requests": {"cpu": "1", "memory": "512Mi"},
                                  "limits": {"cpu": "1500m", "memory": "1Gi"}}
    meta = pod_meta_from_pod(pod, LAYOUT)
    assert meta.pod_limits == {"cpu": 1500, "memory": 1 << 30}


def test_a_pod_without_pod_level_resources_has_none() -> None:
    meta = pod_meta_from_pod(kubelet_pod_list()["items"][0], LAYOUT)
    assert (meta.pod_requests, meta.pod_limits) == ({}, {})


def test_kubelets_configz_gives_its_memory_qos_and_the_last_good_answer_stays_through_a_failure(
        server: ApiServer, kubelet: Kubelet, tmp_path: Path) -> None:
    """kubelet's /configz as Koordinator's koordlet reads it, allowed by nodes/configz; asked again only once a
    refresh is due."""
    from koordlet.statesinformer.kubeletconfig import REFRESH_S, KubeletMemoryQoSSource

    token = tmp_path / "token"
    token.write_text(grant_kubelet_access(server, subresources=("pods", "configz")) + "\n")
    kubelet.configz = {"memoryThrottlingFactor": 0.9, "memoryReservationPolicy": "TieredReservation"}
    now = [0.0]
    source = KubeletMemoryQoSSource(None, KubeletPodSource(kubelet.url, LAYOUT, token_file=str(token)).kubelet_config,
                                    lambda: "v1.37.1", clock=lambda: now[0])
    got = source()
    assert (got.enabled, got.throttling_factor, got.reservation) == (True, 0.9, "TieredReservation")
    assert "kubelet's /configz, kubelet v1.37.1" in got.source
    kubelet.configz = None  # /configz answers 404 from now on
    assert source() is got  # not asked again yet
    now[0] += REFRESH_S
    assert source() == got  # asked, failed: the last answer stays
    assert [(r.path, r.status, r.user) for r in kubelet.requests] == [
        ("/configz", 200, READER), ("/configz", 404, READER)]


def test_a_refused_configz_is_named_and_does_not_hold_the_pod_list(kubelet: Kubelet, token: str) -> None:
    """A role with nodes/pods alone: kubelet refuses /configz (nodes/configz, then nodes/proxy), koordlet names the
    rule, and the refusal is not one the states informer waits for."""
    refusals = Refusals()
    source = KubeletPodSource(kubelet.url, LAYOUT, token_file=token, refusals=refusals)
    kubelet.configz = {"memoryThrottlingFactor": 0.9}
    with pytest.raises(PodSourceError, match=r"nodes/configz"):
        source.kubelet_config()
    [refused] = refusals.current()
    assert refused.code == 403 and "nodes/configz" in refused.rule and "nodes/proxy" in refused.rule
    assert refusals.blocking_states() == []
    assert len(source.list_pods()) == 2
