"""Who may talk to a router: bearer tokens for the worker channel and the front doors.

- **Worker channel.** Workers dial a gRPC server of their own (`ServerSettings.worker_port`,
  never the clients' gRPC port) and send the pipeline's worker token as the metadata
  `authorization: Bearer <token>` on `WorkerService.Connect`; the router checks it before
  it reads Hello. The token reaches a worker through `SLOLINE_WORKER_TOKEN` (the embedded
  mode generates one per run; on Kubernetes the operator keeps one per pipeline in a
  Secret) or a file (`--token-file`), never through argv, which `ps` shows to everyone.
- **Front doors.** With a token file, REST requests need `Authorization: Bearer <token>`
  (except the health probes) and gRPC calls the same `authorization` metadata
  (`guard.py`: `BearerAuth`, `TokenInterceptor`).

Pure: no gRPC or ASGI imports (the CLI imports this before gRPC is configured).

Every comparison is constant-time (`hmac.compare_digest`) against every accepted token,
so neither the answer nor its timing tells how much of a guess was right.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

WORKER_TOKEN_ENV: Final = "SLOLINE_WORKER_TOKEN"  # noqa: S105 - a variable name
AUTHORIZATION: Final = "authorization"
# REST paths answered without a token: the kubelet's probes carry no credentials.
OPEN_PATHS: Final = frozenset({"/v2/health/live", "/v2/health/ready"})


class AuthConfigError(ValueError):
    """A token or certificate setting that cannot work; the message says how to fix it."""


def generate_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def read_token_file(path: str | Path, what: str) -> tuple[str, ...]:
    """The tokens in `path`, one per line (blank lines and `#` comments skipped)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AuthConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    tokens = tuple(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )
    if not tokens:
        raise AuthConfigError(f"{what}: {path} holds no token (one per line)")
    for token in tokens:
        if any(c.isspace() for c in token) or not token.isprintable():
            raise AuthConfigError(
                f"{what}: {path} has a token with whitespace or control characters"
            )
    return tokens


def worker_token(
    token_file: str | None, environ: dict[str, str] | None = None, flag: str = "--token-file"
) -> str | None:
    """The worker token: from `token_file` (given as `flag`) if any, else
    `$SLOLINE_WORKER_TOKEN`, else None."""
    if token_file:
        tokens = read_token_file(token_file, flag)
        if len(tokens) != 1:
            raise AuthConfigError(f"{flag}: {token_file} must hold exactly one token")
        return tokens[0]
    value = (os.environ if environ is None else environ).get(WORKER_TOKEN_ENV, "").strip()
    return value or None


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying `token` (none without one)."""
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()


def _bearer(value: str | bytes | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` value, or None."""
    if value is None:
        return None
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
    scheme, _, token = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


class TokenSet:
    """Accepted tokens; `matches` compares a presented one with each, in constant time."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = tuple(t.encode() for t in tokens)
        if not self._tokens:
            raise AuthConfigError("a token set needs at least one token")

    def matches(self, presented: bytes | None) -> bool:
        if presented is None:
            return False
        ok = False
        for token in self._tokens:  # no early exit: the time does not say which one matched
            ok |= hmac.compare_digest(presented, token)
        return ok

    def authorizes(self, header: str | bytes | None) -> bool:
        """Whether an `authorization` header/metadata value carries an accepted token."""
        return self.matches(_bearer(header))


def metadata_value(metadata: Sequence[Any] | None, key: str = AUTHORIZATION) -> str | None:
    """The first value of `key` in gRPC invocation metadata."""
    for item in metadata or ():
        if item[0] == key:
            value = item[1]
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None
