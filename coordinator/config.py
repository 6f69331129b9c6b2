"""The coordinator's settings: one typed, validated object.

Sources, in increasing precedence:

1. the defaults below;
2. a TOML file (``--config`` or ``SNAPFLOW_CONFIG``) with the settings as top-level keys, e.g.
   ``port = 50051`` and ``storage_root = "/mnt/checkpoints"``; an unknown key is an error;
3. environment variables ``SNAPFLOW_<FIELD_UPPER>`` (``SNAPFLOW_PORT=50052``); only the known
   names are read;
4. explicit overrides (the CLI flags); ``None`` means "flag not given".

Strings are converted to the field's type (int, float, str). Every problem raises
:class:`snapflow.errors.ConfigError` naming the setting, where the value came from and what is
allowed; the coordinator fails at start instead of running with a bad value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from snapflow.errors import ConfigError
from snapflow.redis_client import parse_redis_url
from snapflow.s3_filestore import S3Settings
from snapflow.security import SECURITY_FIELDS, SecuritySettings
from snapflow.storage_location import check_storage_location

ENV_PREFIX = "SNAPFLOW_"
CONFIG_FILE_ENV = "SNAPFLOW_CONFIG"

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("auto", "json", "console")
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
HA_MODES = ("none", "redis")
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


@dataclass(frozen=True)
class CoordinatorSettings:
    """Everything the coordinator service needs to start."""

    host: str = "127.0.0.1"
    """Address the gRPC server binds to (``0.0.0.0`` or ``::`` for all interfaces)."""

    port: int = 50051
    """gRPC port; 0 picks a free port (the bound port is logged and returned)."""

    redis_url: str = ""
    """Redis holding the checkpoint metadata (``redis://``, ``rediss://`` or ``unix://``);
    empty starts an embedded ``redis-server`` found in the Python environment."""

    redis_namespace: str = "snapflow"
    """Prefix of every Redis key, so several deployments can share one Redis."""

    high_availability: str = "none"
    """``none``: the only coordinator of its Redis namespace (it takes the fencing epoch at
    start); ``redis``: several coordinators share the namespace, the leader holds a lease in
    Redis and the others are standbys that take over when it lapses (docs/coordinator.md,
    "High availability")."""

    lease_ttl_s: float = 5.0
    """With ``high_availability = "redis"``: how long the leader lease lives in Redis after
    the last renewal, in seconds; a standby takes over at most this long (plus one renew
    interval) after the leader died. At least 3 times ``lease_renew_interval_s``."""

    lease_renew_interval_s: float = 1.0
    """How often the leader renews its lease and standbys try to acquire it, in seconds; the
    leader steps down (stops acting) when it could not renew for ``lease_ttl_s`` less this."""

    advertised_address: str = ""
    """``host:port`` at which clients reach this coordinator: standbys name it as the
    leader's address. Empty: ``host`` and the bound port (the host name for a wildcard
    ``host``)."""

    storage_root: str = "./data/checkpoints"
    """Checkpoint storage root: a local or shared file-system path, a ``file://`` URI, or an
    S3 prefix ``s3://bucket/prefix`` (reached with the ``s3_*`` settings)."""

    s3_endpoint_url: str = ""
    """An S3-compatible endpoint (MinIO, a test server) for ``s3://`` storage; empty: the AWS
    conventions (``AWS_ENDPOINT_URL``, else AWS itself)."""

    s3_region: str = ""
    """The region of the S3 buckets; empty: ``AWS_REGION``/``AWS_DEFAULT_REGION`` or the
    shared AWS config."""

    s3_profile: str = ""
    """A named profile of the shared AWS config files; empty: ``AWS_PROFILE`` or the default
    credential chain (environment, config files, instance profile)."""

    s3_max_attempts: int = 5
    """Attempts per S3 request (botocore's ``standard`` retry mode: throttling, 5xx and
    network errors are retried with exponential back-off); at least 1."""

    metrics_port: int = 9464
    """Prometheus ``/metrics`` HTTP port (bound on ``host``); 0 picks a free port, -1
    disables the endpoint."""

    max_message_bytes: int = 16 * 1024 * 1024
    """Largest gRPC message sent or received, in bytes."""

    worker_rpc_timeout_s: float = 5.0
    """Deadline of each coordinator-to-worker call (trigger, notify, abort), in seconds."""

    default_rpc_deadline_s: float = 30.0
    """The longest a client's trigger-checkpoint or savepoint call waits for the outcome."""

    heartbeat_interval_s: float = 2.0
    """How often each worker agent sends a heartbeat (the coordinator tells the agents), in
    seconds (Flink's ``heartbeat.interval``, 10 s, scaled down for local jobs)."""

    heartbeat_timeout_s: float = 10.0
    """An agent silent this long fails its deployment (``heartbeat timeout of agent ...``); an
    agent whose heartbeats fail this long re-registers its tasks. Seconds, greater than
    ``heartbeat_interval_s`` (Flink's ``heartbeat.timeout``, 50 s, scaled down)."""

    max_jobs: int = 1000
    """Most jobs (in any state) the coordinator keeps; submissions beyond are refused."""

    max_queued_trigger_requests: int = 16
    """Trigger requests queued per job while another checkpoint is pending; more are refused."""

    history_size: int = 10
    """Checkpoints remembered per job in the stats history (Flink's default is 10)."""

    orphan_sweep_interval_s: float = 60.0
    """How often each job's storage is swept for what ended checkpoints left behind (a clean-up
    that failed, a late writer), in seconds; 0: only at start and after a failed clean-up. On
    S3 each run LISTs the job's prefix once."""

    orphan_sweep_max_deletes: int = 100
    """Most checkpoint directories one sweep run deletes (the rest waits for the next run)."""

    log_level: str = "info"
    """One of debug, info, warning, error, critical."""

    log_format: str = "auto"
    """``json``, ``console``, or ``auto``: console on a terminal, JSON otherwise."""

    shutdown_grace_s: float = 5.0
    """On shutdown, how long in-flight calls may finish before they are cancelled."""

    # --- security (docs/security.md); every one empty: plaintext and open, as before ---

    tls_cert_file: str = ""
    """PEM certificate chain of the gRPC server (and of the coordinator's calls to agents);
    with ``tls_key_file`` the server speaks TLS only. Re-read when it changes."""

    tls_key_file: str = ""
    """PEM private key of ``tls_cert_file``."""

    tls_ca_file: str = ""
    """PEM CA bundle the coordinator verifies the agents' server certificates with."""

    tls_client_ca_file: str = ""
    """PEM CA bundle client certificates are verified with; set: mutual TLS, every client
    must present a certificate signed by it."""

    tls_server_name: str = ""
    """Name the agents' certificates are checked against instead of their address's host."""

    token_file: str = ""
    """File with the bearer token the coordinator sends to agents (else ``SNAPFLOW_TOKEN``)."""

    auth_tokens_file: str = ""
    """Accepted bearer tokens, one ``ROLE[,ROLE] TOKEN`` per line; set: every RPC but health
    and reflection needs a role (docs/security.md has the matrix)."""

    auth_identities: str = ""
    """Roles of verified client certificates: ``NAME=ROLE[+ROLE],...`` (NAME: subject CN or
    SAN; ``*``: any verified certificate)."""

    savepoint_roots: str = ""
    """Comma-separated directories (local paths or ``s3://`` prefixes) where savepoint
    targets, restore paths and disposals may lie, besides ``storage_root``; set: any other
    path is PERMISSION_DENIED before any I/O. Empty: no confinement."""

    redis_password_file: str = ""
    """File with the Redis password (ACL user: in ``redis_url``, ``redis://user@host``); it
    overrides a password in the URL and is never logged."""

    metrics_host: str = ""
    """Address the ``/metrics`` endpoint binds to; empty: ``host``. With TLS on, the
    endpoint serves HTTPS with the same certificate, and a token when tokens are on."""

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in values.items():
            _check_type(name, value, "argument")
        normalized = _validate(values, dict.fromkeys(values, "argument"))
        for name, value in normalized.items():
            if value != values[name]:
                object.__setattr__(self, name, value)

    def s3_settings(self) -> S3Settings:
        """How the coordinator reaches S3 (empty settings fall back to the AWS conventions)."""
        return S3Settings(
            endpoint_url=self.s3_endpoint_url or None,
            region=self.s3_region or None,
            profile=self.s3_profile or None,
            max_attempts=self.s3_max_attempts,
        )

    def security(self) -> SecuritySettings:
        """TLS and access-control settings of the coordinator's servers and clients."""
        return SecuritySettings(**{name: getattr(self, name) for name in SECURITY_FIELDS})

    def allowed_roots(self) -> tuple[str, ...]:
        """Where savepoints, restores and disposals may point (empty: anywhere)."""
        roots = [r.strip() for r in self.savepoint_roots.split(",") if r.strip()]
        return (self.storage_root, *roots) if roots else ()

    def to_dict(self, *, redact_secrets: bool = True) -> dict[str, Any]:
        """The settings as a plain dict (for logging at start); a password in ``redis_url``
        is replaced by ``***`` unless ``redact_secrets`` is False."""
        d = dataclasses.asdict(self)
        if redact_secrets:
            d["redis_url"] = redact_url(self.redis_url)
        return d


FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "float": float, "str": str}[str(f.type)]
    for f in dataclasses.fields(CoordinatorSettings)
}


def env_var_name(field_name: str) -> str:
    return f"{ENV_PREFIX}{field_name.upper()}"


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host``."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}"
        if parts.port is not None:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparseable url>"


def load_settings(
    config_file: str | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> CoordinatorSettings:
    """Build the settings from defaults < TOML file < ``SNAPFLOW_*`` environment < overrides.

    ``config_file`` defaults to ``$SNAPFLOW_CONFIG``; ``environ`` to ``os.environ``;
    ``overrides`` maps field names to values (``None`` values are ignored).
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(CoordinatorSettings)}
    sources: dict[str, str] = dict.fromkeys(values, "default")

    path = config_file if config_file else env.get(CONFIG_FILE_ENV, "")
    if path:
        origin = "--config" if config_file else CONFIG_FILE_ENV
        for name, raw in _read_toml(path, origin).items():
            source = f"config file {path}"
            values[name] = _convert(name, raw, source)
            sources[name] = source

    for name in values:
        var = env_var_name(name)
        if var in env:
            source = f"environment variable {var}"
            values[name] = _convert(name, env[var], source)
            sources[name] = source

    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        if name not in FIELD_TYPES:
            raise ConfigError(
                f"unknown setting {name!r} (from flags); known settings: {', '.join(FIELD_TYPES)}"
            )
        source = f"flag {flag_name(name)}"
        values[name] = _convert(name, raw, source)
        sources[name] = source

    values = _validate(values, sources)
    return CoordinatorSettings(**values)


def _read_toml(path: str, origin: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} (from {origin}) does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} (from {origin}) is a directory") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path} (from {origin}): {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text: {e}") from None
    unknown = sorted(k for k in data if k not in FIELD_TYPES)
    if unknown:
        hints = []
        for key in unknown:
            close = _closest(key)
            hints.append(f"{key!r}" + (f" (did you mean {close!r}?)" if close else ""))
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(hints)}; known settings: "
            f"{', '.join(FIELD_TYPES)}"
        )
    return data


def _closest(key: str) -> str | None:
    import difflib

    matches = difflib.get_close_matches(key.lower().replace("-", "_"), list(FIELD_TYPES), n=1)
    return matches[0] if matches else None


def _type_word(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string"}[t]


def _convert(name: str, raw: object, source: str) -> Any:
    """Convert ``raw`` (a string from env/flags, or a TOML/Python value) to the field's type."""
    want = FIELD_TYPES[name]
    fail = ConfigError(f"invalid setting {name!r} from {source}: {raw!r} is not {_type_word(want)}")
    if isinstance(raw, bool):
        raise fail
    if want is str:
        if isinstance(raw, str):
            return raw
        raise fail
    if want is int:
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.strip())
            except ValueError:
                raise fail from None
        raise fail
    # float
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise fail from None
    else:
        raise fail
    if not math.isfinite(value):
        raise ConfigError(f"invalid setting {name!r} from {source}: {raw!r} is not a finite number")
    return value


