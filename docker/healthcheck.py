"""Container health check of the coordinator: the standard gRPC health protocol.

    python docker/healthcheck.py [HOST:PORT] [SERVICE]

Exits 0 when the server answers SERVING for SERVICE (default: the whole server, ""), 1
otherwise (not serving, unreachable, timeout). HOST:PORT defaults to ``127.0.0.1:50051``.
Used by docker-compose.yml; the image copies it to /opt/snapflow/healthcheck.py.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapflow.errors import ConfigError
from snapflow.security import SecuritySettings
from snapflow.tls import sync_channel

DEFAULT_ADDRESS = "127.0.0.1:50051"
TIMEOUT_S = 3.0


def check(address: str, service: str = "", timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    try:
        # TLS as the coordinator's SNAPFLOW_TLS_* settings say (health needs no token).
        with sync_channel(address, SecuritySettings.from_env()) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
    except grpc.RpcError as e:
        return False, f"{address}: {e.code().name} {e.details()}"
    except ConfigError as e:
        return False, f"{address}: {e}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else DEFAULT_ADDRESS
    service = argv[2] if len(argv) > 2 else ""
    ok, detail = check(address, service)
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
