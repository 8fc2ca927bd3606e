"""Lone UTF-16 surrogates: the one rule for every string that enters agentd as JSON.

JSON lets a peer write ``"\\ud800"``, which decodes to a Python ``str`` that no UTF-8 encoder accepts: the
first frame, event line or reply that tries to encode it raises ``UnicodeEncodeError`` far from the request
that carried it. So the rule is applied once, where JSON text is decoded:

* ``"reject"`` (what agentd serves: JSON-RPC bodies from its peers): the whole message is refused with a
  ``-32700`` parse error, so nothing a peer asked for runs with a string agentd could not send on.
* ``"replace"`` (what agentd consumes: MCP servers' responses, model replies, its children's frames): every
  lone surrogate becomes U+FFFD, so content is kept and never lost to a crash.

Nesting too deep for the decoder is a ``ValueError``, never a ``RecursionError``. Under ``"reject"`` (the
requests agentd serves) nesting is bounded further, to :data:`MAX_DEPTH` levels: a request the decoder
accepted could still be too deep for whatever walks it recursively later (``json.dumps``, jsonschema,
``repr``) in a handler, far from the peer that sent it.

A well-formed surrogate *pair* (``"\\ud83d\\ude00"``) is one ordinary character and is untouched. Encoding
(:func:`utf8`, :func:`dumps_utf8`) replaces whatever lone surrogate may still reach it from elsewhere (argv,
files) instead of raising. No I/O here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal, TypeAlias

Policy: TypeAlias = Literal["reject", "replace"]

REPLACEMENT: Final = "\ufffd"
#: Deepest nesting of arrays and objects accepted in a request agentd serves (the ``"reject"`` policy).
MAX_DEPTH: Final = 512
_LONE: Final = re.compile("[\ud800-\udfff]")
#: A ``\\u`` escape of a surrogate in JSON text (may over-match after an escaped backslash: then we only look).
_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")


class LoneSurrogate(ValueError):
    """A string in the JSON holds a lone UTF-16 surrogate (raised under the ``"reject"`` policy)."""


def has_lone_surrogate(text: str) -> bool:
    return _LONE.search(text) is not None


def scrub(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (the same object when there is none)."""
    return _LONE.sub(REPLACEMENT, text) if _LONE.search(text) else text


#: DEL and the C1 controls: JSON allows them raw in a string, and ``ensure_ascii=False`` leaves them raw, but on
#: a terminal U+009B is a CSI, as good as ESC ``[``.
_RAW_CONTROLS: Final = re.compile("[\x7f-\x9f]")


def escape_controls(json_text: str) -> str:
    """JSON text with DEL and every C1 control as a ``\\u00NN`` escape (the same JSON value): for JSON that a
    terminal may show (the result document on stdout, event lines on stderr). C0 controls are escaped by
    :func:`json.dumps` already. Outside strings JSON has no such characters, so the text stays valid."""
    return _RAW_CONTROLS.sub(lambda m: f"\\u{ord(m[0]):04x}", json_text) if _RAW_CONTROLS.search(json_text) else json_text


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate becomes U+FFFD instead of raising."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return scrub(text).encode("utf-8")


def dumps_utf8(obj: Any, **kwargs: Any) -> bytes:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` as UTF-8 bytes, never raising on a lone surrogate."""
    return utf8(json.dumps(obj, ensure_ascii=False, **kwargs))


#: ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))`` built once (json.dumps builds an encoder per call).
_COMPACT: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def compact(obj: Any) -> str:
    """``obj`` as compact JSON text (no spaces, non-ASCII kept): what agentd puts on the wire."""
    return _COMPACT.encode(obj)


def compact_utf8(obj: Any) -> bytes:
    """:func:`compact` as UTF-8 bytes, never raising on a lone surrogate."""
    return utf8(_COMPACT.encode(obj))


def loads(data: bytes | bytearray | str, policy: Policy) -> Any:
    """Decode JSON text and apply ``policy`` to every string in it, keys included.

    Raises ``ValueError`` for anything that is not JSON (``UnicodeDecodeError`` for bytes that are not
    UTF-8, :class:`LoneSurrogate` under ``"reject"``, ``json.JSONDecodeError`` otherwise; nesting too deep
    for the decoder is reported as a ``ValueError`` too, never a ``RecursionError``).
    """
    # Strict: json.loads(bytes) would decode with "surrogatepass", letting raw surrogate bytes through.
    if isinstance(data, bytes | bytearray):
        # JSON text opening with ``{``/``[`` then a non-NUL byte is UTF-8 (what json.detect_encoding concludes)
        utf8_text = data[:1] in (b"{", b"[") and data[1:2] != b"\x00"
        text = bytes(data).decode("utf-8" if utf8_text else json.detect_encoding(data))
    else:
        text = data
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    # What agentd serves is bounded in depth too (a walk about as costly as the decoding, so not on every
    # large answer agentd consumes); only text with that many brackets can be that deep.
    if (policy == "reject" and text.count("[") + text.count("{") > MAX_DEPTH
            and depth(obj, limit=MAX_DEPTH) > MAX_DEPTH):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    if _ESCAPE.search(text) is None and _LONE.search(text) is None:
        return obj
    return apply(obj, policy)


def depth(obj: Any, *, limit: int | None = None) -> int:
    """How deeply arrays and objects nest in ``obj`` (0 for a scalar), level by level without recursion;
    with ``limit``, it stops at the first level past it (and returns that level)."""
    deepest, level = 0, [obj] if isinstance(obj, list | dict) else []
    while level:
        deepest += 1
        if limit is not None and deepest > limit:
            return deepest
        below: list[Any] = []
        for node in level:
            below.extend([v for v in (node.values() if type(node) is dict else node)
                          if type(v) is list or type(v) is dict])
        level = below
    return deepest


def _fix(value: str, policy: Policy) -> str:
    if _LONE.search(value) is None:
        return value
    if policy == "reject":
        raise LoneSurrogate("a string holds a lone UTF-16 surrogate")
    return _LONE.sub(REPLACEMENT, value)


def apply(obj: Any, policy: Policy) -> Any:
    """Walk ``obj`` without recursion (the decoder accepts deeper nesting than Python's stack)."""
    if isinstance(obj, str):
        return _fix(obj, policy)
    stack: list[Any] = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = _fix(item, policy)
                elif isinstance(item, list | dict):
                    stack.append(item)
        elif isinstance(node, dict):
            for key in [k for k in node if _LONE.search(k) is not None]:
                node[_fix(key, policy)] = node.pop(key)
            for key, item in node.items():
                if isinstance(item, str):
                    node[key] = _fix(item, policy)
                elif isinstance(item, list | dict):
                    stack.append(item)
    return obj