def _check_type(name: str, value: object, source: str) -> None:
    want = FIELD_TYPES[name]
    ok = not isinstance(value, bool) and isinstance(
        value, want if want is not float else (int, float)
    )
    if not ok:
        raise ConfigError(
            f"invalid setting {name!r} from {source}: {value!r} is not {_type_word(want)}"
        )


_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]+$")


def _validate(values: dict[str, Any], sources: Mapping[str, str]) -> dict[str, Any]:
    """Check every value; returns the normalised values (e.g. lower-cased log level)."""
    out = dict(values)
    for name, t in FIELD_TYPES.items():
        if t is float:
            out[name] = float(out[name])

    def bad(name: str, problem: str, allowed: str) -> ConfigError:
        return ConfigError(
            f"invalid setting {name!r} from {sources[name]}: {problem}; allowed: {allowed}"
        )

    def int_range(name: str, lo: int, hi: int | None, allowed: str) -> None:
        v = out[name]
        if v < lo or (hi is not None and v > hi):
            raise bad(name, f"{v} is out of range", allowed)

    def positive(name: str, allowed: str = "a number greater than 0") -> None:
        if not out[name] > 0:
            raise bad(name, f"{out[name]} is not greater than 0", allowed)

    host = out["host"].strip()
    if not host or any(c.isspace() for c in host):
        raise bad(
            "host", f"{out['host']!r} is not a host name or address", "e.g. 127.0.0.1, 0.0.0.0, ::"
        )
    out["host"] = host

    int_range("port", 0, 65535, "0..65535 (0 picks a free port)")
    int_range("metrics_port", -1, 65535, "0..65535 (0 picks a free port), or -1 to disable")

    url = out["redis_url"].strip()
    if url:
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in REDIS_SCHEMES:
            raise bad(
                "redis_url",
                f"{url!r} is not a Redis URL",
                "redis://host:port/db, rediss://..., unix:///path.sock, "
                "redis+sentinel://host:port,host:port/service_name, or empty to start an "
                "embedded redis-server",
            )
        try:
            parse_redis_url(url)
        except ConfigError as e:
            raise bad("redis_url", str(e), "a valid Redis URL") from None
    out["redis_url"] = url

    mode = out["high_availability"].strip().lower()
    if mode not in HA_MODES:
        raise bad("high_availability", f"{out['high_availability']!r} is not a mode", "none, redis")
    out["high_availability"] = mode
    positive("lease_renew_interval_s", "seconds greater than 0")
    if out["lease_ttl_s"] < 3 * out["lease_renew_interval_s"]:
        raise bad(
            "lease_ttl_s",
            f"{out['lease_ttl_s']} is less than 3 times lease_renew_interval_s "
            f"({out['lease_renew_interval_s']})",
            "seconds >= 3 x lease_renew_interval_s (the leader steps down one interval before "
            "the lease can lapse, and retries at least once before that)",
        )
    advertised = out["advertised_address"].strip()
    if advertised:
        host_part, _, port_part = advertised.rpartition(":")
        if not host_part or not port_part.isdigit() or not 0 < int(port_part) <= 65535:
            raise bad(
                "advertised_address", f"{advertised!r:.200} is not host:port", "e.g. node1:50051"
            )
    out["advertised_address"] = advertised

    if not _NAMESPACE_RE.match(out["redis_namespace"]):
        raise bad(
            "redis_namespace",
            f"{out['redis_namespace']!r} is empty or has characters other than letters, "
            "digits and _ . : -",
            "a non-empty key prefix such as 'snapflow'",
        )

    storage_allowed = "a directory path, a file:// URI or s3://bucket/prefix"
    root = out["storage_root"].strip()
    if not root:
        raise bad("storage_root", "it is empty", storage_allowed)
    try:
        check_storage_location(root, what="storage_root")
    except ConfigError as e:
        raise bad("storage_root", str(e), storage_allowed) from None
    out["storage_root"] = root

    endpoint = out["s3_endpoint_url"].strip()
    if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
        raise bad(
            "s3_endpoint_url",
            f"{endpoint!r:.200} is not an http(s) URL",
            "e.g. https://s3.eu-west-1.amazonaws.com or http://127.0.0.1:9000, or empty",
        )
    out["s3_endpoint_url"] = endpoint
    out["s3_region"] = out["s3_region"].strip()
    out["s3_profile"] = out["s3_profile"].strip()
    int_range("s3_max_attempts", 1, 20, "1..20")

    size = out["max_message_bytes"]
    if not 1024 <= size <= MAX_GRPC_MESSAGE_BYTES:
        raise bad(
            "max_message_bytes",
            f"{size} is out of range",
            f"1024..{MAX_GRPC_MESSAGE_BYTES} bytes",
        )
    positive("worker_rpc_timeout_s", "seconds greater than 0")
    positive("default_rpc_deadline_s", "seconds greater than 0")
    positive("heartbeat_interval_s", "seconds greater than 0")
    if out["heartbeat_timeout_s"] <= out["heartbeat_interval_s"]:
        raise bad(
            "heartbeat_timeout_s",
            f"{out['heartbeat_timeout_s']} is not greater than heartbeat_interval_s "
            f"({out['heartbeat_interval_s']})",
            "seconds greater than heartbeat_interval_s (e.g. 5 times it)",
        )
    if out["shutdown_grace_s"] < 0:
        raise bad("shutdown_grace_s", f"{out['shutdown_grace_s']} is negative", "seconds >= 0")
    if out["orphan_sweep_interval_s"] < 0:
        raise bad(
            "orphan_sweep_interval_s",
            f"{out['orphan_sweep_interval_s']} is negative",
            "seconds >= 0 (0: only at start and after a failed clean-up)",
        )
    for name in (
        "max_jobs",
        "max_queued_trigger_requests",
        "history_size",
        "orphan_sweep_max_deletes",
    ):
        int_range(name, 1, None, "an integer >= 1")

    for name in (*SECURITY_FIELDS, "redis_password_file", "metrics_host", "savepoint_roots"):
        out[name] = out[name].strip()
    try:
        SecuritySettings(**{name: out[name] for name in SECURITY_FIELDS})
    except ConfigError as e:
        named = [n for n in SECURITY_FIELDS if out[n] and sources[n] != "default"]
        where = f" (set from {', '.join(sorted({sources[n] for n in named}))})" if named else ""
        raise ConfigError(f"invalid security settings{where}: {e}") from None
    if out["redis_password_file"] and urlsplit(out["redis_url"]).password:
        raise bad(
            "redis_password_file",
            "redis_url carries a password too (the URL's would win)",
            "the password in one place: drop it from redis_url",
        )
    for root in (r.strip() for r in out["savepoint_roots"].split(",")):
        if root:
            try:
                check_storage_location(root, what="savepoint_roots")
            except ConfigError as e:
                raise bad("savepoint_roots", str(e), storage_allowed) from None

    level = out["log_level"].strip().lower()
    if level == "warn":
        level = "warning"
    if level not in LOG_LEVELS:
        raise bad("log_level", f"{out['log_level']!r} is not a log level", ", ".join(LOG_LEVELS))
    out["log_level"] = level

    fmt = out["log_format"].strip().lower()
    if fmt not in LOG_FORMATS:
        raise bad(
            "log_format", f"{out['log_format']!r} is not a log format", ", ".join(LOG_FORMATS)
        )
    out["log_format"] = fmt
    return out
