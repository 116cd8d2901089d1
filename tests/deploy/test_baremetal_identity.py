"""Bare metal with an API server: koordlet as a service account of its own, made by the installer.

`scripts/install-baremetal.sh --admin-kubeconfig` (on files, ``--root``) with kubeadm's admin credentials against the
project's authorizing API server and kubelet (tests/deploy/baremetal_cluster.py): the account and its RBAC
(deploy/baremetal/), a token bound to the node's Node and expiring, koordlet's kubeconfig naming the token's file.
Then koordlet as koordlet.service starts it from those files: it syncs its pods from kubelet (which asks the API server
who the token is and whether it may get nodes/pods), writes its NodeMetric, makes its NRT, nothing refuses it, and it
renews its token before it expires, the new one taken by the API server and kubelet alike. And the opposite: its role
without one rule gets the 403 that rule prevents, and koordlet names the rule.

The same under real systemd, from the image's root tree, is not tested yet.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy.baremetal_cluster import (
    ACCOUNT,
    NAMESPACE,
    NODE,
    USER,
    Cluster,
    bare_metal_cluster,
    baremetal_documents,
    installed_koordlet,
)
from tests.deploy.deploy_paths import REPORT_WAIT_S, rules_without
from tests.support.apiserver import kube_api_client
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-baremetal.sh"
TOKEN_S = 20  # renewed at 16 s
_REFUSED = ("(401)", "(403)", "Forbidden", "Unauthorized")


def _install(cluster: Cluster, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    fake = root.parent / "systemctl"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return subprocess.run(["bash", str(INSTALL), "--root", str(root), "--no-venv", "--admin-kubeconfig",
                           str(cluster.admin_kubeconfig), "--node-name", NODE, *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **cluster.installer_env(), "SYSTEMCTL": str(fake)})


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def _replace(cluster: Cluster, path: str, obj: dict) -> None:
    with kube_api_client(cluster.api) as client:
        request = client.param_serialize("PUT", path, header_params={"Content-Type": "application/json"}, body=obj)
        assert client.call_api(*request).status == 200


def test_koordlet_runs_as_its_own_account_made_by_the_installer_and_renews_its_token(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with bare_metal_cluster(tmp_path / "cluster") as cluster:
        done = _install(cluster, root, "--token-duration", f"{TOKEN_S}s")
        assert done.returncode == 0, done.stdout + done.stderr
        # the account and its RBAC, as deploy/baremetal/ holds them
        for doc in baremetal_documents():
            plural = {"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles", "Role": "roles",
                      "ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings"}[doc["kind"]]
            stored = cluster.api.get_object(plural, doc["metadata"]["name"], doc["metadata"].get("namespace"))
            assert stored is not None and stored.get("rules") == doc.get("rules"), doc["metadata"]["name"]
        token_file = root / "var/lib/koordlet/token"
        first = token_file.read_text().strip()
        claims = _claims(first)
        assert claims["sub"] == USER and claims["kubernetes.io"]["node"]["name"] == NODE
        assert claims["exp"] - claims["iat"] == TOKEN_S
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert (root / "etc/koordlet/kubeconfig").stat().st_mode & 0o777 == 0o600
        config = yaml.safe_load((root / "etc/koordlet/kubeconfig").read_text())
        assert config["users"] == [{"name": ACCOUNT, "user": {"tokenFile": "/var/lib/koordlet/token"}}]
        assert "client-key" not in (root / "etc/koordlet/kubeconfig").read_text()  # the admin's key stays the admin's

        with installed_koordlet(cluster, root, tmp_path / "state") as koordlet:
            assert koordlet.wait_log("states informer synced: 2 pods", 60), koordlet.logs()[-4000:]
            metric = wait_for(lambda: ((cluster.api.get_object("nodemetrics", NODE) or {}).get("status") or {})
                              .get("nodeMetric"), REPORT_WAIT_S)
            assert metric, koordlet.logs()[-4000:]
            assert wait_for(lambda: cluster.api.get_object("noderesourcetopologies", NODE), 30)
            assert [(r.path, r.status, r.user) for r in cluster.kubelet.requests][:1] == [("/pods/", 200, USER)]
            # renewed before it expires, by koordlet itself; once the first token is dead, both servers take the new
            # ones: nothing is refused
            assert wait_for(lambda: token_file.read_text().strip() != first, TOKEN_S + 20, 0.5), koordlet.logs()
            assert time.time() < claims["exp"], "renewed only after the token had expired"
            second = token_file.read_text().strip()
            assert _claims(second)["kubernetes.io"]["node"]["name"] == NODE and _claims(second)["exp"] > claims["exp"]
            assert f"renewed the token of service account {NAMESPACE}/{ACCOUNT}" in koordlet.logs()
            time.sleep(max(0.0, claims["exp"] + 1 - time.time()))
            api_seen, kubelet_seen = len(cluster.api.requests()), len(cluster.kubelet.requests)
            assert wait_for(lambda: any(r.user == USER and r.status == 200 for r in cluster.api.requests()[api_seen:])
                            and any(r.status == 200 for r in cluster.kubelet.requests[kubelet_seen:]), 30)
            later = [r.headers.get("Authorization") for r in cluster.api.requests()[api_seen:] if r.user == USER]
            assert f"Bearer {first}" not in later + [r.authorization for r in cluster.kubelet.requests[kubelet_seen:]]
            assert koordlet.running_for(1.0)
            mine = [r for r in cluster.api.requests() if r.user == USER]
            assert {r.status for r in mine} <= {200, 201, 404}, sorted({(r.verb, r.path, r.status) for r in mine})
            assert not [r for r in cluster.api.requests() if r.status == 401], "a request went out with a dead token"
            assert cluster.kubelet.refusals() == []
            assert not any(word in koordlet.logs() for word in _REFUSED), koordlet.logs()[-4000:]


_REMOVED = [  # (the resource taken out of koordlet-py-baremetal's rules, who refuses, what koordlet's log names)
    ("nodemetrics/status", "apiserver",
     '{apiGroups: ["slo.koordinator.sh"], resources: ["nodemetrics/status"], verbs: ["update"]}'),
    ("nodes/pods", "kubelet", '{apiGroups: [""], resources: ["nodes/pods"], verbs: ["get"]} on kubelet 1.33+'),
]


@pytest.mark.parametrize(("resource", "source", "rule"), _REMOVED, ids=[r[0] for r in _REMOVED])
def test_its_role_without_one_rule_gets_the_refusal_that_rule_prevents_named(
        tmp_path: Path, resource: str, source: str, rule: str) -> None:
    root = tmp_path / "root"
    with bare_metal_cluster(tmp_path / "cluster") as cluster:
        assert _install(cluster, root).returncode == 0
        role = cluster.api.get_object("clusterroles", ACCOUNT)
        assert role is not None
        kept = rules_without(role["rules"], resource)
        _replace(cluster, f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{ACCOUNT}", {**role, "rules": kept})
        with installed_koordlet(cluster, root, tmp_path / "state") as koordlet:
            assert koordlet.wait_log(f"the rule that allows it: {rule}", REPORT_WAIT_S), koordlet.logs()[-4000:]
            if source == "kubelet":
                refused = wait_for(cluster.kubelet.refusals, 5)
                assert refused and refused[0].status == 403 and refused[0].user == USER
            else:
                refused = [r for r in cluster.api.requests() if r.status == 403]
                assert refused and {r.user for r in refused} == {USER}
            assert wait_for(lambda: koordlet.get("/readyz")[0] == 503, 30), koordlet.get("/readyz")
            assert rule in koordlet.get("/readyz")[1]
            assert koordlet.running_for(1.0), koordlet.logs()[-4000:]


def test_the_identity_steps_show_in_a_dry_run_and_wrong_options_are_refused(tmp_path: Path) -> None:
    admin = tmp_path / "admin.conf"
    admin.write_text("apiVersion: v1\nkind: Config\n")

    def install(*args: str, kubectl: str = "/bin/true") -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(INSTALL), "--root", str(tmp_path / "root"), "--no-venv", *args],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "KUBECTL": kubectl})

    done = install("--dry-run", "--admin-kubeconfig", str(admin), "--node-name", NODE, "--token-duration", "2h")
    assert done.returncode == 0, done.stderr
    assert f"would run: /bin/true --kubeconfig {admin} apply -k {ROOT}/deploy/baremetal" in done.stdout
    assert (f"create --raw /api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token" in done.stdout
            and '"expirationSeconds":7200' in done.stdout and f'"kind":"Node","apiVersion":"v1","name":"{NODE}"'
            in done.stdout)
    assert not (tmp_path / "root").exists()
    for args, code, why in (
            (["--proxy-only"], 2, "which --proxy-only does not install"),
            (["--local"], 2, "no --kubeconfig, no --local"),
            (["--token-duration", "7d"], 2, "a duration as 168h"),
    ):
        refused = install("--admin-kubeconfig", str(admin), *args)
        assert (refused.returncode, why in refused.stderr) == (code, True), refused.stderr
    missing = install("--admin-kubeconfig", str(admin), kubectl="/nonexistent/kubectl")
    assert missing.returncode == 1 and "needs kubectl" in missing.stderr
