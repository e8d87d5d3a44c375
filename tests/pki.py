"""A throwaway certificate authority for tests, made with ``cryptography``: a CA, client certificates."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def key_pem(self) -> str:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """``name.pem`` and ``name-key.pem`` (mode 600) in ``directory``."""
        cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
        cert.write_text(self.cert_pem)
        key.write_text(self.key_pem)
        key.chmod(0o600)
        return cert, key


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    extensions: list[tuple[x509.ExtensionType, bool]],
    issuer: Issued | None = None,
) -> Issued:
    """A key and a certificate for ``subject``, valid from five minutes ago for a day, signed by
    ``issuer`` (self-signed when ``None``), with ``extensions`` as (extension, critical) pairs."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.cert.subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return Issued(key, builder.sign(issuer.key if issuer else key, hashes.SHA256()))


def make_ca(common_name: str = "statecodec test CA") -> Issued:
    return _issue(common_name, [(x509.BasicConstraints(ca=True, path_length=None), True)])


def issue_client_cert(ca: Issued, common_name: str) -> Issued:
    """A TLS client certificate (extended key usage clientAuth) signed by ``ca``."""
    return _issue(common_name, [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)], ca)


def issue_server_cert(ca: Issued, address: str) -> Issued:
    """A TLS server certificate for the IP ``address`` (extended key usage serverAuth) signed by ``ca``."""
    import ipaddress  # noqa: PLC0415 - only this helper needs it

    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))])
    return _issue(
        address,
        [(san, False), (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)],
        ca,
    )
