"""Refusals: a 401 or 403 from the API server or from kubelet, what was refused, and the rule that would allow it.

koordlet calls two servers, and either may refuse it:

- the **API server** answers a refusal with a ``Status``: 401 ``Unauthorized`` when it does not know the credential
  (an expired or revoked token, a kubeconfig without a user), 403 ``Forbidden`` with the message
  ``<resource> "<name>" is forbidden: User "<user>" cannot <verb> resource "<resource[/subresource]>" in API group
  "<group>" ...`` when RBAC (or the Node authorizer, or NodeRestriction) does not allow the call;
- **kubelet** (port 10250, webhook authorization) answers 401 ``Unauthorized`` and 403 ``Forbidden (user=…,
  verb=…, resource=nodes, subresource(s)=[pods proxy])``: it asked the API server whether the user may ``get
  nodes/pods`` (kubelet 1.33+ with KubeletFineGrainedAuthz) and then ``nodes/proxy``, and was told no.

:func:`from_api_answer` and :func:`from_kubelet_answer` read those answers into a :class:`Refusal` that names the
call, the user, the verb and resource refused, and the ClusterRole rule that would allow it. :class:`Refusals`
holds the current ones per source: it logs a refusal once when it starts (not at every retry), counts every one
(``koordlet_access_refused_total``), and forgets it when the same call is allowed again; the health checks read it
(koordlet/health.py: ``/readyz`` fails and ``/healthz`` names it, without failing: a restart does not change RBAC).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

API_SERVER = "apiserver"
KUBELET = "kubelet"
_ATTRIBUTE = "_koordlet_refusals"  # where an ApiClient carries the agent's Refusals (see watch_client)

_FORBIDDEN = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)" in API group '
                        r'"(?P<group>[^"]*)"(?: in the namespace "(?P<namespace>[^"]*)"| at the cluster scope)')
_FORBIDDEN_PATH = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) path "(?P<path>[^"]*)"')
_KUBELET_FORBIDDEN = re.compile(r"Forbidden \(user=(?P<user>[^,]*), verb=(?P<verb>[^,]*), resource=(?P<resource>[^,]*),"
                                r" subresource\(s\)=\[(?P<subresources>[^\]]*)\]\)")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused call: where, what, who, and what would allow it."""

    source: str  # API_SERVER or KUBELET
    code: int  # 401 or 403
    call: str  # "PUT /apis/slo.koordinator.sh/v1alpha1/nodemetrics/node-1/status"
    user: str = ""  # who the server took koordlet for ("" when it did not say)
    verb: str = ""
    resource: str = ""  # "nodemetrics/status", "nodes/pods"; "" for a 401
    group: str = ""
    rule: str = ""  # the RBAC rule that would allow the call, or what to do about a 401
    message: str = ""  # the server's own words

    @property
    def blocks_work(self) -> bool:
        """Whether the refused call is part of koordlet's work (not the reviews of the /debug guard, which a caller
        of /debug starts: that endpoint answers 503 then, and nothing else stops)."""
        return self.resource not in ("tokenreviews", "subjectaccessreviews")

    @property
    def blocks_states(self) -> bool:
        """Whether the states informer cannot sync for it: kubelet refuses the pod list, or the API server the node or
        the NodeSLO (without the node koordlet does not even know kubelet's address)."""
        if self.source == KUBELET:  # the pod list; not /configz (kubelet's memory QoS is then taken as unknown)
            return _call_kind(self.call).rstrip("/").endswith("/pods")
        return self.source == API_SERVER and self.resource in ("nodes", "nodeslos")

    @property
    def key(self) -> tuple[str, str]:
        """What a later success of the same call clears: (source, the call without its object name)."""
        return self.source, _call_kind(self.call)

    def describe(self) -> str:
        """One line for the log and the health endpoints."""
        server = "the API server" if self.source == API_SERVER else "kubelet"
        if self.code == 401:
            return f"{server} did not authenticate koordlet for {self.call} (401): {self.rule}"
        who = f"user {self.user}" if self.user else "koordlet"
        what = f"{self.verb} {self.resource}" + (f' in API group "{self.group}"' if self.group else "")
        allow = f"; the rule that allows it: {self.rule}" if self.rule else ""
        return f"{server} refused {self.call} (403): {who} may not {what}{allow} ({self.message})"


def _call_kind(call: str) -> str:
    """A call with its object name and namespace left out (``GET /api/v1/namespaces/*/pods/*``): a refused read of
    one pod is over when a read of another goes through, since one rule allows both; a kubelet URL is its path."""
    method, _, target = call.partition(" ")
    path = urlsplit(target).path if "://" in target else target.split("?", 1)[0]
    parts = [part for part in path.split("/") if part]
    if parts[:1] == ["api"] and len(parts) >= 3:
        head, rest = parts[:2], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        head, rest = parts[:3], parts[3:]
    else:
        return f"{method} /{'/'.join(parts)}"
    if rest[0] == "namespaces" and len(rest) >= 3:
        head, rest = [*head, "namespaces", "*"], rest[2:]
    shape = [rest[0], *(["*"] if len(rest) > 1 else []), *rest[2:3]]
    return f"{method} /{'/'.join(head + shape)}"


