"""The CLI's connection to the coordinator: its address, TLS and token, the channel (to the
leader of highly available coordinators) and the per-call deadline."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

from snapflow.leader_channel import sync_leader_channel
from snapflow.security import SECURITY_FIELDS, SecuritySettings
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

ADDRESS_ENV = "SNAPFLOW_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0
# The CLI trusts its coordinator: accept responses up to gRPC's own limit.
MAX_RECEIVE_BYTES = 2**31 - 1


class Client:
    """A coordinator stub plus the per-call deadline."""

    def __init__(self, stub: cgrpc.CoordinatorServiceStub, timeout_s: float) -> None:
        self.stub = stub
        self.timeout = timeout_s


CLIENT_SECURITY_FLAGS = (
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_server_name",
    "token_file",
)


def security_settings(args: argparse.Namespace) -> SecuritySettings:
    """TLS and token of a client or worker: ``SNAPFLOW_TLS_*``/``SNAPFLOW_TOKEN_FILE`` (or
    ``SNAPFLOW_TOKEN``), overridden by the file flags; a token itself is never a flag."""
    base = SecuritySettings.from_env()
    flags = {
        name: value for name in SECURITY_FIELDS if (value := getattr(args, name, None)) is not None
    }
    return base.replace(**flags) if flags else base


def coordinator_address(args: argparse.Namespace) -> str:
    return str(args.address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS)


@contextlib.contextmanager
def connect(args: argparse.Namespace) -> Iterator[Client]:
    channel = sync_leader_channel(  # host:port, or several: the leader is found
        coordinator_address(args),
        security_settings(args),
        options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.enable_retries", 0),
        ],
    )
    try:
        yield Client(cgrpc.CoordinatorServiceStub(channel), args.timeout)
    finally:
        channel.close()


def absolute_target(value: str | None) -> str:
    """A target directory made absolute against the current directory (URIs are kept)."""
    if not value:
        return ""
    if "://" in value:
        return value
    return os.path.abspath(os.path.expanduser(value))
