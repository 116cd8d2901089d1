"""Who the project's API server takes a request to be: client certificates of its CA, the service-account tokens it
issued (TokenRequest: bound, expiring, audience-checked), static tokens; nothing else."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer, Credentials, kube_api_client, ssl_context
from tests.support.pki import cluster_ca

NAMESPACE = "koordinator-system"
ACCOUNT = "koordlet-py"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _account(server: ApiServer, name: str = ACCOUNT) -> dict:
    return server.seed({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": name, "namespace": NAMESPACE}})


def _who(server: ApiServer, credentials: Credentials) -> tuple[int, str]:
    """(status, recorded user) of a discovery request, which every authenticated user may make."""
    server.clear_requests()
    with kube_api_client(server, credentials) as client:
        try:
            kubernetes.client.CoreApi(client).get_api_versions()
        except ApiException as refused:
            assert json.loads(refused.body)["kind"] == "Status"
    [request] = server.requests()
    return request.status, request.user


def _review(server: ApiServer, token: str, audiences: list[str] | None = None) -> dict:
    with kube_api_client(server) as client:
        return kubernetes.client.AuthenticationV1Api(client).create_token_review(
            {"spec": {"token": token, "audiences": audiences}}).to_dict()["status"]


def test_a_request_without_credentials_or_with_an_unknown_token_is_401_with_a_status(server: ApiServer) -> None:
    for credentials in (Credentials("anonymous"), Credentials("forger", token="made-up")):
        assert _who(server, credentials) == (401, "")
    request = urllib.request.Request(server.url + "/healthz")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5, context=ssl.create_default_context(cafile=str(server.ca_file)))
    body = json.loads(caught.value.read())
    assert (caught.value.code, body["kind"], body["reason"], body["code"]) == (401, "Status", "Unauthorized", 401)


def test_a_client_certificate_names_its_user_in_cn_and_its_groups_in_o(server: ApiServer) -> None:
    assert _who(server, server.node_credentials("node-1")) == (200, "system:node:node-1")
    assert _who(server, server.admin) == (200, "kubernetes-admin")
    # The groups are the certificate's: system:masters may do anything, another group nothing more.
    custom = kubernetes.client.CustomObjectsApi
    with kube_api_client(server, server.client_credentials("eve", ("ops",))) as client, pytest.raises(ApiException):
        custom(client).list_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos")
    with kube_api_client(server, server.client_credentials("root", ("system:masters",))) as client:
        assert custom(client).list_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos")["items"] == []


def test_a_certificate_of_another_ca_is_refused_at_the_handshake(server: ApiServer, tmp_path) -> None:
    from tests.support.pki import ClusterCA

    stranger = ClusterCA(tmp_path).client("kubernetes-admin", ("system:masters",))
    context = ssl.create_default_context(cafile=str(server.ca_file))
    context.load_cert_chain(stranger.cert, stranger.key)
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(server.url + "/api", timeout=5, context=context)
    assert urllib.request.urlopen(server.url + "/api", timeout=5, context=ssl_context(server)).status == 200


def test_a_service_account_token_authenticates_as_the_account_in_its_groups(server: ApiServer) -> None:
    account = _account(server)
    token = server.service_account_token(NAMESPACE, ACCOUNT)
    assert _who(server, Credentials(ACCOUNT, token=token)) == (200, f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}")
    status = _review(server, token)
    assert status["authenticated"] is True and status["audiences"] == ["https://kubernetes.default.svc.cluster.local"]
    user = status["user"]
    assert (user["username"], user["uid"]) == (f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}",
                                               account["metadata"]["uid"])
    assert user["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"]
    assert user["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")
    # A JWT with the claims of the real issuer (only the signature's algorithm differs).
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["sub"] == f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    assert claims["exp"] - claims["iat"] == 3600
    assert claims["kubernetes.io"]["serviceaccount"] == {"name": ACCOUNT, "uid": account["metadata"]["uid"]}


def test_a_token_stops_working_when_it_expires() -> None:
    clock = Clock()
    with ApiServer(clock=clock) as server:
        _account(server)
        token = Credentials(ACCOUNT, token=server.service_account_token(NAMESPACE, ACCOUNT, expiration_seconds=600))
        clock.now += 599
        assert _who(server, token)[0] == 200
        clock.now += 1
        assert _who(server, token) == (401, "")
        assert _review(server, token.token or "")["error"] == \
            "[invalid bearer token, service account token has expired]"


def test_token_request_refuses_a_lifetime_below_the_minimum_and_honours_a_lowered_one() -> None:
    with ApiServer() as server:
        _account(server)
        with pytest.raises(Exception, match="may not specify a duration less than 10 minutes"):
            server.service_account_token(NAMESPACE, ACCOUNT, expiration_seconds=599)
        with pytest.raises(Exception, match="not found"):
            server.service_account_token(NAMESPACE, "nobody")
    clock = Clock()
    with ApiServer(clock=clock, min_token_expiration_s=5) as server:
        _account(server)
        with kube_api_client(server) as client:
            answer = kubernetes.client.CoreV1Api(client).create_namespaced_service_account_token(
                ACCOUNT, NAMESPACE, {"spec": {"expirationSeconds": 5}})
        assert answer.spec.expiration_seconds == 5
        assert answer.status.expiration_timestamp.timestamp() == int(clock.now) + 5
        clock.now += 5
        assert _who(server, Credentials(ACCOUNT, token=answer.status.token)) == (401, "")


def test_a_token_dies_with_its_service_account_and_with_the_pod_it_is_bound_to(server: ApiServer) -> None:
    _account(server)
    pod = server.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "koordlet-1", "namespace": NAMESPACE},
                       "spec": {"containers": [{"name": "k", "image": "k"}]}})
    bound = server.service_account_token(NAMESPACE, ACCOUNT, bound_pod=("koordlet-1", pod["metadata"]["uid"]))
    loose = server.service_account_token(NAMESPACE, ACCOUNT)
    status = _review(server, bound)
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["koordlet-1"]
    with kube_api_client(server) as client:
        core = kubernetes.client.CoreV1Api(client)
        core.delete_namespaced_pod("koordlet-1", NAMESPACE)
        assert _who(server, Credentials(ACCOUNT, token=bound)) == (401, "")
        assert _who(server, Credentials(ACCOUNT, token=loose))[0] == 200
        core.delete_namespaced_service_account(ACCOUNT, NAMESPACE)
        _account(server)  # the same name again is another account (another uid)
        assert _who(server, Credentials(ACCOUNT, token=loose)) == (401, "")


def test_a_token_for_another_audience_is_not_accepted_by_the_api_server(server: ApiServer) -> None:
    _account(server)
    vault = server.service_account_token(NAMESPACE, ACCOUNT, audiences=("vault",))
    assert _who(server, Credentials(ACCOUNT, token=vault)) == (401, "")
    assert _review(server, vault, ["vault"])["audiences"] == ["vault"]
    assert "audiences" in _review(server, vault)["error"]


def test_a_static_token_authenticates_in_requests_and_reviews(server: ApiServer) -> None:
    credentials = server.add_token("s3cret", "alice", ("ops",), uid="u-1")
    assert _who(server, credentials) == (200, "alice")
    assert _review(server, "s3cret")["user"] == {"username": "alice", "uid": "u-1", "extra": None,
                                                 "groups": ["ops", "system:authenticated"]}


def test_the_ca_is_one_per_process_and_its_certificates_are_cached() -> None:
    ca = cluster_ca()
    assert ca.client("u", ("g",)) == ca.client("u", ("g",)) != ca.client("u", ("h",))
    with ApiServer() as first, ApiServer() as second:
        assert first.ca_file == second.ca_file == ca.ca.cert
