"""Client TLS contexts, built once per process per distinct trust material.

Loading a CA bundle (``load_verify_locations``) costs 25-40 ms of CPU, and every
``httpx.AsyncClient(verify=True)`` pays it again; a run used to build two and a forked subagent paid both on
its way to its first model request. Here each context is built once: the default one (certifi's bundle,
what httpx's ``verify=True`` loads) and one per distinct ``(ca, cert, key)`` file tuple. The fork server
builds the default context before it forks, so its children inherit it for free.

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
import ssl
from collections.abc import Iterable

import certifi

_Stamp = tuple[tuple[int, int, int], ...]

_default: ssl.SSLContext | None = None
_plain: ssl.SSLContext | None = None
_by_files: dict[tuple[str | None, str | None, str | None], tuple[_Stamp, ssl.SSLContext]] = {}


def default_context() -> ssl.SSLContext:
    """The public-CA context (certifi's bundle, exactly what httpx's ``verify=True`` builds)."""
    global _default
    if _default is None:
        _default = ssl.create_default_context(cafile=certifi.where())
    return _default


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

    Semantics of ``ssl.create_default_context(cafile=ca)``: with ``ca`` only that CA is trusted, without it
    the system's default trust store. Raises ``OSError``/``ssl.SSLError`` for missing or bad material.
    """
    if not (ca or cert):
        return default_context()
    paths = (ca, cert, key)
    stamp = _stamp(paths)
    cached = _by_files.get(paths)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    context = ssl.create_default_context(cafile=ca)
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
