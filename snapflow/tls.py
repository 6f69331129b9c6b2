"""Transport security of Snapflow's gRPC servers and channels: TLS with grpc's own credentials.

A server with ``tls_cert_file``/``tls_key_file`` serves TLS, re-reading the files when they
change (before each new handshake, through ``grpc.dynamic_ssl_server_credentials``); with
``tls_client_ca_file`` it requires and verifies a client certificate (mutual TLS). A client
with ``tls_ca_file`` (or a certificate of its own) connects with TLS, presents its certificate
when it has one and sends its bearer token only over TLS. Plaintext when nothing is set.
The settings are :class:`~snapflow.security.SecuritySettings`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import structlog

from snapflow.errors import ConfigError
from snapflow.security import (
    PLAINTEXT,
    SecuritySettings,
    load_token,
    modified_stamp,
    read_secret_file,
)

log = structlog.get_logger("snapflow.tls")


class _ServerCertificates:
    """Reads the server's certificate files and re-reads them when one changed (grpc calls
    :meth:`fetch` before each new handshake)."""

    def __init__(self, settings: SecuritySettings) -> None:
        self.settings = settings
        self._paths = [
            p
            for p in (settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)
            if p
        ]
        self._stamp = self._stamps()
        self.initial = self._config()

    def _stamps(self) -> tuple[float, ...]:
        return tuple(modified_stamp(p) for p in self._paths)

    def _config(self) -> Any:
        s = self.settings
        key = read_secret_file(s.tls_key_file, "tls_key_file")
        chain = read_secret_file(s.tls_cert_file, "tls_cert_file")
        roots = (
            read_secret_file(s.tls_client_ca_file, "tls_client_ca_file")
            if s.tls_client_ca_file
            else None
        )
        return grpc.ssl_server_certificate_configuration([(key, chain)], roots)

    def fetch(self) -> Any:
        stamp = self._stamps()
        if stamp == self._stamp:
            return None
        try:
            config = self._config()
        except ConfigError as e:  # half-written or removed: keep serving with the old files
            log.warning("tls.reload_failed", error=str(e)[:300])
            return None
        self._stamp = stamp
        log.info("tls.reloaded", files=len(self._paths))
        return config


def server_credentials(settings: SecuritySettings) -> grpc.ServerCredentials | None:
    """TLS credentials of a server (mutual TLS with ``tls_client_ca_file``), or None for
    plaintext."""
    if not settings.server_tls:
        return None
    certificates = _ServerCertificates(settings)
    return grpc.dynamic_ssl_server_credentials(
        certificates.initial,
        certificates.fetch,
        require_client_authentication=bool(settings.tls_client_ca_file),
    )


def add_port(server: grpc.aio.Server, address: str, settings: SecuritySettings) -> int:
    """Bind ``address`` with TLS or plaintext as configured; the bound port (0: failed)."""
    credentials = server_credentials(settings)
    if credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials)


def channel_credentials(
    settings: SecuritySettings, environ: Mapping[str, str] | None = None
) -> grpc.ChannelCredentials | None:
    """A client's TLS credentials (with its certificate and its bearer token when set), or
    None for plaintext. A token without TLS is a ConfigError: it would travel in clear."""
    token = load_token(settings, environ)
    if not settings.client_tls:
        if token:
            raise ConfigError(
                "a bearer token is set (token_file or SNAPFLOW_TOKEN) but TLS is off: set "
                "tls_ca_file so the token is not sent in clear"
            )
        return None
    roots = read_secret_file(settings.tls_ca_file, "tls_ca_file") if settings.tls_ca_file else None
    key = chain = None
    if settings.tls_cert_file:
        key = read_secret_file(settings.tls_key_file, "tls_key_file")
        chain = read_secret_file(settings.tls_cert_file, "tls_cert_file")
    credentials = grpc.ssl_channel_credentials(roots, key, chain)
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return credentials


def channel_options(settings: SecuritySettings) -> list[tuple[str, Any]]:
    if settings.client_tls and settings.tls_server_name:
        return [("grpc.ssl_target_name_override", settings.tls_server_name)]
    return []


def aio_channel(
    address: str,
    settings: SecuritySettings = PLAINTEXT,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``address``, TLS and token as configured."""
    credentials = channel_credentials(settings)
    opts = [*options, *channel_options(settings)]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=opts)
    return grpc.aio.secure_channel(address, credentials, options=opts)


def sync_channel(
    address: str,
    settings: SecuritySettings = PLAINTEXT,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A synchronous channel to ``address``, TLS and token as configured."""
    credentials = channel_credentials(settings)
    opts = [*options, *channel_options(settings)]
    if credentials is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, credentials, options=opts)
