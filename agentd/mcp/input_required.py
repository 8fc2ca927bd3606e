"""What agentd's client does with a 2026-07-28 ``input_required`` result (multi round-trip requests, SEP-2322).

Why it exists: the modern wire has no server-to-client requests. Instead a ``tools/call``, ``resources/read`` or
``prompts/get`` may answer ``resultType: "input_required"`` with ``inputRequests`` (embedded requests, by key)
and an opaque ``requestState``. The client sends the original request again under a new id, with
``inputResponses`` (one answer per key) and the ``requestState`` echoed unchanged, and never puts either into any
other request. :func:`follow_up` turns one result into the next request's params (or says the result is final,
or refuses it), as data; the exchange does the sending, each round under a fresh id.

By default agentd declares no client capabilities, so its answers are the refusals the schema allows:
``elicitation/create`` → ``{"action": "decline"}`` and ``roots/list`` → ``{"roots": []}`` (what the legacy wire
answers too). ``sampling/createMessage`` has no refusal form and any other method is unknown: the call then fails
as a protocol error. Where the host opted the server in (``elicitation``, ``sampling``), the caller answers those
requests itself and hands the answers in (``answers``, by key). A round with only ``requestState`` waits a little before it goes back (the server is still
busy), and the rounds are capped, so a server that never completes cannot hold a call (the call timeout bounds
the whole in time as well).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.mcp.client_session import ResultTypeError, no_roots, result_type

#: The requests a server may answer with ``input_required``; any other one gets a protocol error.
METHODS: Final = frozenset({"tools/call", "resources/read", "prompts/get"})
#: How many follow-up rounds one call may take before it fails.
MAX_ROUNDS: Final = 8
#: The wait before a follow-up that answers nothing (only ``requestState``): doubled per round, capped.
STATE_ONLY_DELAY: Final = 0.05
STATE_ONLY_DELAY_CAP: Final = 0.4
#: The fields a follow-up adds to the original params (dropped from them first, so they never carry over).
_ROUND_FIELDS: Final = ("inputResponses", "requestState")


@attrs.frozen
class FollowUp:
    """Send the request again (under a new id) with ``params``, after ``delay`` seconds."""

    params: dict[str, Any]
    delay: float


def follow_up(method: str, params: Mapping[str, Any] | None, result: Mapping[str, Any], rounds: int,
              answers: Mapping[str, dict[str, Any]] | None = None) -> FollowUp | None:
    """None when ``result`` is final; the next round when the server asked for input (``rounds`` follow-ups
    were sent already). ``answers``: what the caller answered itself, by key (an opted-in elicitation or
    sampling request); the rest get :func:`answer`. Raises :class:`ResultTypeError` when agentd cannot act on the
    result."""
    kind = result.get("resultType", "complete")
    if kind == "task" and method == "tools/call":
        return None  # a task handle (the tasks extension): agentd.client.tasks polls it
    if kind != "input_required":
        result_type(dict(result))  # complete, or an unknown kind (raises)
        return None
    if method not in METHODS:
        raise ResultTypeError(f"input_required is not an answer to {method}")
    if rounds >= MAX_ROUNDS:
        raise ResultTypeError(f"the server still asks for input after {MAX_ROUNDS} rounds")
    requests = result.get("inputRequests")
    state = result.get("requestState")
    if requests is not None and not isinstance(requests, dict):
        raise ResultTypeError("inputRequests must be an object")
    if state is not None and not isinstance(state, str):
        raise ResultTypeError("requestState must be a string")
    out = {k: v for k, v in (params or {}).items() if k not in _ROUND_FIELDS}
    if requests:
        given = answers or {}
        out["inputResponses"] = {key: given[key] if key in given else answer(request)
                                 for key, request in requests.items()}
    if state is not None:
        out["requestState"] = state
    delay = 0.0 if requests else min(STATE_ONLY_DELAY * 2**rounds, STATE_ONLY_DELAY_CAP)
    return FollowUp(out, delay)


def answer(request: Any) -> dict[str, Any]:
    """agentd's answer to one embedded input request (it services none: it declines or answers empty)."""
    method = request.get("method") if isinstance(request, dict) else None
    if method == "elicitation/create":
        return {"action": "decline"}
    if method == "roots/list":
        return no_roots()
    if not isinstance(method, str):
        raise ResultTypeError("an input request without a method")
    raise ResultTypeError(f"the server asked for {method[:64]!r} as input; agentd declares no client capabilities")
