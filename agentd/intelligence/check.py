"""``agentd check --intelligence URL``: is the gateway reachable, its certificate trusted, the token accepted,
the model known? One answer per endpoint, with one hint per failure.

Why ``GET …/models`` and not a completion: it costs no tokens, it goes through the same TLS, proxy and
``Authorization`` as a completion, and OpenAI-compatible gateways (OpenAI, vLLM, LiteLLM, Ollama, OpenRouter…)
answer it with the models they serve. A gateway without it (404 or 405) is reported reachable with the token
and the model unchecked (``null``), not guessed. A check reports: one attempt per endpoint, bounded by
:data:`agentd.defaults.CONNECT_TIMEOUT`, never the run's retries (a certificate that does not verify does not
verify three times either).
"""

from __future__ import annotations

import difflib
import json
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import httpx
import trio

from agentd.defaults import CONNECT_TIMEOUT
from agentd.intelligence.endpoints import OFFLINE, display, parse_endpoints
from agentd.intelligence.gateway import cause_in
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from agentd.transport.egress import EgressPolicy
from agentd.transport.http_client import MetadataRefused, new_client
from agentd.transport.proxy import ProxyEnv
from agentd.transport.tls import verify_for
from agentd.transport.tls_errors import gateway_verify_hint

#: A models list longer than this is not read to the end (a hostile or broken gateway cannot fill memory).
MAX_MODELS_BYTES: Final = 4 * 1024 * 1024


@attrs.frozen
class GatewayCheck:
    """What one endpoint answered. ``token``: accepted, rejected, none (no token given), unchecked.
    ``model_known``: None when the gateway lists no models."""

    endpoint: str
    reachable: bool
    tls: str | None  # "verified", "failed", or None for plain http
    token: str
    model_known: bool | None
    error: str | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "ok": self.ok, "reachable": self.reachable, "tls": self.tls,
                "token": self.token, "modelKnown": self.model_known, "error": self.error, "hint": self.hint}


def models_url(completions: str) -> str:
    """``…/chat/completions`` → ``…/models`` (the endpoint's base, as the gateway serves both under it)."""
    return completions.removesuffix("/chat/completions") + "/models"


