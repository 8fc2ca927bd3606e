"""The values the MCP client hands to the rest of agentd (docs/architecture.md § MCP client)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class ToolInfo:
    """One tool of one server. Descriptions and annotations are server-controlled, untrusted text."""

    server: str
    name: str
    description: str | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    title: str | None = None
    #: ``execution.taskSupport``: ``required`` tools are called as tasks (agentd.mcp.tasks).
    task_support: str = "forbidden"


@attrs.frozen
class ResourceInfo:
    server: str
    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None


@attrs.frozen
class ResourceTemplateInfo:
    """Informational only: templates are never subscribed to."""

    server: str
    uri_template: str
    name: str
    description: str | None = None
    mime_type: str | None = None


@attrs.frozen
class ToolResult:
    """A tool's answer. ``is_error`` is an observation for the model, not a fault."""

    content: list[dict[str, Any]]
    is_error: bool
    structured: dict[str, Any] | None = None


@attrs.frozen
class ResourceContents:
    """Every ``contents[]`` item of a read: text in ``text``, binary base64 in ``blob``."""

    server: str
    uri: str
    contents: list[dict[str, Any]]


@attrs.frozen
class ResourceUpdated:
    """A watched resource changed (or may have, after a reconnect): re-read it. Carries no payload."""

    server: str
    uri: str
    synthesized: bool = False
