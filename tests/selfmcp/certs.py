"""Test PKI with ``cryptography``: a CA, a server certificate for 127.0.0.1/localhost, client certificates.

``make_pki(dir)`` writes PEM files and returns their paths; ``other_ca`` gives a second, unrelated CA so
tests can present a client certificate the server must not trust.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@attrs.frozen
class Issued:
    cert: Path
    key: Path


@attrs.frozen
class Pki:
    ca: Path
    server: Issued
    client: Issued
    rogue_ca: Path
    rogue_client: Issued

    def client_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """What a well-behaved peer uses: trust our CA, present a client certificate (if any)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
        return context


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_ca(directory: Path, name: str) -> tuple[Path, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name)).issuer_name(_name(name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.crt"
    _write_cert(cert, path)
    return path, cert, key


def _alt_name(name: str) -> x509.GeneralName:
    """An IP address SAN for an address (a host in a network namespace), a DNS name otherwise."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(directory: Path, name: str, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, *,
          server: bool, names: tuple[str, ...] = ()) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            *(_alt_name(n) for n in names)]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    issued = Issued(directory / f"{name}.crt", directory / f"{name}.key")
    _write_cert(cert, issued.cert)
    _write_key(key, issued.key)
    return issued


def make_pki(directory: Path, names: tuple[str, ...] = ()) -> Pki:
    """A CA, a server certificate for localhost, 127.0.0.1 and ``names`` (DNS names or IP addresses), a client
    one, and a rogue CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, ca_cert, ca_key = make_ca(directory, "ca")
    rogue_path, rogue_cert, rogue_key = make_ca(directory, "rogue-ca")
    return Pki(
        ca=ca_path,
        server=issue(directory, "server", ca_cert, ca_key, server=True, names=names),
        client=issue(directory, "client", ca_cert, ca_key, server=False),
        rogue_ca=rogue_path,
        rogue_client=issue(directory, "rogue-client", rogue_cert, rogue_key, server=False),
    )
