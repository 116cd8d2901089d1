"""Who a request to the project's API server is, as kube-apiserver's authenticators decide it.

- **Client certificates** (``--client-ca-file``): CN is the user, each O a group (tests/support/pki.py issues them);
  TLS has verified the chain before a request is read.
- **Service-account tokens**: JWTs the server issued itself (TokenRequest, ``POST
  /api/v1/namespaces/<ns>/serviceaccounts/<name>/token``), each bound to audiences, an expiry, its service account's
  uid and optionally a Pod or Node (then the token dies with that object). The user is
  ``system:serviceaccount:<ns>:<name>`` in ``system:serviceaccounts``, ``system:serviceaccounts:<ns>`` and
  ``system:authenticated``, with the real server's extra keys (credential id, bound pod or node).
- **Static tokens** (``--token-auth-file``): a token the test registered names its user, uid and groups.
- **No credential**: refused (``--anonymous-auth=false``, what the kubelet-facing and hardened setups use).

Every authenticated user is also in ``system:authenticated``, as the real union authenticator adds it.

Deviation (also listed in apiserver.py's header): tokens are signed with HMAC-SHA256 by a key only the server holds,
where the real issuer signs RS256/ES256 with a key whose public half it publishes (``/openid/v1/jwks``). Nothing
outside the server verifies a token here, so the algorithm changes nothing a client can see but the JWT header.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ISSUER = "https://kubernetes.default.svc.cluster.local"
API_AUDIENCES = (ISSUER,)  # kubeadm's --api-audiences default: the issuer
AUTHENTICATED = "system:authenticated"
SERVICE_ACCOUNTS = "system:serviceaccounts"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
_BOUND_EXTRA = {"Pod": ("authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"),
                "Node": ("authentication.kubernetes.io/node-name", "authentication.kubernetes.io/node-uid")}


@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated user (k8s.io/apiserver user.Info)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_review(self) -> dict[str, Any]:
        """The ``user`` of a TokenReview status (also the subject fields of a SubjectAccessReview spec)."""
        out: dict[str, Any] = {"username": self.name, "uid": self.uid, "groups": list(self.groups)}
        if self.extra:
            out["extra"] = {key: list(values) for key, values in self.extra.items()}
        return out

    @property
    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) of a service account user, else None."""
        if not self.name.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        namespace, _, name = self.name[len(SERVICE_ACCOUNT_PREFIX):].partition(":")
        return (namespace, name) if namespace and name else None


def with_authenticated(user: UserInfo) -> UserInfo:
    """``user`` with ``system:authenticated`` added, as the real authenticator chain does."""
    if AUTHENTICATED in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED), user.extra)


class AuthenticationError(Exception):
    """The credential was given but is not good (the request is 401, a TokenReview unauthenticated)."""


def user_of_certificate(common_name: str, organizations: tuple[str, ...]) -> UserInfo:
    """The user a verified client certificate names (k8s.io/apiserver x509.CommonNameUserConversion)."""
    if not common_name:
        raise AuthenticationError("the client certificate has no common name")
    return with_authenticated(UserInfo(common_name, "", organizations))


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme is case-insensitive, RFC 7235)."""
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    expires_at: float  # Unix seconds
    audiences: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BoundObject:
    """What a bound token is tied to: a Pod or a Node (TokenRequest spec.boundObjectRef)."""

    kind: str
    name: str
    uid: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# (namespace, name) -> the service account's uid, or None when it does not exist
AccountLookup = Callable[[str, str], str | None]
# (kind, namespace, name) -> the object's uid, or None when it does not exist
ObjectLookup = Callable[[str, str, str], str | None]


class ServiceAccountTokens:
    """Issues and checks the server's service-account JWTs."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._key = secrets.token_bytes(32)
        self._clock = clock

    def issue(self, namespace: str, name: str, account_uid: str, audiences: tuple[str, ...], expiration_s: int,
              bound: BoundObject | None = None) -> IssuedToken:
        now = int(self._clock())
        claims: dict[str, Any] = {
            "aud": list(audiences), "exp": now + expiration_s, "iat": now, "nbf": now, "iss": ISSUER,
            "jti": str(uuid.uuid4()), "sub": f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": account_uid}}}
        if bound is not None:
            claims["kubernetes.io"][bound.kind.lower()] = {"name": bound.name, "uid": bound.uid}
        header = {"alg": "HS256", "kid": hashlib.sha256(self._key).hexdigest()[:16], "typ": "JWT"}
        signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
        signature = hmac.new(self._key, signing_input.encode(), hashlib.sha256).digest()
        return IssuedToken(f"{signing_input}.{_b64(signature)}", float(claims["exp"]), tuple(audiences))

    def authenticate(self, token: str, audiences: tuple[str, ...], account_uid: AccountLookup,
                     object_uid: ObjectLookup) -> tuple[UserInfo, tuple[str, ...]] | None:
        """(the user, the audiences it was accepted for) of one of our tokens; None for a token that is not ours
        (another authenticator may know it); AuthenticationError for ours that is no longer good."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except (ValueError, binascii.Error):
            return None
        if not isinstance(header, dict) or not isinstance(claims, dict) or claims.get("iss") != ISSUER:
            return None
        expected = hmac.new(self._key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(signature, expected):
            raise AuthenticationError("invalid bearer token, square/go-jose: error in cryptographic primitive")
        if float(claims.get("exp", 0)) <= self._clock():
            raise AuthenticationError("invalid bearer token, service account token has expired")
        accepted = tuple(a for a in claims.get("aud") or () if a in audiences)
        if not accepted:
            raise AuthenticationError("invalid bearer token, token audiences " + json.dumps(claims.get("aud"))
                                      + " is invalid for the target audiences " + json.dumps(list(audiences)))
        private = claims.get("kubernetes.io") or {}
        namespace = private.get("namespace", "")
        account = private.get("serviceaccount") or {}
        if account_uid(namespace, account.get("name", "")) != account.get("uid"):
            raise AuthenticationError(f'invalid bearer token, service account {namespace}/{account.get("name")} has '
                                      "been deleted or recreated")
        extra: dict[str, tuple[str, ...]] = {CREDENTIAL_ID: (f"JTI={claims.get('jti')}",)}
        for kind, (name_key, uid_key) in _BOUND_EXTRA.items():
            bound = private.get(kind.lower())
            if bound is None:
                continue
            if object_uid(kind, namespace if kind == "Pod" else "", bound.get("name", "")) != bound.get("uid"):
                raise AuthenticationError(f"invalid bearer token, the {kind} the token is bound to "
                                          f'({bound.get("name")}) has been deleted or recreated')
            extra |= {name_key: (bound["name"],), uid_key: (bound["uid"],)}
        user = UserInfo(claims["sub"], account.get("uid", ""),
                        (SERVICE_ACCOUNTS, f"{SERVICE_ACCOUNTS}:{namespace}", AUTHENTICATED), extra)
        return user, accepted
