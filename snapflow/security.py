"""Transport security and access control, shared by the coordinator and the worker agents.

One module owns who may talk to a Snapflow endpoint ([security.md](../docs/security.md)):

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
* **Authorisation**: :data:`RPC_ROLES`, the one table of which role may call which RPC.
  Health checks and reflection stay open (they reveal service names, nothing else).

With nothing configured every function here is a no-op: plaintext, no interceptor.
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import inspect
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from snapflow.errors import ConfigError

log = structlog.get_logger("snapflow.security")

ENV_PREFIX = "SNAPFLOW_"
TOKEN_ENV = "SNAPFLOW_TOKEN"
"""A client's bearer token as an environment variable (when no ``token_file`` is set)."""

MAX_SECRET_FILE_BYTES = 1024 * 1024
TOKEN_RELOAD_INTERVAL_S = 1.0


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


_R, _O, _S = CallerRole.READ, CallerRole.OPERATOR, CallerRole.SERVICE

RPC_ROLES: Mapping[str, frozenset[CallerRole]] = {
    # --- CoordinatorService ---
    "/snapflow.v1.CoordinatorService/SubmitJob": frozenset({_O}),
    # Agents read the graph (with payloads) and the peers' addresses at deployment.
    "/snapflow.v1.CoordinatorService/GetJob": frozenset({_R, _O, _S}),
    "/snapflow.v1.CoordinatorService/ListJobs": frozenset({_R, _O}),
    "/snapflow.v1.CoordinatorService/CancelJob": frozenset({_O}),
    "/snapflow.v1.CoordinatorService/WatchJob": frozenset({_R, _O}),
    "/snapflow.v1.CoordinatorService/RegisterTask": frozenset({_S}),
    "/snapflow.v1.CoordinatorService/UpdateTaskState": frozenset({_S}),
    "/snapflow.v1.CoordinatorService/ListTasks": frozenset({_R, _O, _S}),
    "/snapflow.v1.CoordinatorService/Heartbeat": frozenset({_S}),
    "/snapflow.v1.CoordinatorService/AcknowledgeCheckpoint": frozenset({_S}),
    "/snapflow.v1.CoordinatorService/AcknowledgeCheckpoints": frozenset({_S}),
    "/snapflow.v1.CoordinatorService/DeclineCheckpoint": frozenset({_S}),
    # Agents ask for the final checkpoint of a job without periodic checkpoints.
    "/snapflow.v1.CoordinatorService/TriggerCheckpoint": frozenset({_O, _S}),
    "/snapflow.v1.CoordinatorService/TriggerSavepoint": frozenset({_O}),
    "/snapflow.v1.CoordinatorService/StopWithSavepoint": frozenset({_O}),
    "/snapflow.v1.CoordinatorService/DisposeSavepoint": frozenset({_O}),
    "/snapflow.v1.CoordinatorService/StartSavepoint": frozenset({_O}),
    "/snapflow.v1.CoordinatorService/GetSavepointOperation": frozenset({_R, _O}),
    "/snapflow.v1.CoordinatorService/GetCheckpointStats": frozenset({_R, _O}),
    "/snapflow.v1.CoordinatorService/GetCheckpointDetails": frozenset({_R, _O}),
    # --- WorkerControlService (called by the coordinator) ---
    "/snapflow.v1.WorkerControlService/TriggerCheckpoint": frozenset({_S}),
    "/snapflow.v1.WorkerControlService/NotifyCheckpointComplete": frozenset({_S}),
    "/snapflow.v1.WorkerControlService/NotifyCheckpointAborted": frozenset({_S}),
    "/snapflow.v1.WorkerControlService/CancelTask": frozenset({_S}),
    # --- DataExchangeService (called by peer agents) ---
    "/snapflow.v1.DataExchangeService/Exchange": frozenset({_S}),
}
"""Which roles may call each RPC; an RPC of a Snapflow service missing here is refused."""

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Method prefixes that need no credentials: health checks (probes, load balancers) and
reflection (service and message names only)."""


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
        out[name.strip()] = _roles(roles.replace("+", ","), "auth_identities")
    return out


def _roles(text: str, what: str) -> frozenset[CallerRole]:
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


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


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


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


# ---------------------------------------------------------------------------------------------
# Server and channel credentials
# ---------------------------------------------------------------------------------------------


class _ServerCertificates:
    """Reads the server's certificate files and re-reads them when one changed (grpc calls
    :meth:`fetch` before each new handshake)."""

    def __init__(self, settings: SecuritySettings) -> None:
        self.settings = settings
        self._paths = [
            p
            for p in (settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)
            if p
        ]
        self._stamp = self._stamps()
        self.initial = self._config()

    def _stamps(self) -> tuple[float, ...]:
        return tuple(_mtime(p) for p in self._paths)

    def _config(self) -> Any:
        s = self.settings
        key = read_secret_file(s.tls_key_file, "tls_key_file")
        chain = read_secret_file(s.tls_cert_file, "tls_cert_file")
        roots = (
            read_secret_file(s.tls_client_ca_file, "tls_client_ca_file")
            if s.tls_client_ca_file
            else None
        )
        return grpc.ssl_server_certificate_configuration([(key, chain)], roots)

    def fetch(self) -> Any:
        stamp = self._stamps()
        if stamp == self._stamp:
            return None
        try:
            config = self._config()
        except ConfigError as e:  # half-written or removed: keep serving with the old files
            log.warning("tls.reload_failed", error=str(e)[:300])
            return None
        self._stamp = stamp
        log.info("tls.reloaded", files=len(self._paths))
        return config


def server_credentials(settings: SecuritySettings) -> grpc.ServerCredentials | None:
    """TLS credentials of a server (mutual TLS with ``tls_client_ca_file``), or None for
    plaintext."""
    if not settings.server_tls:
        return None
    certificates = _ServerCertificates(settings)
    return grpc.dynamic_ssl_server_credentials(
        certificates.initial,
        certificates.fetch,
        require_client_authentication=bool(settings.tls_client_ca_file),
    )


def add_port(server: grpc.aio.Server, address: str, settings: SecuritySettings) -> int:
    """Bind ``address`` with TLS or plaintext as configured; the bound port (0: failed)."""
    credentials = server_credentials(settings)
    if credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials)


def channel_credentials(
    settings: SecuritySettings, environ: Mapping[str, str] | None = None
) -> grpc.ChannelCredentials | None:
    """A client's TLS credentials (with its certificate and its bearer token when set), or
    None for plaintext. A token without TLS is a ConfigError: it would travel in clear."""
    token = load_token(settings, environ)
    if not settings.client_tls:
        if token:
            raise ConfigError(
                "a bearer token is set (token_file or SNAPFLOW_TOKEN) but TLS is off: set "
                "tls_ca_file so the token is not sent in clear"
            )
        return None
    roots = read_secret_file(settings.tls_ca_file, "tls_ca_file") if settings.tls_ca_file else None
    key = chain = None
    if settings.tls_cert_file:
        key = read_secret_file(settings.tls_key_file, "tls_key_file")
        chain = read_secret_file(settings.tls_cert_file, "tls_cert_file")
    credentials = grpc.ssl_channel_credentials(roots, key, chain)
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return credentials


def channel_options(settings: SecuritySettings) -> list[tuple[str, Any]]:
    if settings.client_tls and settings.tls_server_name:
        return [("grpc.ssl_target_name_override", settings.tls_server_name)]
    return []


def aio_channel(
    address: str,
    settings: SecuritySettings = PLAINTEXT,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``address``, TLS and token as configured."""
    credentials = channel_credentials(settings)
    opts = [*options, *channel_options(settings)]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=opts)
    return grpc.aio.secure_channel(address, credentials, options=opts)


