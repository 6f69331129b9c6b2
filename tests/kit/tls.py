"""Test certificates (made with ``cryptography``) and security settings built from them.

``make_pki(dir)`` writes a CA, a service certificate (CN ``snapflow-service``, SANs
``localhost`` and 127.0.0.1: every server and every internal client presents it), a client
certificate whose name has no role (CN ``nobody``), a second, unknown CA with a certificate
that claims the service name, and a tokens file with one token per role.
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

from snapflow.security import SecuritySettings

SERVICE_NAME = "snapflow-service"


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    service_cert: Path
    service_key: Path
    nobody_cert: Path
    nobody_key: Path
    rogue_cert: Path
    rogue_key: Path
    tokens_file: Path
    tokens: dict[str, str]

    def token_file(self, role: str) -> Path:
        path = self.dir / f"{role}.token"
        path.write_text(self.tokens[role] + "\n")
        return path

    def server(self, *, mutual: bool = True, tokens: bool = True) -> SecuritySettings:
        """Settings of a server (and its internal client side) presenting the service cert."""
        return SecuritySettings(
            tls_cert_file=str(self.service_cert),
            tls_key_file=str(self.service_key),
            tls_ca_file=str(self.ca),
            tls_client_ca_file=str(self.ca) if mutual else "",
            auth_tokens_file=str(self.tokens_file) if tokens else "",
            auth_identities=f"{SERVICE_NAME}=service" if mutual else "",
        )

    def client(
        self, role: str | None = None, *, cert: str = "none", token: str | None = None
    ) -> SecuritySettings:
        """A client trusting the CA; ``cert``: none, nobody, service or rogue; a token of
        ``role`` or the literal ``token`` (written to a file)."""
        files = {
            "none": ("", ""),
            "nobody": (self.nobody_cert, self.nobody_key),
            "service": (self.service_cert, self.service_key),
            "rogue": (self.rogue_cert, self.rogue_key),
        }[cert]
        token_file = ""
        if role is not None:
            token_file = str(self.token_file(role))
        elif token is not None:
            path = self.dir / "literal.token"
            path.write_text(token)
            token_file = str(path)
        return SecuritySettings(
            tls_ca_file=str(self.ca),
            tls_cert_file=str(files[0]),
            tls_key_file=str(files[1]),
            token_file=token_file,
        )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
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
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("snapflow-test-ca")
    _write(directory / "ca", ca, None)
    for name, cn in (("service", SERVICE_NAME), ("nobody", "nobody")):
        cert, key = _leaf(cn, ca, ca_key)
        _write(directory / name, cert, key)
    rogue_ca, rogue_ca_key = _ca("rogue-ca")
    cert, key = _leaf(SERVICE_NAME, rogue_ca, rogue_ca_key)
    _write(directory / "rogue", cert, key)
    tokens = {role: secrets.token_urlsafe(24) for role in ("read", "operator", "service")}
    tokens_file = directory / "tokens"
    tokens_file.write_text(
        "# role token\n" + "".join(f"{role} {token}\n" for role, token in tokens.items())
    )
    return Pki(
        dir=directory,
        ca=directory / "ca.crt",
        service_cert=directory / "service.crt",
        service_key=directory / "service.key",
        nobody_cert=directory / "nobody.crt",
        nobody_key=directory / "nobody.key",
        rogue_cert=directory / "rogue.crt",
        rogue_key=directory / "rogue.key",
        tokens_file=tokens_file,
        tokens=tokens,
    )
