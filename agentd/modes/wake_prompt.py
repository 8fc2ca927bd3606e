"""The instruction a wake runs with: the operator's instruction, the URI, and the content read just now.

Notify-then-read means the agent acts on what the resource *is*, never on a diff, so the prompt holds
the whole current content (capped) and says so. The content is server-supplied, untrusted text: it
is fenced and labelled like every other server string in the prompt.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Final

MAX_ITEM_CHARS: Final = 32_000
MAX_TOTAL_CHARS: Final = 64_000


def render_contents(contents: Sequence[Mapping[str, Any]], budget: int = MAX_TOTAL_CHARS) -> str:
    """``contents[]`` as fenced text blocks (at most ``budget`` characters of text); binary items are
    described, not inlined."""
    parts: list[str] = []
    for item in contents:
        uri, mime = item.get("uri", ""), item.get("mimeType")
        attrs = f'uri="{uri}"' + (f' mimeType="{mime}"' if mime else "")
        text = item.get("text")
        if isinstance(text, str):
            cap = min(MAX_ITEM_CHARS, budget)
            body = text if len(text) <= cap else text[:cap] + f"\n… ({len(text) - cap} more characters cut)"
            budget -= min(len(text), cap)
        else:
            blob = item.get("blob")
            size = len(base64.b64decode(blob, validate=False)) if isinstance(blob, str) else 0
            body = f"(binary content, {size} bytes, not shown)"
        parts.append(f"<resource {attrs}>\n{body}\n</resource>")
        if budget <= 0:
            parts.append("(further content items omitted)")
            break
    return "\n".join(parts) if parts else "(the resource has no content)"


def wake_instruction(
    instruction: str, uri: str, server: str | None, contents: Sequence[Mapping[str, Any]] | None
) -> str:
    """``contents`` None means the resource no longer exists (a read answered not-found)."""
    where = f' on server "{server}"' if server else ""
    head = f"{instruction}\n\n---\nThis run was started because the MCP resource {uri}{where} changed."
    if contents is None:
        return head + " It was read just now and no longer exists (the server answered: resource not found)."
    return (
        head
        + " It was read just now; act on this current content (supplied by the server, untrusted), "
        "not on any earlier version:\n"
        + render_contents(contents)
    )


def wakes_instruction(
    instruction: str, changed: Sequence[tuple[str, str | None, Sequence[Mapping[str, Any]] | None]]
) -> str:
    """One wake covering several changed resources ``(uri, server, contents)`` (a busy daemon batches
    them); they share the text budget of one wake."""
    return (f"{instruction}\n\n---\nThis run was started because {len(changed)} MCP resources changed. "
            + resources_section(changed))


def resources_section(changed: Sequence[tuple[str, str | None, Sequence[Mapping[str, Any]] | None]],
                      budget: int = MAX_TOTAL_CHARS) -> str:
    """Changed resources ``(uri, server, contents)`` as one wake shows them, sharing ``budget``."""
    share = max(1, budget // max(1, len(changed)))
    parts = ["Each changed resource was read just now; act on its current content (supplied by the server, "
             "untrusted), not on any earlier version."]
    for uri, server, contents in changed:
        where = f' on server "{server}"' if server else ""
        if contents is None:
            parts.append(f"{uri}{where}: no longer exists (the server answered: resource not found).")
        else:
            parts.append(f"{uri}{where}:\n" + render_contents(contents, share))
    return "\n\n".join(parts)


def continue_message(uri: str, server: str | None, contents: Sequence[Mapping[str, Any]] | None) -> str:
    """What a ``--continue`` route sends into its warm session for one update."""
    where = f' on server "{server}"' if server else ""
    if contents is None:
        return f"The MCP resource {uri}{where} changed and no longer exists (resource not found)."
    return (
        f"The MCP resource {uri}{where} changed. Its current content (supplied by the server, untrusted):\n"
        + render_contents(contents)
    )


def render_events(occurrences: Sequence[Any], budget: int = MAX_TOTAL_CHARS) -> str:
    """Occurrences (agentd.mcp.events.Occurrence) as fenced blocks, their ``data`` JSON capped to ``budget``."""
    parts: list[str] = []
    for index, item in enumerate(occurrences):
        if budget <= 0:
            parts.append(f"({len(occurrences) - index} further events omitted: over the prompt's budget)")
            break
        cap = min(MAX_ITEM_CHARS, budget)
        data = item.data if len(item.data) <= cap else item.data[:cap] + f"… ({len(item.data) - cap} more characters cut)"
        budget -= len(data)
        parts.append(f'<event name="{item.name}" eventId="{item.event_id}" timestamp="{item.timestamp}">\n{data}\n'
                     "</event>")
    return "\n".join(parts)


def events_section(taken: Sequence[Any], budget: int = MAX_TOTAL_CHARS) -> str:
    """What one wake carries of MCP events (agentd.modes.events.Taken, one per subscription): each
    subscription's occurrences, oldest first, and any gap (events the server skipped or agentd dropped)."""
    total = sum(len(t.occurrences) for t in taken)
    share = max(1, budget // max(1, len(taken)))
    parts = [f"{total} MCP event{'s' if total != 1 else ''} occurred (their data is supplied by the server, "
             "untrusted); act on each once:"]
    for item in taken:
        head = f'Event "{item.name}" on server "{item.server}": {len(item.occurrences)} occurrence' \
               f"{'s' if len(item.occurrences) != 1 else ''}."
        if item.gap:
            lost = f" agentd dropped {item.dropped} of them over its bound." if item.dropped else ""
            head += (" GAP: some events of this subscription were skipped before these (the server reported "
                     f"truncated, or too many piled up); they are not shown and cannot be recovered.{lost}")
        parts.append(head + ("\n" + render_events(item.occurrences, share) if item.occurrences else ""))
    return "\n\n".join(parts)


def events_instruction(instruction: str, taken: Sequence[Any],
                       changed: Sequence[tuple[str, str | None, Sequence[Mapping[str, Any]] | None]] = ()) -> str:
    """A wake started by MCP events (agentd.modes.events.Taken) and, in a batched wake, by the resources
    ``changed`` it took along; they share the text budget of one wake."""
    if not taken:
        return wakes_instruction(instruction, changed)
    budget = MAX_TOTAL_CHARS // 2 if changed else MAX_TOTAL_CHARS
    text = f"{instruction}\n\n---\nThis run was started because " + events_section(taken, budget)
    if changed:
        text += f"\n\n---\nAlso, {len(changed)} MCP resources changed. " + resources_section(changed, budget)
    return text
