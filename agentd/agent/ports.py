"""What the loop needs from the MCP pool (and, re-exported, the intelligence): structural types, so the loop is
testable against any implementation and does not care how either is opened.

``agentd.client``'s pool and ``agentd.intelligence``'s client satisfy these (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from agentd.agent.catalogue import ToolLike
from agentd.agent.prompt import ResourceLike
from agentd.intelligence import Intelligence as Intelligence


class ToolResultLike(Protocol):
    @property
    def content(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def is_error(self) -> bool: ...
    @property
    def structured(self) -> Mapping[str, Any] | None: ...


class ToolPool(Protocol):
    """The MCP client pool as the loop uses it."""

    @property
    def connections(self) -> Mapping[str, Any]: ...
    def tools(self) -> Sequence[ToolLike]: ...
    def resources(self) -> Sequence[ResourceLike]: ...
    def instructions(self) -> Mapping[str, str]: ...
    async def call_tool(
        self, server: str, tool: str, arguments: Mapping[str, Any], *, run_id: str, idempotency_key: str,
        resume_task: str | None = None, on_task: Callable[[str], Awaitable[None]] | None = None,
    ) -> ToolResultLike: ...
    async def read_resource(self, uri: str, server: str | None = None) -> Any: ...
