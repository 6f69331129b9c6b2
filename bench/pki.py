"""Throwaway certificates and tokens for the security benchmark (made with ``cryptography``).

Certificates made by the test kit's ``kit.certificates``, as the tests make theirs: a CA, a service certificate (CN ``snapflow-service``, SANs ``localhost`` and 127.0.0.1,
server and client use) that the coordinator and the agents present on every hop, a client
certificate for the benchmark's own calls (CN ``snapflow-bench``), and a tokens file with a
service and an operator token. Everything lives in the directory given and is valid for a day.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from kit.certificates import CertificateAuthority

from snapflow.security import ENV_PREFIX, SECURITY_FIELDS, SecuritySettings

SERVICE_NAME = "snapflow-service"
CLIENT_NAME = "snapflow-bench"


@dataclass(frozen=True)
class BenchPki:
    dir: Path
    ca: Path
    service_cert: Path
    service_key: Path
    client_cert: Path
    client_key: Path
    tokens_file: Path
    service_token_file: Path
    operator_token_file: Path

    def service_settings(self) -> SecuritySettings:
        """The coordinator's and the agents' settings: mutual TLS, tokens checked, the service
        token sent on every call they make."""
        return SecuritySettings(
            tls_cert_file=str(self.service_cert),
            tls_key_file=str(self.service_key),
            tls_ca_file=str(self.ca),
            tls_client_ca_file=str(self.ca),
            token_file=str(self.service_token_file),
            auth_tokens_file=str(self.tokens_file),
            auth_identities=f"{SERVICE_NAME}=service",
        )

    def service_env(self) -> dict[str, str]:
        """:meth:`service_settings` as the ``SNAPFLOW_*`` variables the processes read."""
        s = self.service_settings()
        return {
            ENV_PREFIX + name.upper(): getattr(s, name)
            for name in SECURITY_FIELDS
            if getattr(s, name)
        }

    def operator_settings(self) -> SecuritySettings:
        """The benchmark's own client: its certificate (mutual TLS) and the operator token."""
        return SecuritySettings(
            tls_ca_file=str(self.ca),
            tls_cert_file=str(self.client_cert),
            tls_key_file=str(self.client_key),
            token_file=str(self.operator_token_file),
        )


def _secret_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def make_pki(directory: Path) -> BenchPki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority("snapflow-bench-ca")
    ca.write(directory / "ca")
    for name, cn in (("service", SERVICE_NAME), ("client", CLIENT_NAME)):
        ca.issue(cn, directory / name)
    service, operator = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    tokens_file = _secret_file(
        directory / "tokens", f"# role token\nservice {service}\noperator {operator}\n"
    )
    return BenchPki(
        dir=directory,
        ca=directory / "ca.crt",
        service_cert=directory / "service.crt",
        service_key=directory / "service.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        tokens_file=tokens_file,
        service_token_file=_secret_file(directory / "service.token", service + "\n"),
        operator_token_file=_secret_file(directory / "operator.token", operator + "\n"),
    )
