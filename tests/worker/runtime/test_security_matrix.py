"""The access matrix, walked RPC by RPC on a real coordinator and a real agent with TLS.

For every RPC of ``CoordinatorService``, ``WorkerControlService`` and ``DataExchangeService``:
no credentials, a wrong token, a token of a role the matrix does not allow, a client
certificate from an unknown CA and plaintext to the TLS port are each refused
(UNAUTHENTICATED, PERMISSION_DENIED, or UNAVAILABLE for a failed handshake) and change
nothing; the right token, or the service certificate, gets past the check.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from kit.coordinator import running_coordinator, two_vertex_graph
from kit.tls import Pki, make_pki

from snapflow.access_control import RPC_ROLES
from snapflow.security import CallerRole, SecuritySettings
from snapflow.tls import aio_channel, sync_channel
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import worker_pb2 as wpb
from snapflow.worker.runtime.agent import Agent

REFUSED = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAVAILABLE,  # the TLS handshake failed
}

SERVICES = [
    *cpb.DESCRIPTOR.services_by_name.values(),
    *wpb.DESCRIPTOR.services_by_name.values(),
]
METHODS = [m for s in SERVICES for m in s.methods]


def _path(method: Any) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def test_the_matrix_names_every_rpc_and_nothing_else() -> None:
    assert sorted(RPC_ROLES) == sorted(_path(m) for m in METHODS)
    assert all(roles for roles in RPC_ROLES.values())


def _request(method: Any, job_id: str, root: Path) -> bytes:
    message: Any = GetMessageClass(method.input_type)()
    fields = message.DESCRIPTOR.fields_by_name
    if "job_id" in fields:
        message.job_id = job_id
    if "target_directory" in fields:
        message.target_directory = str(root / "savepoints")
    if "savepoint_path" in fields:
        message.savepoint_path = str(root / "savepoints" / "savepoint-1")
    if "coordinator_epoch" in fields:
        message.coordinator_epoch = 7
    if method.name == "SubmitJob":
        message.graph.CopyFrom(two_vertex_graph(name="intruder"))
    if method.name == "Control":
        return wpb.ControlCommand(
            trigger=wpb.TriggerTaskCheckpointRequest(job_id=job_id, coordinator_epoch=7)
        ).SerializeToString()
    if method.name == "Exchange":
        return wpb.ExchangeMessage(
            open=wpb.ChannelId(job_id=job_id, producer_vertex_id="src", consumer_vertex_id="map")
        ).SerializeToString()
    return bytes(message.SerializeToString())


@dataclasses.dataclass(frozen=True)
class _Plaintext:
    """Plain text to the TLS port, sending a (valid) token: the server must not even parse
    the call."""

    token: str


def _aio_channel(address: str, client: SecuritySettings | _Plaintext) -> grpc.aio.Channel:
    if isinstance(client, _Plaintext):
        return grpc.aio.insecure_channel(address, interceptors=[_TokenInterceptor(client.token)])
    return aio_channel(address, client)


async def _call(
    address: str, client: SecuritySettings | _Plaintext, method: Any, request: bytes
) -> grpc.StatusCode:
    path = _path(method)
    if method.client_streaming:
        return await asyncio.to_thread(_call_stream, address, client, path, request)
    async with _aio_channel(address, client) as channel:
        try:
            if method.server_streaming:
                watch: Any = channel.unary_stream(path)(request, timeout=5)  # type: ignore[arg-type]
                await watch.read()
                watch.cancel()
                return grpc.StatusCode.OK
            await channel.unary_unary(path)(request, timeout=5)  # type: ignore[arg-type]
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            return e.code()


def _call_stream(
    address: str, client: SecuritySettings | _Plaintext, path: str, request: bytes
) -> grpc.StatusCode:
    """A client-streaming call through the synchronous API, which reports the status the
    server sent. grpc.aio does not always: when the server ends the call (a refusal) while a
    write is in flight, the failed write replaces the server's status with INTERNAL
    "Internal error from Core" (grpc/grpc#36066), about one call in 300 here."""
    if isinstance(client, _Plaintext):
        channel = grpc.insecure_channel(address)
        metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {client.token}"),)
    else:
        channel, metadata = sync_channel(address, client), ()
    with channel:
        call: Any = channel.stream_stream(path)
        responses: Any = call(iter([request]), timeout=5, metadata=metadata)
        with contextlib.suppress(StopIteration, grpc.RpcError):
            next(responses)  # the first response, or the call's end
        code: grpc.StatusCode = responses.code()
        return code


class _TokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the token to the unary-unary calls of :func:`_aio_channel` in plain text."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add("authorization", f"Bearer {self.token}")
        return await continuation(details._replace(metadata=metadata), request)


def _wrong_role(allowed: frozenset[CallerRole]) -> CallerRole | None:
    return next((r for r in CallerRole if r not in allowed), None)


def _bad_clients(
    pki: Pki, allowed: frozenset[CallerRole], mutual: bool
) -> dict[str, SecuritySettings]:
    cert = "nobody" if mutual else "none"
    out = {
        "no credentials": pki.client(cert=cert),
        "wrong token": pki.client(cert=cert, token="not-a-token-anyone-knows-0123456789"),
    }
    wrong = _wrong_role(allowed)
    if wrong is not None:
        out[f"token of role {wrong}"] = pki.client(wrong.value, cert=cert)
    if mutual:
        out["certificate of an unknown CA"] = pki.client(cert="rogue")
    return out


def _good_clients(
    pki: Pki, allowed: frozenset[CallerRole], mutual: bool
) -> dict[str, SecuritySettings]:
    cert = "nobody" if mutual else "none"
    role = sorted(allowed)[0]
    out = {f"token of role {role}": pki.client(role.value, cert=cert)}
    if mutual and CallerRole.SERVICE in allowed:
        out["service certificate"] = pki.client(cert="service")
    return out


async def _snapshot(stub: Any, job_id: str) -> tuple[Any, ...]:
    jobs = await stub.ListJobs(cpb.ListJobsRequest(), timeout=5)
    info = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
    stats = await stub.GetCheckpointStats(cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5)
    tasks = await stub.ListTasks(cpb.ListTasksRequest(job_id=job_id), timeout=5)
    return (
        sorted(j.job_id for j in jobs.jobs),
        info.state,
        stats.counts.SerializeToString(),
        len(tasks.tasks),
    )


@pytest.mark.parametrize("mutual", [True, False], ids=["mutual-tls", "tls-and-tokens"])
def test_every_rpc_refuses_the_wrong_caller_and_admits_the_right_one(
    redis_url: str, tmp_path: Path, mutual: bool
) -> None:
    pki = make_pki(tmp_path / "pki")
    server = pki.server(mutual=mutual)
    root = tmp_path / "cp"
    operator = pki.client("operator", cert="nobody" if mutual else "none")
    overrides = {f.name: getattr(server, f.name) for f in dataclasses.fields(server)}

    async def main() -> None:
        async with running_coordinator(
            redis_url, str(root), client=operator, savepoint_roots=str(tmp_path / "sp"), **overrides
        ) as c:
            response = await c.stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=two_vertex_graph(), checkpoint_config=pb.CheckpointConfig()
                ),
                timeout=10,
            )
            job_id = response.job.job_id
            agent = Agent(c.address, job_id, security=server)
            await agent.start()
            try:
                addresses = {
                    "snapflow.v1.CoordinatorService": c.address,
                    "snapflow.v1.WorkerControlService": agent.address,
                    "snapflow.v1.DataExchangeService": agent.address,
                }
                before = await _snapshot(c.stub, job_id)
                for method in METHODS:
                    address = addresses[method.containing_service.full_name]
                    allowed = RPC_ROLES[_path(method)]
                    request = _request(method, job_id, root)
                    for label, client in _bad_clients(pki, allowed, mutual).items():
                        code = await _call(address, client, method, request)
                        assert code in REFUSED, f"{_path(method)} with {label}: {code}"
                    # Plain text to the TLS port, even with a valid token.
                    token = pki.tokens[sorted(allowed)[0].value]
                    code = await _call(address, _Plaintext(token), method, request)
                    assert code in REFUSED, f"{_path(method)} in plain text: {code}"
                assert await _snapshot(c.stub, job_id) == before
                assert agent.epoch == 0  # no control call reached the agent
                assert not (root / "savepoints").exists()

                # The right credentials get past the check (the handlers may still refuse
                # these requests on their merits: a job without tasks, an unknown channel).
                for method in METHODS:
                    address = addresses[method.containing_service.full_name]
                    allowed = RPC_ROLES[_path(method)]
                    request = _request(method, job_id, root)
                    for label, client in _good_clients(pki, allowed, mutual).items():
                        code = await _call(address, client, method, request)
                        assert code not in REFUSED, f"{_path(method)} with {label}: {code}"
                # Served (no code above is a refusal), but an agent adopts a newer epoch only
                # from a message naming tasks it runs, and this agent runs none.
                assert agent.epoch == 0
            finally:
                await agent.stop()

    asyncio.run(main())


