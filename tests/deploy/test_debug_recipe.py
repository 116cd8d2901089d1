"""The recipe of docs/operations.md for reading koordlet's ``/debug`` (Who may read `/events` and `/debug/*`): its
kubectl commands, exactly as written, run by real kubectl against the project's API server, and koordlet's own guard
(koordlet/debug/authz.py: TokenReview, then SubjectAccessReview on ``get nodes/proxy`` of its node) asked on the
node the role names and on another. That server speaks JSON only, and ``kubectl create`` sends protobuf, so each
``kubectl create`` makes its object with ``--dry-run=client -o json`` (kubectl's own object, unchanged) and the test
POSTs it; ``kubectl create token`` needs the TokenRequest API, which that server does not serve: the token is
registered with it for the service account's user instead."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
from pathlib import Path

from koordlet.debug.authz import ApiAuthorizer
from koordlet.debug.explain import main as explain
from koordlet.kubeapi import AuthV1
from tests.deploy.tools import ROOT, create_object, tool
from tests.support.apiserver import ApiServer, kube_api_client, write_kubeconfig
from tests.test_docs_commands import extract

TOKEN = "debug-session-token"


def _recipe() -> list[list[str]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("### Who may read `/events` and `/debug/*`")
    end = text.find("\n#", start + 1)
    section = text[start:end if end > 0 else len(text)]
    return [shlex.split(c.text) for c in extract("docs/operations.md", section) if not c.inline]


def _kubectl(words: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([tool("kubectl-1.35"), *words[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr}"
    return done.stdout


def test_the_recipe_grants_the_named_node_only_and_takes_it_back(tmp_path: Path) -> None:
    recipe = _recipe()
    [create_token] = [w for w in recipe if w[:3] == ["kubectl", "create", "token"]]
    [ask] = [w for w in recipe if w[:2] == ["koordlet", "explain"]]
    [delete] = [w for w in recipe if w[:2] == ["kubectl", "delete"]]
    grants = [w for w in recipe if w[:2] == ["kubectl", "create"] and w is not create_token]
    assert [w[2] for w in grants] == ["clusterrole", "serviceaccount", "clusterrolebinding"]
    [role] = [w for w in grants if w[2] == "clusterrole"]
    assert "--resource=nodes/proxy" in role and "--verb=get" in role
    node = next(w.split("=", 1)[1] for w in role if w.startswith("--resource-name="))
    namespace = create_token[create_token.index("-n") + 1]
    account = f"system:serviceaccount:{namespace}:{create_token[3]}"
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
               "KUBECONFIG": str(write_kubeconfig(server, tmp_path / "kubeconfig"))}
        for words in grants:
            create_object(client, json.loads(_kubectl([*words, "--dry-run=client", "-o", "json"], env)))
        server.add_token(TOKEN, account, ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                          "system:authenticated"))
        assert ApiAuthorizer(AuthV1(client), node).decide(TOKEN).status == 200
        refused = ApiAuthorizer(AuthV1(client), "worker-2").decide(TOKEN)
        assert refused.status == 403 and 'cannot get resource "nodes/proxy" of node "worker-2"' in refused.message
        _kubectl(delete, env)
        assert ApiAuthorizer(AuthV1(client), node).decide(TOKEN).status == 403  # a new guard: no cached answer
    # The question's flags are koordlet explain's (2 would be argparse refusing one); here nobody answers it.
    (tmp_path / "token").write_text(TOKEN)
    os.chdir(tmp_path)
    try:
        assert explain(ask[2:], stdout=io.StringIO()) == 1
    finally:
        os.chdir(ROOT)
    assert any(w.startswith("https://") for w in ask) and "--ca-file" in ask
