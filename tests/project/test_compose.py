"""Static checks of docker-compose.yml, the Dockerfile and the container health check.

No Docker engine is needed. docker-compose.yml is read with PyYAML (which applies the YAML merge
keys the file uses, as Compose does) and validated by ``compose-spec``, a spec-compliant Compose
parser (unknown keys, bad durations, conditions or port syntax fail there); the real Compose
implementations found on PATH parse it too (``docker compose`` v2, ``docker-compose`` 1.29 as
Debian ships it: ``config -q``), and the top-level keys are checked against what 1.29 accepts
when it is not installed. The tests then check what matters across files: the services and their
dependencies, health checks, the image build (a slim Python base that exists, a JRE from Debian,
the pyspark pin against the installed pyspark, Spark's launcher from the pyspark wheel), the
commands against the real ``snapflow`` CLI parser and the coordinator's default settings, and
the volumes that must be shared. The health check script is run against a real in-process gRPC
health server.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
import pytest
import yaml
from compose_spec import PyCompose
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from snapflow.cli.demo_config import config_from_args
from snapflow.cli.parser import build_parser
from snapflow.coordinator.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
HEALTHCHECK_SCRIPT = ROOT / "docker" / "healthcheck.py"

EXPECTED_SERVICES = {
    "redis",
    "coordinator",
    "spark-master",
    "spark-worker-1",
    "spark-worker-2",
    "submitter",
}
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
# What the coordinator listens on when its command line names no port.
_DEFAULTS = load_settings(environ={})
DEFAULT_GRPC_PORT = _DEFAULTS.port
DEFAULT_METRICS_PORT = _DEFAULTS.metrics_port
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}


# --- helpers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} does not exist"
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())  # merge keys (<<: *anchor) applied
    assert isinstance(loaded, dict), "docker-compose.yml must be a mapping"
    try:
        # The Compose specification's own validation, on the merged document.
        data = PyCompose.from_json(json.dumps(loaded)).to_dict()
    except ValueError as e:
        raise AssertionError(f"docker-compose.yml is not a valid Compose file: {e}") from None
    assert isinstance(data.get("services"), dict), "docker-compose.yml has no 'services' mapping"
    for name, service in data["services"].items():
        assert isinstance(service, dict), f"service {name!r} is not a mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def _tokens(value: Any) -> list[str]:
    """A compose command/entrypoint (string or list) as argv tokens; list items that hold a
    whole shell command line (``sh -c "..."``) are split as well."""
    if value is None:
        return []
    items = shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
    out: list[str] = []
    for item in items:
        out.extend(shlex.split(item) if any(c.isspace() for c in item) else [item])
    return out


def _argv(service: dict[str, Any]) -> list[str]:
    return _tokens(service.get("entrypoint")) + _tokens(service.get("command"))


def _snapflow_invocations(tokens: list[str]) -> Iterator[list[str]]:
    """The argument lists (after the program name) of every ``snapflow`` invocation."""
    for i, token in enumerate(tokens):
        if PurePosixPath(token).name == "snapflow":
            args: list[str] = []
            for arg in tokens[i + 1 :]:
                if arg in SHELL_OPERATORS:
                    break
                args.append(arg)
            yield args


def _all_snapflow_invocations(services: dict[str, dict[str, Any]]) -> list[tuple[str, list[str]]]:
    return [
        (name, args)
        for name, service in services.items()
        for args in _snapflow_invocations(_argv(service))
    ]


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _build_context(service: dict[str, Any]) -> tuple[Path, Path] | None:
    """(context directory, Dockerfile path) of a service with a build section."""
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        context, dockerfile = build, "Dockerfile"
    else:
        assert isinstance(build, dict), f"build must be a string or a mapping, got {build!r}"
        context, dockerfile = build.get("context", "."), build.get("dockerfile", "Dockerfile")
    context_dir = (COMPOSE_FILE.parent / context).resolve()
    return context_dir, context_dir / dockerfile


def _dockerfile() -> Path:
    return ROOT / "Dockerfile"


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            keyword, _, rest = current.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
        current = ""
    if current.strip():
        keyword, _, rest = current.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _base_image(path: Path) -> str:
    """The image of the first FROM, with ``${ARG}`` defaults declared before it substituted."""
    args: dict[str, str] = {}
    for keyword, rest in _dockerfile_instructions(path):
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            assert words, f"{path}: FROM without an image"
            return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
    raise AssertionError(f"{path} has no FROM instruction")


def _release(version: str) -> str:
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", version)
    assert match, f"{version!r} does not start with major.minor.patch"
    return ".".join(match.groups())


def _parse_port_number(text: str, where: str) -> list[int]:
    """A port or a range ``a-b`` -> its port numbers (each 1..65535)."""
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    assert match, f"{where}: {text!r} is not a port or a port range"
    low = int(match.group(1))
    high = int(match.group(2) or low)
    assert 1 <= low <= high <= 65535, f"{where}: {text!r} is out of range 1..65535"
    return list(range(low, high + 1))


def _parse_port(entry: Any, where: str) -> tuple[list[int], list[int]]:
    """A compose port entry -> (published host ports, container ports)."""
    if isinstance(entry, dict):
        assert "target" in entry, f"{where}: long-syntax port without 'target': {entry!r}"
        container = _parse_port_number(str(entry["target"]), where)
        published = entry.get("published")
        host = _parse_port_number(str(published), where) if published is not None else []
        protocol = entry.get("protocol", "tcp")
        assert protocol in ("tcp", "udp"), f"{where}: protocol {protocol!r} is not tcp or udp"
    else:
        assert isinstance(entry, str), (
            f"{where}: write ports as quoted strings ('8080:8080'); YAML reads some unquoted "
            f"values as base-60 numbers; got {entry!r}"
        )
        spec, _, protocol = entry.partition("/")
        assert protocol in ("", "tcp", "udp"), f"{where}: protocol {protocol!r} is not tcp or udp"
        ip = ""
        if spec.startswith("["):  # [::1]:8080:8080
            ip, _, spec = spec[1:].partition("]:")
        parts = spec.split(":")
        assert 1 <= len(parts) <= 3, f"{where}: {entry!r} is not [IP:][HOST:]CONTAINER"
        if len(parts) == 3:
            ip, parts = parts[0], parts[1:]
        if ip:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise AssertionError(f"{where}: {ip!r} in {entry!r} is not an IP address") from None
        container = _parse_port_number(parts[-1], where)
        host = _parse_port_number(parts[0], where) if len(parts) == 2 and parts[0] else []
    assert not host or len(host) == len(container), (
        f"{where}: host and container port ranges differ in size: {entry!r}"
    )
    return host, container


def _volume_mounts(service: dict[str, Any], where: str) -> list[tuple[str | None, str]]:
    """(named volume or None for bind/anonymous mounts, container path) of every mount."""
    mounts: list[tuple[str | None, str]] = []
    for entry in service.get("volumes", []) or []:
        if isinstance(entry, dict):
            kind = entry.get("type", "volume")
            assert "target" in entry, f"{where}: long-syntax volume without 'target': {entry!r}"
            source = entry.get("source") if kind == "volume" else None
            mounts.append((source or None, entry["target"]))
            continue
        assert isinstance(entry, str), f"{where}: volume entry {entry!r} is not a string"
        parts = entry.split(":")
        assert 1 <= len(parts) <= 3, f"{where}: {entry!r} is not SOURCE:TARGET[:MODE]"
        if len(parts) == 1:
            mounts.append((None, parts[0]))
            continue
        source, target = parts[0], parts[1]
        assert target.startswith("/"), f"{where}: mount target {target!r} must be absolute"
        is_path = source.startswith((".", "/", "~")) or "/" in source
        mounts.append((None if is_path else source, target))
    return mounts


# --- services, images, build -------------------------------------------------------------------


def test_expected_services_exist(services: dict[str, dict[str, Any]]) -> None:
    missing = sorted(EXPECTED_SERVICES - set(services))
    assert not missing, f"docker-compose.yml lacks the services {missing}"


def test_every_service_has_an_image_or_a_buildable_context(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        build = _build_context(service)
        if build is None:
            image = service.get("image")
            assert isinstance(image, str) and image.strip(), (
                f"service {name!r} has neither an image nor a build section"
            )
            continue
        context, dockerfile = build
        assert context.is_dir(), f"service {name!r}: build context {context} does not exist"
        assert dockerfile.is_file(), f"service {name!r}: {dockerfile} does not exist"


def test_snapflow_services_build_the_project_image(services: dict[str, dict[str, Any]]) -> None:
    for name in EXPECTED_SERVICES - {"redis"}:
        build = _build_context(services[name])
        assert build is not None, f"service {name!r} must build the project's Dockerfile"
        assert build[1] == _dockerfile(), (
            f"service {name!r} builds {build[1]}, not the project's {_dockerfile()}"
        )


# The official Python image of a release the project supports, on Debian bookworm (whose
# archive has the JRE below); a tag that certainly exists, unlike guessed Spark image tags.
BASE_IMAGE = re.compile(r"^(docker\.io/(library/)?)?python:3\.(\d+)(\.\d+)?-slim-bookworm$")
JRE_PACKAGE = re.compile(r"\bopenjdk-(\d+)-jre-headless\b")


def test_dockerfile_is_a_slim_python_base_with_a_debian_jre() -> None:
    image = _base_image(_dockerfile())
    match = BASE_IMAGE.match(image)
    assert match, f"FROM {image!r}: use the official python:3.X-slim-bookworm image"
    requires = re.search(r">=\s*3\.(\d+)", _pyproject()["project"]["requires-python"])
    assert requires and int(match.group(3)) >= int(requires.group(1)), (
        f"FROM {image!r} is older than requires-python"
    )
    runs = [rest for keyword, rest in _dockerfile_instructions(_dockerfile()) if keyword == "RUN"]
    installs = [r for r in runs if "apt-get install" in r]
    jre = [int(v) for r in installs for v in JRE_PACKAGE.findall(r)]
    # Spark 4 runs on Java 17 or 21 (bookworm has 17).
    assert jre and jre[0] >= 17, (
        f"the Dockerfile must apt-get install openjdk-17-jre-headless: {installs}"
    )
    assert not any("apache/spark" in rest for _, rest in _dockerfile_instructions(_dockerfile()))


def _pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_dockerfile_pins_the_tested_pyspark() -> None:
    pyspark = _release(importlib.metadata.version("pyspark"))
    text = " ".join(rest for _, rest in _dockerfile_instructions(_dockerfile()))
    pins = re.findall(r"pyspark==([0-9][\w.+-]*)", text)
    assert pins, f"the Dockerfile must pin pyspark=={pyspark} when installing"
    wrong = [p for p in pins if _release(p) != pyspark]
    assert not wrong, f"pyspark pins {wrong} differ from the tested pyspark {pyspark}"


def test_spark_services_use_the_launcher_of_the_pyspark_wheel(
    services: dict[str, dict[str, Any]],
) -> None:
    # The pip package installs Spark's launch scripts as console scripts on the venv's PATH.
    scripts = {
        Path(str(f)).name for f in importlib.metadata.files("pyspark") or [] if "bin" in str(f)
    }
    assert "spark-class" in scripts, sorted(scripts)
    for name in ("spark-master", *SPARK_WORKERS):
        program = _argv(services[name])[0]
        assert program == "spark-class", (
            f"{name} runs {program!r}; the image has Spark only from the pyspark wheel, whose "
            f"launcher is `spark-class` on PATH"
        )


# --- real Compose implementations -----------------------------------------------------------------

# What docker-compose 1.29 accepts at the top level of a file without `version` (the Compose
# specification of that time): no `name`, which it refuses.
COMPOSE_1_29_TOP_LEVEL = {"services", "volumes", "networks", "configs", "secrets"}


def test_top_level_keys_are_accepted_by_docker_compose_1_29() -> None:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    extra = {k for k in loaded if k not in COMPOSE_1_29_TOP_LEVEL and not k.startswith("x-")}
    assert not extra, f"top-level keys {sorted(extra)} are refused by docker-compose 1.29"


def _compose_commands() -> list[list[str]]:
    commands = []
    if shutil.which("docker-compose"):
        commands.append(["docker-compose"])
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30
        ).returncode
        == 0
    ):
        commands.append([docker, "compose"])
    return commands


@pytest.mark.parametrize(
    "compose", _compose_commands() or [None], ids=lambda c: " ".join(c or ["none"])
)
def test_real_compose_implementations_parse_the_file(compose: list[str] | None) -> None:
    # Docker's Compose is an optional tool outside the Python environment (compose-spec, a dev
    # dependency, validates the file in every run): without one, this check alone is skipped.
    if compose is None:
        pytest.skip("no Compose implementation on PATH (docker compose, docker-compose)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SNAPFLOW_", "AWS_"))}
    run = subprocess.run(
        [*compose, "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0, f"`{' '.join(compose)} config` refuses the file: {run.stderr}"


def test_dockerfile_exposes_grpc_and_metrics_ports() -> None:
    exposed = {
        int(word.split("/")[0])
        for keyword, rest in _dockerfile_instructions(_dockerfile())
        if keyword == "EXPOSE"
        for word in rest.split()
    }
    missing = {DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT} - exposed
    assert not missing, f"the Dockerfile does not EXPOSE {sorted(missing)}"


# --- commands ------------------------------------------------------------------------------------


def test_services_run_snapflow_with_a_subcommand(services: dict[str, dict[str, Any]]) -> None:
    invocations = _all_snapflow_invocations(services)
    users = {name for name, _ in invocations}
    assert {"coordinator", "submitter"} <= users, (
        f"the coordinator and the submitter must run `snapflow ...`; found it in {sorted(users)}"
    )
    for name, args in invocations:
        assert args and not args[0].startswith("-"), (
            f"service {name!r} runs `snapflow` without a subcommand: {args}"
        )
    coordinator = [args for name, args in invocations if name == "coordinator"]
    assert any(args[0] == "coordinator" for args in coordinator), (
        f"the coordinator service must run `snapflow coordinator`, not {coordinator}"
    )


def _cli_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    assert isinstance(parser, argparse.ArgumentParser), (
        f"snapflow.cli.build_parser() returned {type(parser).__name__}, not an ArgumentParser"
    )
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("the snapflow CLI parser has no subcommands")


def test_snapflow_subcommands_are_known_to_the_cli(services: dict[str, dict[str, Any]]) -> None:
    known = _subcommands(_cli_parser())
    for name, args in _all_snapflow_invocations(services):
        assert args and args[0] in known, (
            f"service {name!r} runs `snapflow {' '.join(args)}`, but the CLI's subcommands are "
            f"{sorted(known)}"
        )


def test_snapflow_commands_parse(
    services: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = _cli_parser()
    for name, args in _all_snapflow_invocations(services):
        try:
            parser.parse_args(args)
        except SystemExit as e:
            error = capsys.readouterr().err.strip()
            raise AssertionError(
                f"service {name!r}: `snapflow {' '.join(args)}` does not parse "
                f"(exit {e.code}): {error}"
            ) from None


def test_coordinator_uses_the_compose_redis(services: dict[str, dict[str, Any]]) -> None:
    args = next(a for n, a in _all_snapflow_invocations(services) if n == "coordinator")
    url = _flag_value(args, "--redis-url")
    assert url, "the coordinator must get --redis-url (empty would start an embedded Redis)"
    match = re.fullmatch(r"redis://([\w.-]+)(?::(\d+))?(?:/\d+)?", url)
    assert match, f"--redis-url {url!r} is not redis://host[:port][/db]"
    assert match.group(1) in services, (
        f"--redis-url {url!r} names host {match.group(1)!r}, which is not a compose service"
    )
    assert match.group(1) == "redis", f"--redis-url {url!r} must point at the redis service"


def _mount_holding(mounts: list[tuple[str | None, str]], path: str) -> tuple[str, str] | None:
    """The named-volume mount (volume, target) under which ``path`` lies, if any."""
    for volume, target in mounts:
        if volume is not None and (path == target or path.startswith(target.rstrip("/") + "/")):
            return volume, target
    return None


def test_submitter_runs_the_spark_demo_against_the_cluster(
    services: dict[str, dict[str, Any]],
) -> None:
    parser = _cli_parser()
    runs = [args for name, args in _all_snapflow_invocations(services) if name == "submitter"]
    assert len(runs) == 1 and runs[0][0] == "demo", (
        f"the submitter must run `snapflow demo ...` once, runs {runs}"
    )
    args = parser.parse_args(runs[0])
    config = config_from_args(args)  # the demo's own reading of its flags

    # The coordinator service, at the port it listens on.
    assert config.coordinator, "the submitter must pass --coordinator (an embedded one is local)"
    host, _, port = config.coordinator.rpartition(":")
    coordinator_args = next(a for n, a in _all_snapflow_invocations(services) if n == "coordinator")
    assert host == "coordinator", f"--coordinator {config.coordinator} must name the coordinator"
    assert int(port) == int(_flag_value(coordinator_args, "--port") or DEFAULT_GRPC_PORT), (
        f"--coordinator {config.coordinator}: not the coordinator's gRPC port"
    )

    # The standalone master, at the host and port it binds.
    master = _argv(services["spark-master"])
    master_url = f"spark://{_flag_value(master, '--host')}:{_flag_value(master, '--port') or 7077}"
    assert config.spark_master == master_url == "spark://spark-master:7077", (
        f"--spark-master {config.spark_master} must be the spark-master service ({master_url})"
    )

    # The data directory (sink output, checkpoints, kill marker): the same files for the driver,
    # every executor and the coordinator (which writes the checkpoints' _metadata).
    data_dir = config.data_dir
    assert data_dir.startswith("/"), f"--data-dir {data_dir} must be absolute"
    held = _mount_holding(_volume_mounts(services["submitter"], "submitter"), data_dir)
    assert held, f"--data-dir {data_dir} is not on a named volume of the submitter"
    for name in (*SPARK_WORKERS, "coordinator"):
        mounts = _volume_mounts(services[name], name)
        assert held in mounts, (
            f"{name} must mount volume {held[0]!r} at {held[1]} like the submitter (the demo's "
            f"data directory {data_dir} must mean the same files everywhere); it mounts {mounts}"
        )
    for dep in SPARK_WORKERS:
        assert dep in _depends_on(services["submitter"]), f"the submitter must start after {dep}"


# --- ports -----------------------------------------------------------------------------------------


def test_ports_are_well_formed_and_unique(services: dict[str, dict[str, Any]]) -> None:
    used: dict[int, str] = {}
    for name, service in services.items():
        for entry in service.get("ports", []) or []:
            host, _ = _parse_port(entry, f"service {name!r} port {entry!r}")
            for port in host:
                assert port not in used, (
                    f"host port {port} is published by both {used[port]!r} and {name!r}"
                )
                used[port] = name


def test_coordinator_publishes_grpc_and_metrics(services: dict[str, dict[str, Any]]) -> None:
    coordinator = services["coordinator"]
    args = next(a for n, a in _all_snapflow_invocations(services) if n == "coordinator")
    grpc_port = int(_flag_value(args, "--port") or DEFAULT_GRPC_PORT)
    metrics_port = int(_flag_value(args, "--metrics-port") or DEFAULT_METRICS_PORT)
    assert (grpc_port, metrics_port) == (DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT), (
        f"the coordinator should listen on {DEFAULT_GRPC_PORT} and {DEFAULT_METRICS_PORT} "
        f"(the documented ports), not {grpc_port} and {metrics_port}"
    )
    published: dict[int, list[int]] = {}
    for entry in coordinator.get("ports", []) or []:
        host_ports, container_ports = _parse_port(entry, f"coordinator port {entry!r}")
        if not host_ports:
            continue  # exposed to other containers only, not published on the host
        for h, c in zip(host_ports, container_ports, strict=True):
            published.setdefault(c, []).append(h)
    for port in (grpc_port, metrics_port):
        assert published.get(port), (
            f"the coordinator does not publish container port {port} on the host "
            f"(published: {published})"
        )
    bind = _flag_value(args, "--host")
    assert bind in ("0.0.0.0", "::"), (
        f"the coordinator must bind all interfaces (--host 0.0.0.0) to be reachable through "
        f"the published ports, not {bind!r}"
    )


def test_spark_master_publishes_its_ports(services: dict[str, dict[str, Any]]) -> None:
    container_ports: set[int] = set()
    for entry in services["spark-master"].get("ports", []) or []:
        _, container = _parse_port(entry, f"spark-master port {entry!r}")
        container_ports.update(container)
    assert {7077, 8080} <= container_ports, (
        f"spark-master must publish 7077 and 8080, publishes {sorted(container_ports)}"
    )


def test_spark_services_run_master_and_workers(services: dict[str, dict[str, Any]]) -> None:
    master = _argv(services["spark-master"])
    assert "org.apache.spark.deploy.master.Master" in master, f"spark-master runs {master}"
    for name in SPARK_WORKERS:
        argv = _argv(services[name])
        assert "org.apache.spark.deploy.worker.Worker" in argv, f"{name} runs {argv}"
        assert "spark://spark-master:7077" in argv, f"{name} does not join spark-master: {argv}"


# --- health and dependencies --------------------------------------------------------------------------


def test_redis_has_healthcheck_and_appendonly(services: dict[str, dict[str, Any]]) -> None:
    redis = services["redis"]
    test = _tokens((redis.get("healthcheck") or {}).get("test"))
    assert "redis-cli" in test and "ping" in [t.lower() for t in test], (
        f"redis needs a healthcheck running `redis-cli ping`, has {test}"
    )
    argv = _argv(redis)
    assert any(argv[i] == "--appendonly" and argv[i + 1] == "yes" for i in range(len(argv) - 1)), (
        f"redis must run with --appendonly yes (durable metadata), runs {argv}"
    )
    mounts = [target for _, target in _volume_mounts(redis, "redis")]
    assert "/data" in mounts, f"redis must keep /data (its AOF) on a volume, mounts {mounts}"


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def test_dependencies_exist_and_wait_for_health(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dep, condition in _depends_on(service).items():
            assert dep in services, f"service {name!r} depends on unknown service {dep!r}"
            if condition == "service_healthy":
                assert services[dep].get("healthcheck"), (
                    f"service {name!r} waits for {dep!r} to be healthy, but {dep!r} has no "
                    f"healthcheck"
                )
    assert _depends_on(services["coordinator"]).get("redis") == "service_healthy", (
        "the coordinator must depend on redis with condition service_healthy"
    )
    submitter = _depends_on(services["submitter"])
    assert submitter.get("coordinator") == "service_healthy", (
        "the submitter must depend on the coordinator with condition service_healthy"
    )
    assert "spark-master" in submitter, "the submitter must depend on spark-master"


def test_coordinator_healthcheck_uses_the_shipped_script(
    services: dict[str, dict[str, Any]],
) -> None:
    test = _tokens((services["coordinator"].get("healthcheck") or {}).get("test"))
    assert test and test[0] in ("CMD", "CMD-SHELL"), f"coordinator healthcheck test is {test}"
    scripts = [t for t in test if t.endswith(".py")]
    assert scripts, f"the coordinator healthcheck must run the gRPC health script: {test}"
    copies = [
        rest.split()
        for keyword, rest in _dockerfile_instructions(_dockerfile())
        if keyword == "COPY"
    ]
    copied_to = {words[-1]: words[:-1] for words in copies if len(words) >= 2}
    for script in scripts:
        assert script in copied_to, (
            f"the healthcheck runs {script}, which the Dockerfile does not COPY into the image"
        )
        for source in copied_to[script]:
            assert (ROOT / source).is_file(), f"the Dockerfile copies {source}, which is missing"


# --- volumes -------------------------------------------------------------------------------------------


def test_volumes_are_declared_and_used(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    for name, service in compose["services"].items():
        for volume, _ in _volume_mounts(service, f"service {name!r}"):
            if volume is not None:
                assert volume in declared, (
                    f"service {name!r} mounts volume {volume!r}, which is not declared under "
                    f"the top-level 'volumes' ({sorted(declared)})"
                )
                used.add(volume)
    unused = sorted(declared - used)
    assert not unused, f"declared volumes {unused} are not used by any service"


def _with_defaults(value: str) -> str:
    """Compose's ``${NAME:-default}`` / ``${NAME}`` interpolation with no variable set."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def test_compose_passes_the_aws_variables_through_unset_by_default(compose: dict[str, Any]) -> None:
    # A name without a value passes the host's variable, and none when the host has none: an
    # empty AWS_ENDPOINT_URL would be an invalid endpoint for botocore.
    for name, service in compose["services"].items():
        if service.get("image") != "snapflow:local":
            continue
        env = service.get("environment") or []
        assert isinstance(env, list), f"service {name!r}: environment should be a list of names"
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"):
            assert var in env, f"service {name!r} does not pass {var} through"


