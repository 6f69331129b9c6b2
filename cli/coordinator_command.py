"""``snapflow coordinator``: the coordinator service in the foreground, until SIGINT/SIGTERM.
The service's modules are imported when the command runs, not when the parser is built."""

from __future__ import annotations

import argparse
import sys

from snapflow.security import SECURITY_FIELDS

# flag destination -> CoordinatorSettings field
COORDINATOR_FLAGS = (
    "host",
    "port",
    "redis_url",
    "redis_namespace",
    "storage_root",
    "metrics_port",
    "log_level",
    "log_format",
    *SECURITY_FIELDS,
    "savepoint_roots",
    "redis_password_file",
    "metrics_host",
    "high_availability",
    "lease_ttl_s",
    "lease_renew_interval_s",
    "advertised_address",
)


def cmd_coordinator(args: argparse.Namespace) -> int:
    import asyncio

    from snapflow.coordinator.config import load_settings
    from snapflow.coordinator.server import serve
    from snapflow.errors import ConfigError, SnapflowError
    from snapflow.logging import configure_logging, get_logger, route_native_stderr

    overrides = {name: getattr(args, name) for name in COORDINATOR_FLAGS}
    try:
        settings = load_settings(args.config, overrides)
    except ConfigError as e:
        print(f"snapflow coordinator: configuration error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    json_log = route_native_stderr()  # gRPC's C core and crashes as JSON events too
    log = get_logger("snapflow.cli")
    log.info("coordinator.settings", **settings.to_dict())
    try:
        asyncio.run(serve(settings))
    except ConfigError as e:
        print(f"snapflow coordinator: configuration error: {e}", file=sys.stderr)
        return 2
    except (SnapflowError, OSError) as e:
        log.error("coordinator.failed", error=f"{type(e).__name__}: {e}")
        if not json_log:  # a JSON log has it in the event, and only events
            print(f"snapflow coordinator: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0
