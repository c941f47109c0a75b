"""Bearer-token authorisation for the HTTP API.

The operator binds each token to the user ids it may touch::

    ARBORMEM_API_TOKENS="tokA:alice,bob;tokB:carol;tokC:*"     # * = every user

A request to ``/v1/...`` without a known token gets 401; a request for a user the token is not
bound to gets 403. The check runs in an ASGI middleware (``app.py``) before routing and body
parsing, so it holds for every route, including ones added later and malformed requests.
Tokens are compared in constant time. No token policy at all is a configuration error unless
the app is built with ``allow_anonymous=True`` (``arbormem serve --no-auth``, loopback only).
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

ENV = "ARBORMEM_API_TOKENS"
ALL = "*"
# The spec's own spacing ("tokA: alice, bob"): only ASCII blanks are trimmed. str.strip() also
# removed U+00A0 and other Unicode spaces, so a grant for "bob\u00a0" reached "bob".
_BLANKS = " \t\r\n"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the users its token may touch (``everyone`` for ``*``)."""

    users: frozenset[str]
    everyone: bool = False

    def may(self, user_id: str) -> bool:
        return self.everyone or user_id in self.users

    def to_dict(self) -> dict[str, object]:
        return {"users": ALL if self.everyone else sorted(self.users)}


ANONYMOUS = Principal(frozenset(), everyone=True)


class TokenPolicy:
    """Token -> users map, parsed from ``"tok:u1,u2;tok2:*"`` or given as a mapping."""

    def __init__(self, grants: Mapping[str, Iterable[str] | str]) -> None:
        self._grants: dict[str, Principal] = {}
        for token, users in grants.items():
            # Length is the operator's choice (the documented example uses "tokA"); use long
            # random tokens in production.
            if (not isinstance(token, str) or not token or any(c in token for c in ":;,")
                    or any(c.isspace() for c in token) or not token.isprintable()):
                raise ConfigError("API tokens must be non-empty, without ':;,' or whitespace")
            names = [users] if isinstance(users, str) else list(users)
            names = [u.strip(_BLANKS) for u in names if isinstance(u, str) and u.strip(_BLANKS)]
            for u in names:
                if u != u.strip() or not u.isprintable():
                    raise ConfigError(f"API token {token[:4]}...: user {u!r} starts or ends with whitespace "
                                      "or holds control characters; user ids in grants must be exact")
            if not names:
                raise ConfigError(f"API token {token[:4]}... is bound to no user")
            self._grants[token] = Principal(frozenset(u for u in names if u != ALL), ALL in names)

    @classmethod
    def parse(cls, spec: str) -> TokenPolicy:
        grants: dict[str, list[str]] = {}
        for part in spec.split(";"):
            if not part.strip():
                continue
            token, sep, users = part.strip(_BLANKS).partition(":")
            if not sep:
                raise ConfigError(f"{ENV}: expected 'token:user1,user2' in {part.strip(_BLANKS)[:4]!r}...")
            token = token.strip(_BLANKS)
            if token in grants:
                # Two lines for one token are a mistake (a copy-paste, a rotated token left
                # in): merging them silently granted the union.
                raise ConfigError(f"{ENV}: token {token[:4]}... appears twice; give each token once")
            grants[token] = users.split(",")
        if not grants:
            raise ConfigError(f"{ENV} holds no token")
        return cls(grants)

    @classmethod
    def from_env(cls) -> TokenPolicy | None:
        spec = os.environ.get(ENV)
        return cls.parse(spec) if spec and spec.strip() else None

    def principal(self, token: str | None) -> Principal | None:
        """The principal of ``token`` or None; every token is compared (constant time)."""
        if not token:
            return None
        found = None
        for known, principal in self._grants.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found


def required_policy(*, no_auth: bool, what: str) -> TokenPolicy | None:
    """The token policy from the environment, checked before anything is opened: a server
    started without one refuses at once (``ConfigError``) unless ``no_auth``."""
    policy = TokenPolicy.from_env()
    if policy is None and not no_auth:
        raise ConfigError(f"{what} needs API tokens: set {ENV}='token:user1,user2;...' "
                          "(or --no-auth on a loopback host for local development)")
    return None if no_auth else policy


class BearerGuard:
    """Pure ASGI middleware for a server bound to one user (``arbormem mcp --http``): every
    HTTP request needs a bearer token of ``policy`` that may access ``user_id`` (401
    ``unauthorized`` without one, 403 ``forbidden`` for another user's token), the same
    policy and answers as the HTTP API. Lifespan events pass through."""

    def __init__(self, app: Any, policy: TokenPolicy, user_id: str) -> None:
        self.app, self.policy, self.user_id = app, policy, user_id

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or []).get(b"authorization")
        principal = self.policy.principal(bearer(raw.decode("latin-1")) if raw else None)
        if principal is None:
            await _deny(send, 401, "unauthorized", "missing or unknown bearer token")
        elif not principal.may(self.user_id):
            await _deny(send, 403, "forbidden", "this token may not access this server's user")
        else:
            await self.app(scope, receive, send)


async def _deny(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="arbormem"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip(_BLANKS) or None if scheme.lower() == "bearer" else None


__all__ = ["TokenPolicy", "Principal", "ANONYMOUS", "ENV", "BearerGuard", "bearer", "required_policy"]
