"""snapflow/security.py, tls.py and access_control.py: settings checks, token files, reloads, and the secrets staying out
of errors, settings dumps and metrics."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kit.tls import make_pki

from snapflow.access_control import Authenticator, parse_tokens
from snapflow.coordinator.config import load_settings
from snapflow.errors import ConfigError
from snapflow.security import CallerRole, SecuritySettings, load_token, parse_identities
from snapflow.tls import channel_credentials


def test_plaintext_is_the_default_and_builds_no_credentials() -> None:
    s = SecuritySettings()
    assert not s.server_tls and not s.client_tls and not s.auth_enabled
    assert channel_credentials(s, environ={}) is None


@pytest.mark.parametrize(
    ("fields", "fix"),
    [
        ({"tls_cert_file": "c.pem"}, "tls_key_file"),
        ({"tls_client_ca_file": "ca.pem"}, "tls_cert_file"),
        ({"auth_tokens_file": "tokens"}, "TLS"),
        (
            {"tls_cert_file": "c", "tls_key_file": "k", "auth_identities": "agent=service"},
            "tls_client_ca_file",
        ),
    ],
)
def test_inconsistent_settings_say_what_to_set(fields: dict[str, str], fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        SecuritySettings(**fields)


def test_a_token_is_never_sent_in_clear() -> None:
    with pytest.raises(ConfigError, match="TLS is off"):
        channel_credentials(SecuritySettings(), environ={"SNAPFLOW_TOKEN": "x" * 20})


def test_token_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("  abcdefghijklmnopqrstuvwxyz\n")
    assert load_token(SecuritySettings(token_file=str(path)), {}) == "abcdefghijklmnopqrstuvwxyz"
    assert load_token(SecuritySettings(), {"SNAPFLOW_TOKEN": "from-env"}) == "from-env"
    with pytest.raises(ConfigError, match="cannot read") as e:
        load_token(SecuritySettings(token_file=str(tmp_path / "missing")), {})
    assert len(str(e.value)) < 300


def test_token_table_parsing_names_lines_not_tokens() -> None:
    entries = parse_tokens(
        "# comment\nread,operator tok-aaaaaaaaaaaaaaaa\n\nservice tok-bbbbbbbbbbbbbbbb\n"
    )
    assert entries == [
        (b"tok-aaaaaaaaaaaaaaaa", frozenset({CallerRole.READ, CallerRole.OPERATOR})),
        (b"tok-bbbbbbbbbbbbbbbb", frozenset({CallerRole.SERVICE})),
    ]
    for text in ("admin secret-token-secret-token", "read short", "read a b"):
        with pytest.raises(ConfigError, match="line 1") as e:
            parse_tokens(text)
        assert "secret-token" not in str(e.value)
    assert parse_identities("agent=service, ops=operator+read") == {
        "agent": frozenset({CallerRole.SERVICE}),
        "ops": frozenset({CallerRole.OPERATOR, CallerRole.READ}),
    }
    with pytest.raises(ConfigError, match="NAME=ROLE"):
        parse_identities("agent")


def test_tokens_file_is_reloaded_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path)
    auth = Authenticator(pki.server(mutual=False))
    assert auth.token_roles(pki.tokens["read"]) == frozenset({CallerRole.READ})
    assert auth.token_roles("x" * 32) is None
    monkeypatch.setattr("snapflow.access_control.TOKEN_RELOAD_INTERVAL_S", 0.0)
    pki.tokens_file.write_text("operator new-token-0123456789abcdef\n")
    later = time.time() + 5
    os.utime(pki.tokens_file, (later, later))
    assert auth.token_roles("new-token-0123456789abcdef") == frozenset({CallerRole.OPERATOR})
    assert auth.token_roles(pki.tokens["read"]) is None
    pki.tokens_file.write_text("garbage\n")  # a bad edit keeps the last good table
    os.utime(pki.tokens_file, (later + 5, later + 5))
    assert auth.token_roles("new-token-0123456789abcdef") == frozenset({CallerRole.OPERATOR})


def test_coordinator_settings_carry_security_and_validate_it(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    s = load_settings(
        overrides={
            "tls_cert_file": str(pki.service_cert),
            "tls_key_file": str(pki.service_key),
            "auth_tokens_file": str(pki.tokens_file),
            "savepoint_roots": f"{tmp_path}/sp, s3://bucket/savepoints",
        },
        environ={},
    )
    assert s.security().auth_enabled
    assert s.allowed_roots() == (s.storage_root, f"{tmp_path}/sp", "s3://bucket/savepoints")
    dumped = repr(s.to_dict())
    assert all(token not in dumped for token in pki.tokens.values())
    with pytest.raises(ConfigError, match=r"security settings.*SNAPFLOW_AUTH_TOKENS_FILE"):
        load_settings(environ={"SNAPFLOW_AUTH_TOKENS_FILE": "x"})
    with pytest.raises(ConfigError, match="redis_password_file"):
        load_settings(
            overrides={"redis_url": "redis://:pw@localhost/0", "redis_password_file": "f"},
            environ={},
        )
    assert load_settings(environ={}).allowed_roots() == ()


def test_redis_password_comes_from_a_file(tmp_path: Path) -> None:
    from snapflow.coordinator.server import _redis_password

    path = tmp_path / "pw"
    path.write_text("s3cret-password\n")
    s = load_settings(overrides={"redis_password_file": str(path)}, environ={})
    assert _redis_password(s) == {"password": "s3cret-password"}
    assert "s3cret" not in repr(s.to_dict())
    path.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        _redis_password(s)