def test_paths_outside_the_allowed_roots_are_refused_before_any_io(
    redis_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "cp"
    allowed = tmp_path / "sp"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (allowed).mkdir()
    (allowed / "escape").symlink_to(outside)

    async def main() -> None:
        async with running_coordinator(redis_url, str(root), savepoint_roots=str(allowed)) as c:
            job_id = (
                await c.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        graph=two_vertex_graph(), checkpoint_config=pb.CheckpointConfig()
                    ),
                    timeout=10,
                )
            ).job.job_id
            bad = [
                str(outside / "sp"),
                str(allowed / ".." / "elsewhere" / "sp"),
                str(allowed / "escape" / "sp"),
                f"file://{outside}/sp",
                "s3://some-bucket/savepoints",
            ]
            calls: list[tuple[str, Callable[[str], Any]]] = [
                (
                    "savepoint",
                    lambda p: c.stub.TriggerSavepoint(
                        cpb.TriggerSavepointRequest(job_id=job_id, target_directory=p), timeout=5
                    ),
                ),
                (
                    "stop",
                    lambda p: c.stub.StopWithSavepoint(
                        cpb.StopWithSavepointRequest(job_id=job_id, target_directory=p), timeout=5
                    ),
                ),
                (
                    "dispose",
                    lambda p: c.stub.DisposeSavepoint(
                        cpb.DisposeSavepointRequest(savepoint_path=p), timeout=5
                    ),
                ),
                (
                    "restore",
                    lambda p: c.stub.SubmitJob(
                        cpb.SubmitJobRequest(
                            graph=two_vertex_graph(),
                            restore=cpb.RestoreSettings(savepoint_path=p),
                        ),
                        timeout=5,
                    ),
                ),
                (
                    "storage",
                    lambda p: c.stub.SubmitJob(
                        cpb.SubmitJobRequest(
                            graph=two_vertex_graph(),
                            checkpoint_config=pb.CheckpointConfig(storage_uri=p),
                        ),
                        timeout=5,
                    ),
                ),
            ]
            for name, call in calls:
                for path in bad:
                    if name == "storage" and path.startswith("file://"):
                        continue
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await call(path)
                    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, path)
                    assert "allowed roots" in (e.value.details() or "")
            # Inside a root the request passes the check (and fails on its merits).
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.stub.DisposeSavepoint(
                    cpb.DisposeSavepointRequest(savepoint_path=str(allowed / "none")), timeout=5
                )
            assert e.value.code() != grpc.StatusCode.PERMISSION_DENIED
            jobs = await c.stub.ListJobs(cpb.ListJobsRequest(), timeout=5)
            assert len(jobs.jobs) == 1
            assert list(outside.iterdir()) == []

    asyncio.run(main())
