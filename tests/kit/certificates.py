"""Certificates for a local or test cluster: a CA and leaf certificates signed by it.

For trying TLS and mutual TLS without an existing PKI: the tests and the security benchmark
(which runs with ``tests/`` on its path) use it; it is not shipped, since deployments bring their
own certificates (docs/security.md). Keys are P-256; a leaf certificate is valid for server and
client authentication and names its CN, ``localhost`` and 127.0.0.1. Needs the ``cryptography``
package (in the ``dev`` extra), imported only when a certificate is made.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any

from snapflow.errors import ConfigError

__all__ = ["CertificateAuthority"]

VALIDITY = datetime.timedelta(days=1)
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid a little before now: clocks differ


def _crypto() -> Any:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ConfigError(
            "making certificates needs the 'cryptography' package: pip install cryptography "
            "(or install snapflow with its dev extra)"
        ) from None
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


class CertificateAuthority:
    """A self-signed CA that issues leaf certificates into files ``<path>.crt``/``<path>.key``."""

    def __init__(self, cn: str) -> None:
        x509, hashes, _, ec, _, _ = _crypto()
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = _name(cn)
        self.certificate = _valid(
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
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
        ).sign(self._key, hashes.SHA256())

    def write(self, path: Path) -> Path:
        """The CA certificate (no key) at ``<path>.crt``; returns that file."""
        return _write(path, self.certificate, None)

    def issue(self, cn: str, path: Path) -> tuple[Path, Path]:
        """A leaf certificate for ``cn`` at ``<path>.crt`` and its key at ``<path>.key``."""
        x509, hashes, _, ec, eku, _ = _crypto()
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _valid(
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.certificate.subject)
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
                x509.ExtendedKeyUsage([eku.SERVER_AUTH, eku.CLIENT_AUTH]), critical=False
            )
        ).sign(self._key, hashes.SHA256())
        return _write(path, cert, key), path.with_suffix(".key")


def _name(cn: str) -> Any:
    x509, _, _, _, _, name_oid = _crypto()
    return x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, cn)])


def _valid(builder: Any) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - CLOCK_SKEW).not_valid_after(now + VALIDITY)


def _write(path: Path, cert: Any, key: Any) -> Path:
    _, _, serialization, _, _, _ = _crypto()
    path.parent.mkdir(parents=True, exist_ok=True)
    crt = path.with_suffix(".crt")
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_file = path.with_suffix(".key")
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_file.chmod(0o600)
    return crt
