"""The driver's synchronous client of the coordinator, and the credentials it hands its agents.

gRPC errors become :mod:`snapflow.errors` types here, so the driver loop and its users catch
Snapflow errors, never ``grpc.RpcError``.
"""

from __future__ import annotations

from typing import Any

import grpc

from snapflow.errors import (
    AlreadyExistsError,
    CheckpointFailedError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SnapflowError,
    UnavailableError,
)
from snapflow.leader_channel import sync_leader_channel
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

RPC_TIMEOUT_S = 10.0


_STATUS_ERRORS: dict[grpc.StatusCode, type[SnapflowError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
}


def _rpc_error(error: grpc.RpcError, what: str) -> SnapflowError:
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    if code is grpc.StatusCode.ABORTED:
        return CheckpointFailedError("ABORTED", f"{what}: {details}")
    cls = _STATUS_ERRORS.get(code, SnapflowError) if code is not None else SnapflowError
    return cls(f"{what}: {details} ({code.name if code else 'no status'})")


def agent_security(driver: SecuritySettings) -> SecuritySettings:
    """The settings the driver hands to its executors' agents. With a client certificate
    (mutual TLS) the agents authenticate by it, as the service identity, and do not get the
    driver's token file: a bearer token decides over a certificate (docs/security.md), and the
    submitter's token (operator) lacks the service role; its file need not exist on the
    executors either. Without a certificate the token is the agents' only credential."""
    if driver.tls_cert_file:
        return driver.replace(token_file="")
    return driver


class CoordinatorClient:
    """A synchronous client of the coordinator (the driver's side): thread-safe."""

    def __init__(self, address: str, security: SecuritySettings = PLAINTEXT) -> None:
        self.address = address
        self.security = security
        self._closed = False
        self._channel = sync_leader_channel(address, security)  # host:port[,host:port...]
        self._stub = cgrpc.CoordinatorServiceStub(self._channel)

    def close(self) -> None:
        self._closed = True
        self._channel.close()

    def call(self, method: str, request: Any, timeout_s: float = RPC_TIMEOUT_S) -> Any:
        if self._closed:
            raise FailedPreconditionError(
                f"{method}: the job's driver loop ended and closed its coordinator connection"
            )
        try:
            return getattr(self._stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise _rpc_error(e, f"{method} on {self.address}") from None
        except ValueError as e:  # "Cannot invoke RPC on closed channel!": closed meanwhile
            raise FailedPreconditionError(f"{method} on {self.address}: {e}") from None

    def job(self, job_id: str) -> cpb.JobInfo:
        return self.call("GetJob", cpb.GetJobRequest(job_id=job_id))

    def stats(self, job_id: str) -> cpb.CheckpointStats:
        return self.call("GetCheckpointStats", cpb.GetCheckpointStatsRequest(job_id=job_id))
