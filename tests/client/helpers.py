"""Shared bits of the client tests: an event recorder and server configs."""

from __future__ import annotations

from typing import Any

from agentd.config.model import McpServerConfig
from agentd.telemetry.events import EventLog


class Events:
    """An EventLog sink that keeps every line (debug and up)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.log = EventLog(sink=self.lines.append, level="debug", run_id="test-run")

    def named(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]


def server(url: str, name: str = "s", **options: Any) -> McpServerConfig:
    return McpServerConfig(name, url, **options)
