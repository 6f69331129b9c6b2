"""The ``snapflow`` command line (README.md, "The CLI against a running coordinator"): parse
the arguments (``snapflow.cli.parser``) and run the command's handler.

``snapflow coordinator`` runs the coordinator service (``coordinator_command``); the client
commands call its gRPC API (``client_commands``); ``snapflow run PIPELINE.py`` runs a pipeline
file on Spark (``run_command``); ``snapflow worker`` runs a worker agent (``worker_command``);
``snapflow demo`` runs the demo (``snapflow.cli.demo``).

Exit codes: 0 success; 1 the server refused or failed the call (``error: CODE: details`` on
stderr), or the coordinator failed to start; 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

import grpc

from snapflow.cli.client import coordinator_address
from snapflow.cli.parser import build_parser
from snapflow.errors import ConfigError

Handler = Callable[[argparse.Namespace], int]


def _report_rpc_error(error: grpc.RpcError, args: argparse.Namespace) -> None:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    print(f"error: {name}: {details or str(error)}", file=sys.stderr)
    if code is grpc.StatusCode.UNAVAILABLE:
        print(f"hint: is the coordinator running at {coordinator_address(args)}?", file=sys.stderr)
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
        print(
            f"hint: no answer within --timeout {args.timeout:g} s; a triggered checkpoint may "
            "still complete",
            file=sys.stderr,
        )
    elif code is grpc.StatusCode.UNAUTHENTICATED:
        print(
            "hint: set SNAPFLOW_TOKEN_FILE (or --token-file) to a file with a valid token, and "
            "SNAPFLOW_TLS_CA_FILE to the coordinator's CA",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs connection-level INFO lines (GOAWAY on shutdown, ...) to stderr; our
    # own logs say what matters. Read by the core when it initialises, after this point.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except grpc.RpcError as error:
        _report_rpc_error(error, args)
        return 1
    except ConfigError as error:  # TLS or token files (messages name files, never contents)
        print(f"snapflow {args.command}: configuration error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `snapflow jobs | head -1`: stop quietly
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 1