def model_ids(body: bytes) -> list[str] | None:
    """The ids of an OpenAI-style ``{"data": [{"id": …}, …]}`` (None when the body is not that shape)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    return [str(item["id"]) for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]


def judge_models(endpoint: str, tls: str | None, token: str, status: int, body: bytes, model: str,
                 *, has_token: bool) -> GatewayCheck:
    """The verdict on one ``GET …/models`` answer (pure)."""
    if status in (401, 403):
        hint = ("check that the variable or file --intelligence-token names holds a key for this gateway"
                if has_token else "the gateway wants a token: --intelligence-token '{{secret:NAME}}' or "
                "--intelligence-token-file PATH")
        return GatewayCheck(endpoint, True, tls, "rejected" if has_token else "none", None,
                            f"the gateway refused the credentials (HTTP {status})", hint)
    if status in (404, 405):
        return GatewayCheck(endpoint, True, tls, "unchecked", None)
    if status != 200:
        return GatewayCheck(endpoint, True, tls, "unchecked", None, f"GET models answered HTTP {status}",
                            "a 5xx is the gateway's own trouble; a 4xx other than 401/403/404 usually means the "
                            "base URL names something else")
    ids = model_ids(body)
    if ids is None:
        return GatewayCheck(endpoint, True, tls, token, None)
    if model in ids:
        return GatewayCheck(endpoint, True, tls, token, True)
    close = difflib.get_close_matches(model, ids, n=1)
    hint = (f"did you mean --model {close[0]}?" if close
            else f"the gateway lists {len(ids)} model(s); --model must be one of them")
    return GatewayCheck(endpoint, True, tls, token, False, f"the gateway does not list the model {model!r}", hint)


async def _check_one(client: httpx.AsyncClient, completions: str, model: str, token: str | None,
                     proxies: ProxyEnv) -> GatewayCheck:
    endpoint = display(completions)
    url = models_url(completions)
    tls: str | None = "verified" if url.startswith("https://") else None
    headers = {"accept": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    proxy = proxies.proxy_for(url)
    body = b""
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            async with client.stream("GET", url, headers=headers) as response:
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_MODELS_BYTES:
                        break
                status = response.status_code
    except trio.TooSlowError:
        return GatewayCheck(endpoint, False, None, "unchecked", None, f"no answer within {CONNECT_TIMEOUT:g} s",
                            f"is the proxy {display(proxy)} up?" if proxy else "is the gateway up, and the URL right?")
    except httpx.ProxyError as exc:
        return GatewayCheck(endpoint, False, None, "unchecked", None, f"the proxy refused: {exc}",
                            f"the proxy {display(proxy)} (HTTPS_PROXY/HTTP_PROXY/ALL_PROXY) would not open a tunnel "
                            "to the gateway; set NO_PROXY for it, or fix the proxy" if proxy else None)
    except httpx.HTTPError as exc:
        refused = cause_in(exc, MetadataRefused)
        if refused is not None:
            return GatewayCheck(endpoint, False, None, "unchecked", None, str(refused))
        failure = cause_in(exc, ssl.SSLCertVerificationError)
        if isinstance(failure, ssl.SSLCertVerificationError):
            return GatewayCheck(endpoint, True, "failed", "unchecked", None, "TLS certificate verification failed",
                                gateway_verify_hint(failure))
        if cause_in(exc, ssl.SSLError) is not None:
            return GatewayCheck(endpoint, True, "failed", "unchecked", None, "TLS handshake failed",
                                "the gateway does not speak TLS there, or only a protocol this Python refuses; "
                                "check the URL's scheme and port")
        if proxy is not None:
            return GatewayCheck(endpoint, False, None, "unchecked", None,
                                f"cannot reach the gateway through the proxy {display(proxy)}",
                                f"the proxy {display(proxy)} (from HTTPS_PROXY/HTTP_PROXY/ALL_PROXY) is down or "
                                "unreachable; fix it, or set NO_PROXY for the gateway's host")
        return GatewayCheck(endpoint, False, None, "unchecked", None,
                            f"cannot connect ({type(exc).__name__})", "is the gateway up, and the host and port right?")
    given = "accepted" if token is not None else "none"
    return judge_models(endpoint, tls, given, status, body, model, has_token=token is not None)


async def check_gateway(endpoints: Sequence[str], *, model: str, token: str | None, log: EventLog,
                        secrets: SecretResolver | None, egress: EgressPolicy | None = None,
                        environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``intelligence`` part of ``agentd check``'s document: ``{"model", "ok", "endpoints": [...]}``.

    The token is resolved here (a reference that does not resolve is a ``ConfigError``, exit 2, like a run's)
    and registered with the log's redactor; it is sent only to the gateway."""
    urls = parse_endpoints(endpoints)
    if urls == [OFFLINE]:
        return {"model": model, "ok": True, "endpoints": [{"endpoint": OFFLINE, "ok": True, "offline": True}]}
    value: str | None = None
    if token is not None:
        resolver = secrets if secrets is not None else SecretResolver(redactor=log.redactor)
        value = resolver.resolve(token)
        log.redactor.add(value)
    environ = os.environ if environ is None else environ
    proxies = ProxyEnv.from_environ(environ)
    results = []
    async with new_client(verify_for(urls), environ=dict(environ), egress=egress) as client:
        for url in urls:
            results.append(await _check_one(client, url, model, value, proxies))
    for result in results:
        log.info("intel.checked", **result.to_json())
    return {"model": model, "ok": all(r.ok for r in results), "endpoints": [r.to_json() for r in results]}
