"""Plain words for a failed TLS connection: which of the usual four causes it was, and what to do.

Two sources:

- the server's certificate did not verify: OpenSSL's verify code says whether its CA is unknown, it names
  another host, or it has expired (:func:`verify_hint`, pure);
- the server refused the *client*: a client certificate is required and none was sent, or the one sent is
  not trusted. TLS 1.3 reports that only after the handshake, as an alert or a bare close, and httpx loses
  it (an empty ``ReadError``); :func:`probe_client_refusal` opens one bounded TLS connection of its own to
  see what happens right after the handshake. It runs only on that failure path, never on a healthy one,
  and never reaches a link-local/cloud metadata address (the egress rule of every operator endpoint).
"""

from __future__ import annotations

import ipaddress
import ssl
from typing import Final

import trio

#: Appended when a server's certificate did not verify for want of a trusted CA: where trust comes from.
UNTRUSTED_HINT: Final = (
    "the server's certificate is not trusted: agentd trusts the OS trust store plus SSL_CERT_FILE/SSL_CERT_DIR "
    "(certifi's bundle when there is no OS store); add a private CA with the server's tls.ca, --tls-ca or "
    "SSL_CERT_FILE"
)
WRONG_HOST_HINT: Final = (
    "the server's certificate is not issued for this host name or address: use a name the certificate lists "
    "in the URL, or have the certificate reissued to include this one"
)
EXPIRED_HINT: Final = (
    "the server's certificate has expired: its operator must renew it; if it should still be valid, check this "
    "machine's clock"
)
NOT_YET_HINT: Final = "the server's certificate is not valid yet: check the clocks of this machine and the server"
CLIENT_CERT_REQUIRED_HINT: Final = (
    "the server requires a client certificate (mutual TLS) and agentd sent none: give this server's entry "
    "tls: {cert: client.pem, key: client.key}"
)
CLIENT_CERT_REFUSED_HINT: Final = (
    "the server refused agentd's client certificate: it must be issued by a CA the server trusts for clients; "
    "check tls.cert/tls.key of this server's entry against the server's client CA"
)

# OpenSSL verify codes (X509_V_ERR_*).
_NOT_YET_VALID: Final = 9
_EXPIRED: Final = 10
_WRONG_HOST: Final = frozenset({62, 64})  # HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH

#: The bound on the probe: connect, handshake, and the wait for the server's verdict on the client.
PROBE_TIMEOUT: Final = 3.0

_REQUIRED_ALERTS: Final = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE")
_REFUSED_ALERTS: Final = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "ACCESS_DENIED",
                          "UNSUPPORTED_CERTIFICATE", "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED")  # fmt: skip


def verify_hint(failure: ssl.SSLCertVerificationError) -> str:
    """What a certificate verification failure means for the person, by its verify code."""
    code = failure.verify_code
    if code in _WRONG_HOST:
        return WRONG_HOST_HINT
    if code == _EXPIRED:
        return EXPIRED_HINT
    if code == _NOT_YET_VALID:
        return NOT_YET_HINT
    return UNTRUSTED_HINT


#: The gateway is not an MCP server: its trust is the default store plus SSL_CERT_FILE, never --tls-ca.
GATEWAY_UNTRUSTED_HINT: Final = (
    "the gateway's certificate is not trusted: agentd trusts the OS trust store plus SSL_CERT_FILE/SSL_CERT_DIR "
    "for the gateway (--tls-ca applies to MCP servers and A2A peers only); add a private CA with SSL_CERT_FILE"
)


def gateway_verify_hint(failure: ssl.SSLCertVerificationError) -> str:
    """:func:`verify_hint` with the gateway's own trust rule for an unknown CA."""
    hint = verify_hint(failure)
    return GATEWAY_UNTRUSTED_HINT if hint == UNTRUSTED_HINT else hint


def _verdict(error: BaseException | None, *, sent_cert: bool) -> str:
    reason = str(getattr(error, "reason", "") or "").upper()
    if any(alert in reason for alert in _REFUSED_ALERTS):
        return CLIENT_CERT_REFUSED_HINT if sent_cert else CLIENT_CERT_REQUIRED_HINT
    if any(alert in reason for alert in _REQUIRED_ALERTS):
        return CLIENT_CERT_REQUIRED_HINT if not sent_cert else CLIENT_CERT_REFUSED_HINT
    # A bare close right after the handshake: the server's verdict on the client, without an alert.
    return CLIENT_CERT_REFUSED_HINT if sent_cert else CLIENT_CERT_REQUIRED_HINT


def _metadata(tcp: trio.SocketStream) -> bool:
    """Did the connection land where egress is refused by default (agentd.transport.egress): a link-local/cloud
    metadata address, or a private or other non-public one? (The probe does not know ``egress.allow``: a server
    there that it allows gets no probe, only the plain connection error.)"""
    from agentd.transport.egress import EgressPolicy, classify_address

    try:
        address = ipaddress.ip_address(str(tcp.socket.getpeername()[0]).split("%", 1)[0])
    except (OSError, ValueError, IndexError):
        return True  # unknown: do not probe
    return classify_address(address, EgressPolicy(), loopback_ok=True) is not None


async def probe_client_refusal(host: str, port: int, context: ssl.SSLContext, *, sent_cert: bool,
                               timeout: float = PROBE_TIMEOUT) -> str | None:  # fmt: skip
    """Does the server drop the connection right after the TLS handshake (its verdict on the client)?

    Returns the hint if it does; None if the server accepts the client (it waits for a request), the
    handshake fails for another reason, or nothing is decided within ``timeout``."""
    with trio.move_on_after(timeout):
        try:
            tcp = await trio.open_tcp_stream(host, port)
        except OSError:
            return None
        if _metadata(tcp):  # the egress rule holds for the probe too: not a byte where it refuses
            with trio.move_on_after(0.5, shield=True):
                await tcp.aclose()
            return None
        stream = trio.SSLStream(tcp, context, server_hostname=host)
        try:
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:  # TLS 1.2: the client is refused inside the handshake
                cause = exc.__cause__
                if isinstance(cause, ssl.SSLCertVerificationError):
                    return None  # the *server's* certificate: already explained by verify_hint
                return _verdict(cause, sent_cert=sent_cert) if isinstance(cause, ssl.SSLError) else None
            try:
                data = await stream.receive_some(1)
            except trio.BrokenResourceError as exc:
                return _verdict(exc.__cause__, sent_cert=sent_cert)
            return _verdict(None, sent_cert=sent_cert) if not data else None
        finally:
            with trio.move_on_after(0.5, shield=True):
                await trio.aclose_forcefully(stream)
    return None
