"""koordlet's own service-account token outside a pod (koordlet/credentials.py), against the project's authorizing API
server: its TokenRequest API issues bound, expiring tokens and refuses an expired one, and RBAC decides who may ask
for one. The server and the token provider share one clock, so a token's life is lived without waiting.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.config.kube_config import new_client_from_config

from koordlet import credentials
from koordlet.access import Refusals, watch_client
from koordlet.kubeapi import CoreV1
from tests.support.apiserver import ApiServer, create_objects, kube_api_client, kubeconfig

NAMESPACE, ACCOUNT, NODE = "koordinator-system", "koordlet-py-baremetal", "worker-1"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
LIFETIME_S = 600
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _rbac(renewal: bool) -> list[dict]:
    """Reading Nodes, and (``renewal``) deploy/baremetal/'s right to renew the account's own token."""
    rbac = "rbac.authorization.k8s.io/v1"
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "nodes-reader"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "nodes-reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodes-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]}]
    if renewal:
        role, binding = yaml.safe_load_all((DEPLOY / "baremetal" / "token.yaml").read_text())
        binding["subjects"][0]["name"] = ACCOUNT  # as kustomize's nameSuffix renames it
        docs += [role, binding]
    return docs


def _node_bound_token(api: ApiServer, lifetime_s: int = LIFETIME_S) -> str:
    """What the installer asks for: a token of the account, bound to the Node, expiring (as the admin)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": lifetime_s,
                     "boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": NODE}}}
    with kube_api_client(api) as client:
        request = client.param_serialize("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
                                         header_params={"Content-Type": "application/json"}, body=body)
        answer = client.call_api(*request)
        assert answer.status == 201
        return json.loads(answer.read())["status"]["token"]


@dataclass
class Node:
    api: ApiServer
    clock: Clock
    token_file: Path
    kubeconfig: Path

    def client(self) -> ApiClient:
        client = new_client_from_config(config_file=str(self.kubeconfig))
        self.provider = credentials.attach(client, str(self.kubeconfig), self.clock)
        return client

    def requests_as(self, user: str = USER) -> list[tuple[str, str, int]]:
        return [(r.verb, r.path, r.status) for r in self.api.requests() if r.user == user]


@contextmanager
def _node(tmp_path: Path, renewal: bool = True) -> Iterator[Node]:
    clock = Clock()
    with ApiServer(clock=clock) as api:
        api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        create_objects(api, _rbac(renewal))
        token_file = tmp_path / "token"
        token_file.write_text(_node_bound_token(api) + "\n")
        config = kubeconfig(api)
        config["users"][0]["user"] = {"tokenFile": "token"}  # relative: to the kubeconfig's dir, as kubectl reads it
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        yield Node(api, clock, token_file, path)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with _node(tmp_path) as made:
        yield made


def _list_nodes(client: ApiClient) -> list[str]:
    answer = CoreV1(client).list_node(field_selector=f"metadata.name={NODE}", _request_timeout=10)
    return [item["metadata"]["name"] for item in answer["items"]]


def test_a_due_token_is_renewed_by_the_next_request_for_the_same_account_binding_and_life(node: Node) -> None:
    client = node.client()
    first = node.token_file.read_text().strip()
    assert _list_nodes(client) == [NODE] and node.token_file.read_text().strip() == first  # not due yet
    node.clock.now += 0.81 * LIFETIME_S
    assert _list_nodes(client) == [NODE]
    second = node.token_file.read_text().strip()
    assert second != first and node.provider is not None and node.provider.renewals == 1
    old, new = credentials.claims_of(first), credentials.claims_of(second)
    assert new is not None and old is not None
    assert (new.namespace, new.name, new.audiences, new.lifetime_s) == (old.namespace, old.name, old.audiences,
                                                                        LIFETIME_S)
    assert (new.bound_kind, new.bound_name) == ("Node", NODE) and new.issued_at == node.clock.now
    assert node.token_file.stat().st_mode & 0o777 == 0o600
    # the renewal went out as the account itself, with the token still good; then the old token's time runs out and
    # requests go on with the new one
    assert ("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token", 201) in node.requests_as()
    node.clock.now = old.expires_at + 1
    assert _list_nodes(client) == [NODE]
    assert [status for _, _, status in node.requests_as()] == [200, 201, 200, 200]


def test_a_token_written_by_someone_else_is_the_next_requests_token(node: Node) -> None:
    client = node.client()
    assert _list_nodes(client) == [NODE]
    other = node.api.add_token("operator-rotated", USER)  # a token the operator put there, not a JWT: kept, not renewed
    node.token_file.write_text(f"{other.token}\n")
    node.clock.now += 0.9 * LIFETIME_S
    assert _list_nodes(client) == [NODE]
    assert node.api.requests()[-1].headers["Authorization"] == "Bearer operator-rotated"
    assert node.provider is not None and node.provider.renewals == 0


def test_a_refused_renewal_keeps_the_old_token_names_the_rule_and_is_tried_again_later(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with _node(tmp_path, renewal=False) as node:
        client = node.client()
        refusals = Refusals()
        watch_client(client, refusals)
        first = node.token_file.read_text()
        node.clock.now += 0.81 * LIFETIME_S
        with caplog.at_level(logging.ERROR, logger="koordlet.credentials"):
            assert _list_nodes(client) == [NODE]  # the request itself goes through with the old token
            assert _list_nodes(client) == [NODE]  # and the next one does not ask again at once
        assert node.token_file.read_text() == first
        asked = [r for r in node.requests_as() if r[0] == "POST"]
        assert asked == [("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token", 403)]
        [refusal] = refusals.current()
        assert refusal.rule == '{apiGroups: [""], resources: ["serviceaccounts/token"], verbs: ["create"]}'
        assert f"renewing the token of service account {NAMESPACE}/{ACCOUNT} failed" in caplog.text
        assert "deploy/baremetal/ grants create serviceaccounts/token" in caplog.text
        node.clock.now += credentials.RETRY_S
        _list_nodes(client)
        assert len([r for r in node.requests_as() if r[0] == "POST"]) == 2
        # once the old token is gone too, the API server says 401, and koordlet's refusals say why
        node.clock.now += LIFETIME_S
        with pytest.raises(ApiException) as raised:
            _list_nodes(client)
        assert raised.value.status == 401


def test_requests_of_many_threads_that_find_the_token_due_renew_it_once(node: Node) -> None:
    client = node.client()
    node.clock.now += 0.85 * LIFETIME_S
    errors: list[BaseException] = []

    def call() -> None:
        try:
            _list_nodes(client)
        except BaseException as err:  # noqa: BLE001 - any failure fails the test below
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert node.provider is not None and node.provider.renewals == 1
    assert len([r for r in node.requests_as() if r[0] == "POST"]) == 1


def test_a_kubeconfig_without_a_token_file_keeps_the_packages_own_credentials(tmp_path: Path) -> None:
    with ApiServer() as api:
        path = tmp_path / "admin.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(api)))  # a client certificate
        client = new_client_from_config(config_file=str(path))
        hook = client.configuration.refresh_api_key_hook
        assert credentials.attach(client, str(path)) is None
        assert client.configuration.refresh_api_key_hook is hook


@pytest.mark.parametrize("token", ["static-token", "a.b", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
                                   "x.!!!.y"])
def test_a_token_that_is_no_service_account_jwt_has_no_claims(token: str) -> None:
    assert credentials.claims_of(token) is None
