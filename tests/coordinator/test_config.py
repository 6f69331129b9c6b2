"""Coordinator settings: defaults < TOML file < SNAPFLOW_* environment < flags, type conversion,
and a ConfigError naming the setting, the source and the allowed values for every bad value."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from snapflow.coordinator.config import CoordinatorSettings, load_settings
from snapflow.errors import ConfigError


def toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "snapflow.toml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    s = load_settings(environ={})
    assert s == CoordinatorSettings()
    assert (s.host, s.port, s.redis_url, s.redis_namespace) == ("127.0.0.1", 50051, "", "snapflow")
    assert s.storage_root == "./data/checkpoints"
    assert (s.metrics_port, s.max_message_bytes) == (9464, 16 * 1024 * 1024)
    assert (s.worker_rpc_timeout_s, s.default_rpc_deadline_s) == (5.0, 30.0)
    assert (s.max_jobs, s.max_queued_trigger_requests, s.history_size) == (1000, 16, 10)
    assert (s.log_level, s.log_format, s.shutdown_grace_s) == ("info", "auto", 5.0)


def test_every_field_has_a_docstring() -> None:
    import ast
    import inspect

    import snapflow.coordinator.config as mod

    tree = ast.parse(inspect.getsource(mod))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CoordinatorSettings"
    )
    documented = set()
    for prev, node in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            documented.add(prev.target.id)
    assert documented == {f.name for f in dataclasses.fields(CoordinatorSettings)}


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = toml(
        tmp_path,
        'port = 1111\nmetrics_port = 2222\nredis_namespace = "from-file"\nhost = "0.0.0.0"\n',
    )
    env = {"SNAPFLOW_PORT": "3333", "SNAPFLOW_METRICS_PORT": "4444"}
    s = load_settings(path, overrides={"port": 5555, "metrics_port": None}, environ=env)
    assert s.port == 5555  # flag beats env and file
    assert s.metrics_port == 4444  # env beats file; a None flag is ignored
    assert s.redis_namespace == "from-file"  # file beats default
    assert s.host == "0.0.0.0"
    assert s.history_size == 10  # default


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = toml(tmp_path, "history_size = 3\n")
    assert load_settings(environ={"SNAPFLOW_CONFIG": path}).history_size == 3
    # an explicit --config wins over SNAPFLOW_CONFIG
    other = tmp_path / "other.toml"
    other.write_text("history_size = 4\n")
    assert load_settings(str(other), environ={"SNAPFLOW_CONFIG": path}).history_size == 4


def test_type_conversion_from_strings(tmp_path: Path) -> None:
    env = {
        "SNAPFLOW_PORT": " 0 ",
        "SNAPFLOW_WORKER_RPC_TIMEOUT_S": "0.25",
        "SNAPFLOW_SHUTDOWN_GRACE_S": "2",
        "SNAPFLOW_MAX_MESSAGE_BYTES": "1_048_576",
        "SNAPFLOW_LOG_LEVEL": "DEBUG",
        "SNAPFLOW_LOG_FORMAT": "Json",
        "SNAPFLOW_REDIS_URL": "redis://localhost:6379/0",
    }
    s = load_settings(overrides={"default_rpc_deadline_s": "7", "max_jobs": "12"}, environ=env)
    assert s.port == 0
    assert s.worker_rpc_timeout_s == 0.25
    assert s.shutdown_grace_s == 2.0 and isinstance(s.shutdown_grace_s, float)
    assert s.max_message_bytes == 1_048_576
    assert (s.log_level, s.log_format) == ("debug", "json")
    assert s.redis_url == "redis://localhost:6379/0"
    assert s.default_rpc_deadline_s == 7.0 and isinstance(s.default_rpc_deadline_s, float)
    assert s.max_jobs == 12
    # TOML native types; an int where a float is expected is fine
    s = load_settings(toml(tmp_path, "worker_rpc_timeout_s = 3\nport = 7\n"), environ={})
    assert s.worker_rpc_timeout_s == 3.0 and s.port == 7


def test_unrelated_environment_is_ignored() -> None:
    env = {"SNAPFLOW_SOMETHING_ELSE": "x", "PORT": "1", "SNAPFLOW_port": "2"}
    assert load_settings(environ=env) == CoordinatorSettings()


@pytest.mark.parametrize(
    ("source", "name", "value", "message"),
    [
        (
            "env",
            "port",
            "abc",
            r"'port' from environment variable SNAPFLOW_PORT: 'abc' is not an integer",
        ),
        (
            "env",
            "port",
            "70000",
            r"'port' from environment variable SNAPFLOW_PORT: 70000 is out of range; allowed: 0\.\.65535",
        ),
        ("flag", "port", -1, r"'port' from flag --port: -1 is out of range; allowed: 0\.\.65535"),
        ("flag", "metrics_port", -2, r"'metrics_port' from flag --metrics-port.*-1 to disable"),
        (
            "env",
            "worker_rpc_timeout_s",
            "0",
            r"'worker_rpc_timeout_s' from environment.*not greater than 0",
        ),
        ("env", "default_rpc_deadline_s", "-1.5", r"'default_rpc_deadline_s'.*not greater than 0"),
        ("env", "default_rpc_deadline_s", "nan", r"'default_rpc_deadline_s'.*not a finite number"),
        ("env", "shutdown_grace_s", "soon", r"'shutdown_grace_s'.*'soon' is not a number"),
        (
            "flag",
            "shutdown_grace_s",
            -1.0,
            r"'shutdown_grace_s' from flag --shutdown-grace-s: -1\.0 is negative",
        ),
        ("env", "max_message_bytes", "0", r"'max_message_bytes'.*out of range; allowed: 1024\.\."),
        ("env", "max_jobs", "0", r"'max_jobs'.*allowed: an integer >= 1"),
        ("env", "max_queued_trigger_requests", "-3", r"'max_queued_trigger_requests'.*>= 1"),
        ("env", "history_size", "1.5", r"'history_size'.*not an integer"),
        (
            "env",
            "log_level",
            "verbose",
            r"'log_level'.*'verbose'.*allowed: debug, info, warning, error, critical",
        ),
        (
            "flag",
            "log_format",
            "xml",
            r"'log_format' from flag --log-format.*allowed: auto, json, console",
        ),
        ("env", "redis_url", "localhost:6379", r"'redis_url'.*not a Redis URL; allowed: redis://"),
        (
            "env",
            "redis_namespace",
            "has space",
            r"'redis_namespace'.*allowed: a non-empty key prefix",
        ),
        (
            "env",
            "storage_root",
            "gs://bucket/chk",
            r"'storage_root'.*'gs'.*only local or shared file systems",
        ),
        ("env", "storage_root", "s3:///chk", r"'storage_root'.*names no bucket"),
        ("env", "storage_root", "s3://bkt/chk/../x", r"'storage_root'.*'\.\.' segment"),
        ("env", "s3_max_attempts", "0", r"'s3_max_attempts'.*allowed: 1\.\.20"),
        ("env", "s3_endpoint_url", "localhost:9000", r"'s3_endpoint_url'.*not an http"),
        ("env", "storage_root", "  ", r"'storage_root'.*empty"),
        ("env", "host", "", r"'host'.*allowed: e\.g\. 127\.0\.0\.1"),
        ("flag", "port", True, r"'port' from flag --port: True is not an integer"),
        ("flag", "host", 5, r"'host' from flag --host: 5 is not a string"),
    ],
)
def test_invalid_values(source: str, name: str, value: object, message: str) -> None:
    if source == "env":
        assert isinstance(value, str)
        kwargs: dict[str, object] = {"environ": {f"SNAPFLOW_{name.upper()}": value}}
    else:
        kwargs = {"overrides": {name: value}, "environ": {}}
    with pytest.raises(ConfigError, match=message):
        load_settings(**kwargs)  # type: ignore[arg-type]


def test_invalid_value_in_file_names_the_file(tmp_path: Path) -> None:
    path = toml(tmp_path, 'port = "eighty"\n')
    with pytest.raises(
        ConfigError, match=rf"'port' from config file {re.escape(path)}: 'eighty' is not an integer"
    ):
        load_settings(path, environ={})
    path = toml(tmp_path, "max_jobs = 0\n")
    with pytest.raises(ConfigError, match=rf"'max_jobs' from config file {re.escape(path)}"):
        load_settings(path, environ={})


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = toml(tmp_path, "prot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) 'prot' \(did you mean 'port'\?\)"):
        load_settings(path, environ={})


def test_bad_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(str(tmp_path / "missing.toml"), environ={})
    with pytest.raises(ConfigError, match="SNAPFLOW_CONFIG"):
        load_settings(environ={"SNAPFLOW_CONFIG": str(tmp_path / "missing.toml")})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(toml(tmp_path, "port = = 1\n"), environ={})


def test_unknown_override() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        load_settings(overrides={"colour": "blue"}, environ={})


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="'port'"):
        CoordinatorSettings(port=99999)
    with pytest.raises(ConfigError, match="'port'"):
        dataclasses.replace(CoordinatorSettings(), port=-5)
    assert CoordinatorSettings(log_level="WARN").log_level == "warning"


def test_to_dict_redacts_the_redis_password() -> None:
    s = load_settings(
        overrides={"redis_url": "redis://user:s3cret@redis.example:6380/1"}, environ={}
    )
    d = s.to_dict()
    assert d["redis_url"] == "redis://user:***@redis.example:6380/1"
    assert "s3cret" not in str(d)
    assert s.to_dict(redact_secrets=False)["redis_url"] == s.redis_url
    assert set(d) == {f.name for f in dataclasses.fields(CoordinatorSettings)}
    assert d["port"] == 50051


def test_s3_storage_and_settings_from_the_environment() -> None:
    env = {
        "SNAPFLOW_STORAGE_ROOT": "s3://snapflow-chk/prod/",
        "SNAPFLOW_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "SNAPFLOW_S3_REGION": "eu-west-1",
        "SNAPFLOW_S3_PROFILE": "ops",
        "SNAPFLOW_S3_MAX_ATTEMPTS": "3",
    }
    s = load_settings(environ=env)
    assert s.storage_root == "s3://snapflow-chk/prod/"
    s3 = s.s3_settings()
    assert (s3.endpoint_url, s3.region, s3.profile, s3.max_attempts) == (
        "http://127.0.0.1:9000",
        "eu-west-1",
        "ops",
        3,
    )
    # Empty settings fall back to the AWS conventions (botocore reads AWS_* itself).
    default = load_settings(environ={}).s3_settings()
    assert (default.endpoint_url, default.region, default.profile) == (None, None, None)
    assert default.max_attempts == 5
