"""Who may talk to a Snapflow endpoint, shared by the coordinator and the worker agents: a
process's security settings, the roles a caller may have, and the secret files.

Three modules together own who may talk ([security.md](../docs/security.md)): this one (the
settings, :class:`CallerRole`, tokens and secret files), :mod:`snapflow.tls` (the transport)
and :mod:`snapflow.access_control` (who a caller is and what it may call):

* **TLS** with grpc's own credentials. A server with ``tls_cert_file``/``tls_key_file`` serves
  TLS (the files are re-read on change, before each new handshake, through
  ``grpc.dynamic_ssl_server_credentials``); with ``tls_client_ca_file`` it also requires and
  verifies a client certificate (mutual TLS). A client with ``tls_ca_file`` (or a certificate
  of its own) connects with TLS and presents its certificate when it has one.
* **Authentication**: a bearer token (``authorization: Bearer <token>`` metadata, sent with
  grpc's access-token call credentials, so only over TLS) or the identity of a verified
  client certificate (its subject CN and SANs). Tokens come from files (``token_file``, the
  server's ``auth_tokens_file``) or the ``SNAPFLOW_TOKEN`` environment variable, never from a
  flag, are compared with ``hmac.compare_digest`` and are never logged.
* **Authorisation**: ``RPC_ROLES``, the one table of which role may call which RPC.
  Health checks and reflection stay open (they reveal service names, nothing else).

With nothing configured every function of the three is a no-op: plaintext, no interceptor.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

from snapflow.errors import ConfigError

ENV_PREFIX = "SNAPFLOW_"
TOKEN_ENV = "SNAPFLOW_TOKEN"
"""A client's bearer token as an environment variable (when no ``token_file`` is set)."""

MAX_SECRET_FILE_BYTES = 1024 * 1024


class CallerRole(enum.StrEnum):
    """What a caller may do (not a coordinator's place in the leader election: that is
    ``coordinator.leadership.LeadershipRole``). A caller has a set of roles; no role implies
    another."""

    READ = "read"
    """Read-only: list and get jobs and tasks, statistics, watch."""
    OPERATOR = "operator"
    """Everything a read-only caller may, plus submit, trigger, savepoint, stop, cancel,
    dispose."""
    SERVICE = "service"
    """The internal role of agents and the coordinator: register, task states, acknowledge,
    decline, the agents' control service and the data exchange."""


def parse_identities(text: str) -> dict[str, frozenset[CallerRole]]:
    """``"agent=service,ops=operator+read"`` -> {name: roles}."""
    out: dict[str, frozenset[CallerRole]] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, roles = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                f"auth_identities: {item[:80]!r} is not NAME=ROLE[+ROLE] (e.g. agent=service)"
            )
        out[name.strip()] = parse_roles(roles.replace("+", ","), "auth_identities")
    return out


def parse_roles(text: str, what: str) -> frozenset[CallerRole]:
    """``"read,operator"`` -> roles; a ConfigError naming ``what`` for an unknown one."""
    roles = set()
    for word in text.split(","):
        word = word.strip().lower()
        try:
            roles.add(CallerRole(word))
        except ValueError:
            raise ConfigError(
                f"{what}: {word[:40]!r} is not a role; roles: {', '.join(r.value for r in CallerRole)}"
            ) from None
    return frozenset(roles)


@dataclass(frozen=True)
class SecuritySettings:
    """TLS files and access-control settings of one process (server and client side)."""

    tls_cert_file: str = ""
    """PEM certificate chain this process presents: as a server, and as a client for mutual
    TLS. With ``tls_key_file``, turns TLS on for the servers of this process."""

    tls_key_file: str = ""
    """PEM private key of ``tls_cert_file``."""

    tls_ca_file: str = ""
    """PEM CA bundle a client verifies the server's certificate with; empty with TLS on uses
    grpc's default roots. Setting it turns TLS on for this process's clients."""

    tls_client_ca_file: str = ""
    """PEM CA bundle a server verifies client certificates with; when set, every client must
    present a certificate signed by it (mutual TLS)."""

    tls_server_name: str = ""
    """Name a client checks the server certificate against instead of the address's host
    (e.g. ``coordinator`` when connecting to an IP address)."""

    token_file: str = ""
    """File holding this process's bearer token for its outgoing calls (else the
    ``SNAPFLOW_TOKEN`` environment variable). Tokens travel only over TLS."""

    auth_tokens_file: str = ""
    """Server: the accepted tokens, one ``ROLE[,ROLE] TOKEN`` per line (roles: read,
    operator, service; ``#`` starts a comment); re-read when it changes. Setting it (or
    ``auth_identities``) turns authorisation on."""

    auth_identities: str = ""
    """Server: roles of verified client certificates, ``NAME=ROLE[+ROLE]`` separated by
    commas; NAME is a subject CN or SAN, ``*`` any verified certificate. Needs
    ``tls_client_ca_file``."""

    @property
    def server_tls(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def client_tls(self) -> bool:
        return bool(self.tls_ca_file or self.tls_cert_file)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens_file or self.auth_identities)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str):
                raise ConfigError(f"security setting {f.name!r} must be a string")
            object.__setattr__(self, f.name, value.strip())
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                "tls_cert_file and tls_key_file go together: set both (TLS on) or neither"
            )
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError(
                "tls_client_ca_file (mutual TLS) needs a server certificate: set tls_cert_file "
                "and tls_key_file"
            )
        if self.auth_enabled and not self.server_tls:
            raise ConfigError(
                "auth_tokens_file/auth_identities need TLS, or tokens would travel in clear: "
                "set tls_cert_file and tls_key_file"
            )
        if self.auth_identities and not self.tls_client_ca_file:
            raise ConfigError(
                "auth_identities needs verified client certificates: set tls_client_ca_file"
            )
        parse_identities(self.auth_identities)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SecuritySettings:
        """The settings from ``SNAPFLOW_<FIELD_UPPER>`` variables (``SNAPFLOW_TLS_CA_FILE``)."""
        env = os.environ if environ is None else environ
        return cls(
            **{f.name: env.get(ENV_PREFIX + f.name.upper(), "") for f in dataclasses.fields(cls)}
        )

    def replace(self, **changes: str) -> SecuritySettings:
        return dataclasses.replace(self, **changes)


SECURITY_FIELDS = tuple(f.name for f in dataclasses.fields(SecuritySettings))
PLAINTEXT = SecuritySettings()


def read_secret_file(path: str, what: str) -> bytes:
    """The bytes of ``path``; a bounded ConfigError naming the setting otherwise (never the
    content)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path}: {e.strerror or type(e).__name__}") from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{what}: {path} is larger than {MAX_SECRET_FILE_BYTES} bytes")
    return data


def load_token(settings: SecuritySettings, environ: Mapping[str, str] | None = None) -> str:
    """This process's bearer token: ``token_file``, else ``$SNAPFLOW_TOKEN``, else empty."""
    if settings.token_file:
        raw = read_secret_file(settings.token_file, "token_file")
        try:
            token = raw.decode().strip()
        except UnicodeDecodeError:
            raise ConfigError(f"token_file: {settings.token_file} is not UTF-8 text") from None
        if not token or any(c.isspace() for c in token):
            raise ConfigError(
                f"token_file: {settings.token_file} must hold one token without spaces"
            )
        return token
    env = os.environ if environ is None else environ
    return env.get(TOKEN_ENV, "").strip()


def modified_stamp(path: str) -> float:
    """The file's modification time (ns), -1 when it cannot be read: tells a reload when a
    file changed."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1
