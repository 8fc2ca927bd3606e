"""What a reload may change: :func:`plan_reload` compares the running config with the re-read one.

Why a fixed list: a setting the daemon built its structure on (its mode, its listeners, its state
directory, its cluster) cannot change under running work without a restart, and a reload that
half-applies is worse than none. So a reload is all or nothing: when any setting outside
:data:`RELOADABLE` differs, nothing changes and the answer names those settings.

The reloadable settings apply at the next turn boundary: the model is used from the next model call on;
the per-run limits for runs started after the reload; ``--subscribe`` is re-armed at once (new URIs
subscribed, dropped ones unsubscribed); the log level at once, for every part of the daemon's log. The MCP
servers and the intelligence endpoints are reopened beside the running ones (agentd.run): added and changed
servers are handshaked, and a required one that fails makes the reload fail with nothing changed; then
the next model call and the next turn's catalogue use the new ones, while calls in flight finish on the old.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.config.model import Config, flat_settings

#: Settings a reload applies (by flat name: agentd.config.model.FLAT_NAMES).
RELOADABLE: Final = frozenset({"model", "max_steps", "max_tokens", "deadline", "subscribe", "log_level",
                                "mcp", "intelligence", "intelligence_token", "stream_intelligence"})
#: Settings that are not compared: how this process was asked to read its config, not what it says.
_IGNORED: Final = frozenset({"config_path", "validate_config", "run_id"})


@attrs.frozen
class ReloadPlan:
    """The settings that differ: ``changed`` (all reloadable) and ``refused`` (need a restart)."""

    changed: tuple[str, ...]
    refused: tuple[str, ...]

    @property
    def allowed(self) -> bool:
        return not self.refused


def _fields(cfg: Config) -> Mapping[str, Any]:
    """Every setting by its flat name (the name a reload reports), grouped ones included."""
    return {name: value for name, value in flat_settings(cfg).items() if name not in _IGNORED}


def plan_reload(running: Config, reread: Config) -> ReloadPlan:
    old, new = _fields(running), _fields(reread)
    differ = sorted(name for name in old if old[name] != new[name])
    return ReloadPlan(changed=tuple(n for n in differ if n in RELOADABLE),
                      refused=tuple(n for n in differ if n not in RELOADABLE))


__all__ = ["RELOADABLE", "ReloadPlan", "plan_reload"]
