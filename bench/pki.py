"""Throwaway certificates and tokens for the security benchmark (made with ``cryptography``).

The same certificates as the tests' ``tests/kit/tls.py`` (a benchmark cannot import the test
kit): a CA, a service certificate (CN ``snapflow-service``, SANs ``localhost`` and 127.0.0.1,
server and client use) that the coordinator and the agents present on every hop, a client
certificate for the benchmark's own calls (CN ``snapflow-bench``), and a tokens file with a
service and an operator token. Everything lives in the directory given and is valid for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_path = path.with_suffix(".key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return _validity(builder).sign(key, hashes.SHA256()), key


def _leaf(
    cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(cn),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    return _validity(builder).sign(ca_key, hashes.SHA256()), key


def _secret_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def make_pki(directory: Path) -> BenchPki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("snapflow-bench-ca")
    _write(directory / "ca", ca, None)
    for name, cn in (("service", SERVICE_NAME), ("client", CLIENT_NAME)):
        cert, key = _leaf(cn, ca, ca_key)
        _write(directory / name, cert, key)
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
