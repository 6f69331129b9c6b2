"""Test certificates (made with ``cryptography``) and security settings built from them.

``make_pki(dir)`` writes a CA, a service certificate (CN ``snapflow-service``, SANs
``localhost`` and 127.0.0.1: every server and every internal client presents it), a client
certificate whose name has no role (CN ``nobody``), a second, unknown CA with a certificate
that claims the service name, and a tokens file with one token per role.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from kit.certificates import CertificateAuthority
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


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority("snapflow-test-ca")
    ca.write(directory / "ca")
    for name, cn in (("service", SERVICE_NAME), ("nobody", "nobody")):
        ca.issue(cn, directory / name)
    # An unknown CA's certificate that claims the service's name.
    CertificateAuthority("rogue-ca").issue(SERVICE_NAME, directory / "rogue")
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
