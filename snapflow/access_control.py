"""Access control of Snapflow's gRPC servers: who a caller is (a bearer token or a verified
client certificate) and what it may call (:data:`RPC_ROLES`, the one table of which role may
call which RPC), checked by a server interceptor before any handler runs. Health checks and
reflection stay open. Off unless ``auth_tokens_file`` or ``auth_identities`` is set.
"""

from __future__ import annotations

import hmac
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from snapflow.errors import ConfigError
from snapflow.security import (
    CallerRole,
    SecuritySettings,
    modified_stamp,
    parse_identities,
    parse_roles,
    read_secret_file,
)

log = structlog.get_logger("snapflow.access_control")

TOKEN_RELOAD_INTERVAL_S = 1.0

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
    "/snapflow.v1.WorkerControlService/Control": frozenset({_S}),
    # --- DataExchangeService (called by peer agents) ---
    "/snapflow.v1.DataExchangeService/Exchange": frozenset({_S}),
}
"""Which roles may call each RPC; an RPC of a Snapflow service missing here is refused."""

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Method prefixes that need no credentials: health checks (probes, load balancers) and
reflection (service and message names only)."""


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
        roles = parse_roles(parts[0], f"{what} line {number}")
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
        stamp = modified_stamp(path)
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
