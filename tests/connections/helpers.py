"""Write host/manifest files and run ``agentd run`` in process (stdout captured, events streamed to it)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from agentd.connections.cli import prepare, run_prepared


@attrs.frozen
class Outcome:
    code: int
    doc: dict[str, Any]
    events: list[dict[str, Any]]
    raw: str

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def files(tmp_path: Path, host: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[str]:
    return [str(write(tmp_path, "agent.yaml", manifest)), "--config", str(write(tmp_path, "host.yaml", host))]


async def run(
    tmp_path: Path,
    host: Mapping[str, Any],
    manifest: Mapping[str, Any],
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Outcome:
    argv = [*files(tmp_path, host, manifest), "--stream", "--run-id", "run-1", *args]
    prepared = prepare(argv, dict(env or {}))
    out = io.StringIO()
    result = await run_prepared(prepared, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return Outcome(int(result.run.exit_code), lines[-1], lines[:-1], out.getvalue())


def connection(url: str, **extra: Any) -> dict[str, Any]:
    return {"driver": "mcp", "transport": "streamable-http", "url": url, **extra}
