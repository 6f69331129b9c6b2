"""The client commands with TLS and tokens: the right token works, a wrong one or a read-only
one is refused with a hint, and no token reaches the output (tables or ``--json``)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.tls import Pki, make_pki

from snapflow.cli.main import main
from snapflow.coordinator.embedded import local_settings
from snapflow.coordinator.server import Coordinator


@pytest.fixture
def tls_coordinator(redis_url: str, tmp_path: Path) -> Iterator[tuple[str, Pki]]:
    pki = make_pki(tmp_path / "pki")
    server = pki.server(mutual=False)
    overrides = {f.name: getattr(server, f.name) for f in dataclasses.fields(server)}
    loop = asyncio.new_event_loop()
    coordinator = Coordinator(local_settings(redis_url, str(tmp_path / "cp"), **overrides))
    loop.run_until_complete(coordinator.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{coordinator.port}", pki
    finally:
        asyncio.run_coroutine_threadsafe(coordinator.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_cli_uses_tls_and_a_token_from_a_file(
    tls_coordinator: tuple[str, Pki],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    address, pki = tls_coordinator
    monkeypatch.delenv("SNAPFLOW_TOKEN", raising=False)
    monkeypatch.setenv("SNAPFLOW_TLS_CA_FILE", str(pki.ca))
    operator = str(pki.token_file("operator"))
    assert main(["jobs", "--address", address, "--token-file", operator, "--json"]) == 0
    assert main(["jobs", "--address", address, "--token-file", operator]) == 0
    # Read-only may list but not cancel; no token at all is UNAUTHENTICATED with a hint.
    read = str(pki.token_file("read"))
    job = "0" * 32
    assert main(["cancel", job, "--address", address, "--token-file", read]) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    assert main(["jobs", "--address", address]) == 1
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED" in err and "SNAPFLOW_TOKEN_FILE" in err
    monkeypatch.setenv("SNAPFLOW_TOKEN", "wrong-token-0123456789abcdef")
    assert main(["jobs", "--address", address]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    # Plain text to the TLS port fails; a token would not be sent in clear at all.
    monkeypatch.delenv("SNAPFLOW_TLS_CA_FILE")
    assert main(["jobs", "--address", address, "--token-file", operator]) == 2
    assert "TLS is off" in capsys.readouterr().err
    monkeypatch.delenv("SNAPFLOW_TOKEN")
    assert main(["jobs", "--address", address, "--timeout", "2"]) == 1
    out = capsys.readouterr()
    for token in pki.tokens.values():
        assert token not in out.out + out.err