def sync_channel(
    address: str,
    settings: SecuritySettings = PLAINTEXT,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A synchronous channel to ``address``, TLS and token as configured."""
    credentials = channel_credentials(settings)
    opts = [*options, *channel_options(settings)]
    if credentials is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, credentials, options=opts)


# ---------------------------------------------------------------------------------------------
# Authentication and authorisation
# ---------------------------------------------------------------------------------------------


def parse_tokens(
    text: str, what: str = "auth_tokens_file"
) -> list[tuple[bytes, frozenset[CallerRole]]]:
    """Lines ``ROLE[,ROLE] TOKEN`` -> [(token, roles)]; errors name the line, never a token."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"{what}: line {number} is not 'ROLE[,ROLE] TOKEN'")
        roles = _roles(parts[0], f"{what} line {number}")
        if len(parts[1]) < 16:
            raise ConfigError(f"{what}: line {number}: tokens need at least 16 characters")
        entries.append((parts[1].encode(), roles))
    return entries


@dataclass(frozen=True)
class Principal:
    """Who a call comes from (for logs: the kind and the certificate name, never a token)."""

    roles: frozenset[CallerRole]
    via: str


class Authenticator:
    """Maps a call's token or verified certificate to roles; the tokens file is re-read when
    it changes (checked at most once a second)."""

    def __init__(self, settings: SecuritySettings) -> None:
        self.settings = settings
        self.identities = parse_identities(settings.auth_identities)
        self._tokens: list[tuple[bytes, frozenset[CallerRole]]] = []
        self._stamp: float | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self._load_tokens()

    def _load_tokens(self) -> None:
        path = self.settings.auth_tokens_file
        if not path:
            return
        stamp = _mtime(path)
        if stamp == self._stamp:
            return
        raw = read_secret_file(path, "auth_tokens_file")
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise ConfigError(f"auth_tokens_file: {path} is not UTF-8 text") from None
        self._tokens = parse_tokens(text)
        self._stamp = stamp

    def _tokens_now(self) -> list[tuple[bytes, frozenset[CallerRole]]]:
        now = time.monotonic()
        if now - self._checked >= TOKEN_RELOAD_INTERVAL_S:
            with self._lock:
                self._checked = now
                try:
                    self._load_tokens()
                except ConfigError as e:  # keep the last good table
                    log.warning("auth.tokens_reload_failed", error=str(e)[:300])
        return self._tokens

    def token_roles(self, token: str) -> frozenset[CallerRole] | None:
        """The roles of ``token``, or None if it is unknown; every entry is compared in
        constant time, so timing tells nothing about how close a guess was."""
        candidate = token.encode()
        found: frozenset[CallerRole] | None = None
        for known, roles in self._tokens_now():
            if hmac.compare_digest(candidate, known):
                found = roles
        return found

    def identity_roles(self, names: Iterable[str]) -> tuple[frozenset[CallerRole], str]:
        roles: set[CallerRole] = set()
        matched = ""
        for name in names:
            if name in self.identities:
                roles |= self.identities[name]
                matched = matched or name
        if "*" in self.identities:
            roles |= self.identities["*"]
            matched = matched or "*"
        return frozenset(roles), matched

    def authenticate(
        self, metadata: Iterable[tuple[str, Any]], auth_context: Mapping[str, Iterable[bytes]]
    ) -> Principal | None:
        """A bearer token decides when present (a wrong one is refused); else the identity of
        a verified client certificate; None: not authenticated."""
        for key, value in metadata:
            if key == "authorization":
                text = value.decode() if isinstance(value, bytes) else str(value)
                scheme, _, token = text.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    return None
                roles = self.token_roles(token.strip())
                return None if roles is None else Principal(roles, "token")
        if not _verified_tls(auth_context):
            return None
        names = [
            v.decode(errors="replace")
            for key in ("x509_common_name", "x509_subject_alternative_name")
            for v in auth_context.get(key, ())
        ]
        if not names:
            return None
        roles, matched = self.identity_roles(names)
        if not roles:
            return None
        return Principal(roles, f"certificate {matched}")


def _verified_tls(auth_context: Mapping[str, Iterable[bytes]]) -> bool:
    # Only a server that requires client certificates verifies them; it then reports them.
    return b"ssl" in list(auth_context.get("transport_security_type", ())) and bool(
        list(auth_context.get("x509_pem_cert", ()))
    )


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call before its handler runs: UNAUTHENTICATED without valid credentials,
    PERMISSION_DENIED when the caller's roles are not in :data:`RPC_ROLES` for the method."""

    def __init__(
        self, authenticator: Authenticator, table: Mapping[str, frozenset[CallerRole]] = RPC_ROLES
    ) -> None:
        self.authenticator = authenticator
        self.table = table

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        allowed = self.table.get(method, frozenset())
        return _guarded(handler, lambda context: self._check(context, method, allowed))

    async def _check(
        self, context: grpc.aio.ServicerContext, method: str, allowed: frozenset[CallerRole]
    ) -> None:
        principal = self.authenticator.authenticate(
            context.invocation_metadata() or (), context.auth_context()
        )
        if principal is None:
            log.info("auth.unauthenticated", method=method)
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "no valid credentials: send 'authorization: Bearer <token>' with a known token "
                "or a client certificate whose name has a role",
            )
            return
        if not principal.roles & allowed:
            log.info("auth.denied", method=method, via=principal.via)
            needed = ", ".join(sorted(r.value for r in allowed)) or "none (not callable)"
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method.rsplit('/', 1)[-1]} needs one of the roles: {needed}",
            )


def _guarded(
    handler: grpc.RpcMethodHandler,
    check: Callable[[grpc.aio.ServicerContext], Awaitable[None]],
) -> grpc.RpcMethodHandler:
    """``handler`` whose behaviour first awaits ``check`` (which aborts the call)."""

    def wrap(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behaviour):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                await check(context)
                async for item in behaviour(request, context):
                    yield item

            return stream

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return unary

    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attribute, factory in kinds:
        behaviour = getattr(handler, attribute)
        if behaviour is not None:
            return factory(
                wrap(behaviour),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def server_interceptors(settings: SecuritySettings) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors of a server: the access check when authorisation is on."""
    if not settings.auth_enabled:
        return []
    return [AuthInterceptor(Authenticator(settings))]


def describe(settings: SecuritySettings) -> dict[str, Any]:
    """What is on, for a start-up log line (file names, never contents)."""
    return {
        "tls": settings.server_tls,
        "mutual_tls": bool(settings.tls_client_ca_file),
        "auth": settings.auth_enabled,
        "client_tls": settings.client_tls,
    }