def rule_text(group: str, resources: list[str], verb: str) -> str:
    quoted = ", ".join(f'"{r}"' for r in resources)
    return f'{{apiGroups: ["{group}"], resources: [{quoted}], verbs: ["{verb}"]}}'


_API_401_HINT = ("the API server did not accept its credential: an expired or revoked service-account token, a "
                 "deleted service account, or a kubeconfig without a user")
_KUBELET_401_HINT = ("kubelet did not accept its credential: no token (-kubelet-token-file) or client certificate "
                     "(-kubelet-client-cert), a token the API server does not accept, or kubelet's webhook "
                     "authentication is off")


def from_api_answer(method: str, path: str, code: int, body: str) -> Refusal | None:
    """The refusal a 401 or 403 answer of the API server to ``method path`` says; None for any other answer."""
    call = f"{method} {path}"
    if code == 401:
        return Refusal(API_SERVER, 401, call, rule=_API_401_HINT, message="Unauthorized")
    if code != 403:
        return None
    try:
        status = json.loads(body)
        message = str(status.get("message", "")) if isinstance(status, dict) else body
    except ValueError:
        message = body
    match = _FORBIDDEN.search(message)
    if match is not None:
        rule = rule_text(match["group"], [match["resource"]], match["verb"])
        return Refusal(API_SERVER, 403, call, match["user"], match["verb"], match["resource"], match["group"], rule,
                       message)
    match = _FORBIDDEN_PATH.search(message)
    if match is not None:
        rule = f'{{nonResourceURLs: ["{match["path"]}"], verbs: ["{match["verb"]}"]}}'
        return Refusal(API_SERVER, 403, call, match["user"], match["verb"], match["path"], "", rule, message)
    return Refusal(API_SERVER, 403, call, message=message)  # admission (NodeRestriction...): no rule to name


def from_kubelet_answer(method: str, url: str, code: int, body: str) -> Refusal | None:
    """The refusal a 401 or 403 answer of kubelet to ``method url`` says; None for any other answer."""
    call = f"{method} {url}"
    if code == 401:
        return Refusal(KUBELET, 401, call, rule=_KUBELET_401_HINT, message=body.strip())
    if code != 403:
        return None
    match = _KUBELET_FORBIDDEN.search(body)
    if match is None:
        return Refusal(KUBELET, 403, call, message=body.strip())
    resource = match["resource"]
    asked = [f"{resource}/{sub}" for sub in match["subresources"].split()]
    verb = match["verb"]
    if len(asked) > 1 and asked[-1] == f"{resource}/proxy":  # a fine-grained subresource, then nodes/proxy
        rule = (f"{rule_text('', asked[:1], verb)} on kubelet 1.33+ (KubeletFineGrainedAuthz), or "
                f"{rule_text('', asked[1:], verb)} on older kubelets (nodes/proxy also allows exec and attach)")
    elif asked == [f"{resource}/proxy"]:
        rule = (f"{rule_text('', asked, verb)}: this kubelet asks for nodes/proxy alone (before 1.33, or with "
                "KubeletFineGrainedAuthz off)")
    else:
        rule = rule_text("", asked[:1], verb)
    return Refusal(KUBELET, 403, call, match["user"].strip(), verb, " or ".join(asked), "", rule, body.strip())


class Refusals:
    """The refusals in force, per source and kind of call; thread-safe."""

    def __init__(self, observe: Callable[[Refusal], None] | None = None) -> None:
        self._observe = observe or (lambda refusal: None)
        self._lock = threading.Lock()
        self._current: dict[tuple[str, str], Refusal] = {}

    def refused(self, refusal: Refusal) -> None:
        """Record a refusal: counted each time, logged when it starts or changes."""
        self._observe(refusal)
        with self._lock:
            before = self._current.get(refusal.key)
            self._current[refusal.key] = refusal
        if before != refusal:
            logger.warning("%s", refusal.describe())

    def allowed(self, source: str, call: str) -> None:
        """The call ``METHOD path`` went through: a refusal of that kind of call is over."""
        key = (source, _call_kind(call))
        with self._lock:
            gone = self._current.pop(key, None)
        if gone is not None:
            logger.info("%s allows %s again", "the API server" if source == API_SERVER else "kubelet", gone.call)

    def current(self) -> list[Refusal]:
        with self._lock:
            return sorted(self._current.values(), key=lambda r: r.key)

    def blocking_states(self) -> list[Refusal]:
        """The refusals the states informer cannot sync for (a restart would not change them)."""
        return [refusal for refusal in self.current() if refusal.blocks_states]


def watch_client(api_client: object, refusals: Refusals) -> None:
    """Make every call through ``api_client`` (koordlet.kubeapi) report its refusals to ``refusals``."""
    setattr(api_client, _ATTRIBUTE, refusals)


def refusals_of(api_client: object) -> Refusals | None:
    return getattr(api_client, _ATTRIBUTE, None)