def test_checkpoint_storage_is_shared_by_coordinator_and_workers(
    services: dict[str, dict[str, Any]],
) -> None:
    args = next(a for n, a in _all_snapflow_invocations(services) if n == "coordinator")
    # As `docker compose up` resolves it with no SNAPFLOW_STORAGE_ROOT in the environment (S3
    # storage is the opt-in; its defaults are the local volume).
    root = _with_defaults(_flag_value(args, "--storage-root") or "")
    assert root and root.startswith("/"), (
        f"the coordinator needs an absolute --storage-root: {root}"
    )
    coordinator_mounts = _volume_mounts(services["coordinator"], "coordinator")
    holding = [
        (volume, target)
        for volume, target in coordinator_mounts
        if volume is not None and (root == target or root.startswith(target.rstrip("/") + "/"))
    ]
    assert holding, (
        f"--storage-root {root} is not on a named volume of the coordinator ({coordinator_mounts})"
    )
    for name in SPARK_WORKERS:
        mounts = _volume_mounts(services[name], name)
        for mount in holding:
            assert mount in mounts, (
                f"{name} must mount the checkpoint volume {mount[0]!r} at {mount[1]} like the "
                f"coordinator (state paths must mean the same file everywhere); it mounts {mounts}"
            )


# --- the health check script -----------------------------------------------------------------------------


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None).wait()


def _run_healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_healthcheck_script_reports_serving_and_not_serving(
    health_server: tuple[str, health.HealthServicer],
) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    ok = _run_healthcheck(address)
    assert ok.returncode == 0, f"SERVING must exit 0: {ok.stdout}{ok.stderr}"
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    bad = _run_healthcheck(address)
    assert bad.returncode == 1, f"NOT_SERVING must exit 1: {bad.stdout}{bad.stderr}"
    assert "NOT_SERVING" in bad.stderr


def test_healthcheck_script_fails_when_unreachable(
    health_server: tuple[str, health.HealthServicer],
) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    unknown = _run_healthcheck(address, "no.such.Service")
    assert unknown.returncode == 1, f"an unknown service must exit 1: {unknown.stderr}"
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    down = _run_healthcheck("127.0.0.1:1")
    assert down.returncode == 1, f"an unreachable server must exit 1: {down.stderr}"
    assert "UNAVAILABLE" in down.stderr
