"""The HTTP endpoint (``/metrics``, the dashboard's API) honours the gRPC port's TLS and bearer
tokens (issue 10): no credentials or an unknown token -> 401, a role without read access ->
403, a read or operator token or a certificate identity with a role -> 200; the page's static
files stay open; the plaintext default on 127.0.0.1 needs nothing. Certificates are generated
per test (tests/kit/tls.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from pathlib import Path

import aiohttp
import pytest
from kit.coordinator import running_coordinator, submit
from kit.tls import Pki, make_pki

from snapflow.security import SecuritySettings

T = aiohttp.ClientTimeout(total=10)
PROTECTED = ("/metrics", "/api/jobs")


def _overrides(server: SecuritySettings) -> dict[str, str]:
    return {f.name: getattr(server, f.name) for f in dataclasses.fields(server)}


def _context(pki: Pki, cert: str = "none") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    files = {
        "nobody": (pki.nobody_cert, pki.nobody_key),
        "service": (pki.service_cert, pki.service_key),
    }
    if cert in files:
        context.load_cert_chain(*map(str, files[cert]))
    return context


async def _status(
    session: aiohttp.ClientSession, url: str, context: ssl.SSLContext | None, token: str | None
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with session.get(
        url, ssl=context if context is not None else False, headers=headers, timeout=T
    ) as r:
        body = await r.text()
        if r.status == 401:
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
        return r.status, body


@pytest.mark.parametrize("mutual", [False, True], ids=["tls+tokens", "mtls+tokens+identities"])
def test_tokens_and_roles_guard_metrics_and_the_api(
    redis_url: str, tmp_path: Path, mutual: bool
) -> None:
    pki = make_pki(tmp_path / "pki")
    server = pki.server(mutual=mutual)
    # With mutual TLS every client needs a certificate; "nobody" has no role of its own.
    cert = "nobody" if mutual else "none"

    async def main() -> None:
        async with (
            running_coordinator(
                redis_url,
                str(tmp_path / "cp"),
                client=pki.client("operator", cert=cert),
                metrics_port=0,
                **_overrides(server),
            ) as c,
            aiohttp.ClientSession() as http,
        ):
            job_id = await submit(c.stub)
            base = f"https://localhost:{c.coordinator.metrics_port}"
            context = _context(pki, cert)
            cases: list[tuple[str, str | None, int]] = [
                ("no credentials", None, 401),
                ("a wrong token", "not-a-token-anyone-knows-0123456789", 401),
                ("an empty bearer", "", 401),
                ("a token of the service role", pki.tokens["service"], 403),
                ("a token of the read role", pki.tokens["read"], 200),
                ("a token of the operator role", pki.tokens["operator"], 200),
            ]
            for path in (*PROTECTED, f"/api/jobs/{job_id}/checkpoints"):
                for what, token, expected in cases:
                    status, body = await _status(http, base + path, context, token)
                    assert status == expected, (path, what, status, body[:200])
                    for secret in pki.tokens.values():
                        assert secret not in body, (path, what)
            status, body = await _status(http, base + "/metrics", context, pki.tokens["read"])
            assert "snapflow_job_restarts_total" in body and job_id in body
            # The page holds no data: it loads without credentials and then asks for a token.
            for path in ("/", "/static/dashboard.js"):
                assert (await _status(http, base + path, context, None))[0] == 200, path
            # Plain HTTP to the TLS port is no way in.
            with pytest.raises(aiohttp.ClientError):
                await _status(
                    http,
                    f"http://127.0.0.1:{c.coordinator.metrics_port}/metrics",
                    None,
                    pki.tokens["read"],
                )
            if mutual:
                # A verified certificate whose name has no role: 401; one mapped to the
                # service role only: 403 (as on the gRPC port).
                assert (await _status(http, base + "/metrics", context, None))[0] == 401
                service = _context(pki, "service")
                assert (await _status(http, base + "/metrics", service, None))[0] == 403
                # Without a client certificate the handshake fails.
                with pytest.raises(aiohttp.ClientError):
                    await _status(http, base + "/metrics", _context(pki), pki.tokens["read"])

    asyncio.run(main())


def test_a_certificate_identity_with_the_read_role_needs_no_token(
    redis_url: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    server = dataclasses.replace(
        pki.server(mutual=True), auth_identities="snapflow-service=service,nobody=read"
    )

    async def main() -> None:
        async with (
            running_coordinator(
                redis_url,
                str(tmp_path / "cp"),
                client=pki.client("operator", cert="nobody"),
                metrics_port=0,
                **_overrides(server),
            ) as c,
            aiohttp.ClientSession() as http,
        ):
            base = f"https://localhost:{c.coordinator.metrics_port}"
            for path in PROTECTED:
                assert (await _status(http, base + path, _context(pki, "nobody"), None))[0] == 200
                assert (await _status(http, base + path, _context(pki, "service"), None))[0] == 403
                # A token decides when one is sent, even with a good certificate.
                status, _ = await _status(http, base + path, _context(pki, "nobody"), "x" * 20)
                assert status == 401

    asyncio.run(main())


def test_plaintext_default_on_localhost_needs_nothing(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running_coordinator(redis_url, str(tmp_path / "cp"), metrics_port=0) as c,
            aiohttp.ClientSession() as http,
        ):
            assert c.coordinator.settings.host == "127.0.0.1"
            base = f"http://127.0.0.1:{c.coordinator.metrics_port}"
            for path in (*PROTECTED, "/"):
                assert (await _status(http, base + path, None, None))[0] == 200, path
            # A token sent to an open endpoint is simply not needed.
            assert (await _status(http, base + "/metrics", None, "whatever-token-0123"))[0] == 200

    asyncio.run(main())
