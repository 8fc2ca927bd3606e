"""Client TLS contexts, built once per process per distinct trust material.

Loading a CA bundle (``load_verify_locations``) costs 25-40 ms of CPU, and every
``httpx.AsyncClient(verify=True)`` pays it again; a run used to build two and a forked subagent paid both on
its way to its first model request. Here each context is built once: the default one and one per distinct
``(ca, cert, key)`` file tuple. The fork server builds the default context before it forks, so its children
inherit it for free.

What the default context trusts (:func:`default_trust` says it as data, for logs and tests):

1. the operating system's trust store, as ``truststore`` (what pip uses) finds it: the platform verifier
   on macOS and Windows, the distribution's CA file/directory on Linux (OpenSSL's compiled-in paths, else
   the usual distribution files), so a corporate CA installed the system's way is trusted;
2. plus ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` when set (each is loaded in addition, never instead);
3. certifi's public bundle only as the fallback: when ``truststore`` cannot be imported or finds no
   system store at all (a minimal container). The extra files of 2. are still added then.

Why a process-level cache is not shared state two runs can interfere through: a context is configured
completely before it enters the cache and agentd never mutates it afterwards (no ``load_*``, no
verify-mode or option changes). Its only per-use change is httpcore's ``set_alpn_protocols``, and every
client agentd builds speaks HTTP/1.1 only, so that call always writes the same value. What a context holds
is public trust material or a certificate the configuration names, which every run of the process may
read anyway. Per-run state (connections, cookies, credentials) lives in each run's own ``httpx.AsyncClient``,
never here. A rotated file changes its (inode, size, mtime) and so gets a fresh context on the next
lookup; the cache holds one entry per path tuple, so rotation does not grow it.

Plain ``http://`` endpoints need no CA bundle: :func:`verify_for` gives them a context that loads no
certificates at all. It still requires a verified certificate and a matching host name, so an ``https``
URL reached through it fails closed (unverifiable) instead of being trusted.
"""

from __future__ import annotations

import os
import re
import ssl
import sys
from collections.abc import Iterable, Mapping

import attrs

_Stamp = tuple[tuple[int, int, int], ...]

_default: ssl.SSLContext | None = None
_plain: ssl.SSLContext | None = None
_by_files: dict[tuple[str | None, str | None, str | None], tuple[_Stamp, ssl.SSLContext]] = {}


@attrs.frozen
class Trust:
    """What the default context was built from: ``store`` is ``"system"`` or ``"certifi"``."""

    store: str
    cert_file: str | None = None
    cert_dir: str | None = None
    #: Why the system store was not used (``None`` when it was).
    fallback_reason: str | None = None


_trust: Trust | None = None


_HASHED = re.compile(r"^[0-9a-fA-F]{8}\.[0-9]$")

#: Where distributions keep their bundle when OpenSSL's compiled-in default is missing (truststore's list).
_LINUX_CA_FILES = (
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/pki/tls/cert.pem",
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ssl/ca-bundle.pem",
)


def _dir_has_certs(path: str | None) -> bool:
    if not path or not os.path.isdir(path):
        return False
    try:
        return any(_HASHED.match(name) for name in os.listdir(path))
    except OSError:
        return False


def _system_context() -> tuple[ssl.SSLContext | None, str | None]:
    """The OS store's context, or None and why not (no truststore, or no system store on Linux).

    On macOS and Windows this is ``truststore.SSLContext``: the platform verifier is the store. On Linux
    truststore only points OpenSSL at the distribution's CA file/directory, but it does so again on every
    handshake (re-reading the whole bundle each time); loading the same locations once, here, gives the same
    trust at the one-load-per-process cost this module exists for.
    """
    if sys.platform in ("darwin", "win32"):
        try:
            import truststore  # lazily: only a process that reaches an https endpoint pays for it
        except ImportError:
            return None, "truststore is not installed"
        return truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT), None
    # OpenSSL's compiled-in paths, not the SSL_CERT_* variables: those are added on top by build_default.
    paths = ssl.get_default_verify_paths()
    cafile = paths.openssl_cafile if paths.openssl_cafile and os.path.isfile(paths.openssl_cafile) else None
    capath = paths.openssl_capath if _dir_has_certs(paths.openssl_capath) else None
    if cafile is None and capath is None:
        cafile = next((f for f in _LINUX_CA_FILES if os.path.isfile(f)), None)
    if cafile is None and capath is None:
        return None, "no system trust store was found"
    return ssl.create_default_context(cafile=cafile, capath=capath), None


def build_default(environ: Mapping[str, str]) -> tuple[ssl.SSLContext, Trust]:
    """A fresh default context and what it trusts (:func:`default_context` caches one per process)."""
    context, reason = _system_context()
    store = "system"
    if context is None:
        import certifi

        context = ssl.create_default_context(cafile=certifi.where())
        store = "certifi"
    cert_file = environ.get("SSL_CERT_FILE") or None
    cert_dir = environ.get("SSL_CERT_DIR") or None
    if cert_file and os.path.isfile(cert_file):
        context.load_verify_locations(cafile=cert_file)
    else:
        cert_file = None
    if cert_dir and os.path.isdir(cert_dir):
        context.load_verify_locations(capath=cert_dir)
    else:
        cert_dir = None
    return context, Trust(store, cert_file, cert_dir, reason)


def default_context() -> ssl.SSLContext:
    """The process's default context: the system store plus ``SSL_CERT_FILE``/``SSL_CERT_DIR``, or certifi."""
    global _default, _trust
    if _default is None:
        _default, _trust = build_default(os.environ)
    return _default


def default_trust() -> Trust:
    """What :func:`default_context` trusts (builds it if need be)."""
    default_context()
    assert _trust is not None
    return _trust


def plain_context() -> ssl.SSLContext:
    """A client context with no trust anchors: for clients that only speak plain ``http://``.

    Nothing verifies against it, so it can never make an ``https`` peer look trusted.
    """
    global _plain
    if _plain is None:
        _plain = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname=True, CERT_REQUIRED
    return _plain


def _stamp(paths: Iterable[str | None]) -> _Stamp:
    stamps: list[tuple[int, int, int]] = []
    for path in paths:
        if path:
            st = os.stat(path)
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def client_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """A private CA and/or a client certificate (mTLS), cached while the files are unchanged.

    With ``ca`` only that CA is trusted; without it (a client certificate alone) the default context's
    trust, as :func:`default_context` describes it. Raises ``OSError``/``ssl.SSLError`` for missing or bad material.
    """
    if not (ca or cert):
        return default_context()
    paths = (ca, cert, key)
    stamp = _stamp(paths)
    cached = _by_files.get(paths)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    context = ssl.create_default_context(cafile=ca) if ca else build_default(os.environ)[0]
    if cert:
        context.load_cert_chain(cert, key)
    _by_files[paths] = (stamp, context)
    return context


def needs_tls(urls: Iterable[str]) -> bool:
    """Does any of these URLs use TLS (``https``)?"""
    return any(url.lower().startswith("https:") for url in urls)


def verify_for(urls: Iterable[str]) -> ssl.SSLContext:
    """The ``verify`` context for a client that will only reach ``urls`` (redirects are never followed)."""
    return default_context() if needs_tls(urls) else plain_context()


def warm() -> None:
    """Build the default context now (the fork server calls this so children inherit it)."""
    default_context()
