"""Every default has one home, agentd/defaults.py: the values that own behaviour and Config agree with it."""

from __future__ import annotations

import attrs

from agentd import defaults
from agentd.config import Config
from agentd.modes.router import Router
from agentd.selfmcp.surface import SelfMcpLimits
from agentd.supervisor.caps import Caps
from agentd.supervisor.ladder import Graces
from agentd.supervisor.liveness import LivenessSettings
from agentd.supervisor.supervisor import SupervisorSettings


def _default(cls: type, name: str) -> object:
    return {f.name: f for f in attrs.fields(cls)}[name].default


def test_owners_and_config_share_the_defaults() -> None:
    config = Config()
    assert Graces() == Graces(defaults.CANCEL_GRACE, defaults.EOF_GRACE, defaults.TERM_GRACE)
    assert (config.ladder.cancel_grace, config.ladder.term_grace) == (Graces().cancel, Graces().term)
    caps = Caps()
    assert (config.subagents.max_depth, config.subagents.max_children, config.subagents.max_total, config.budgets.token_ceiling) == (
        caps.max_depth, caps.max_children, caps.max_subagents, caps.token_ceiling)
    assert (config.modes.debounce, config.modes.max_concurrent_wakes) == (
        _default(Router, "debounce"), _default(Router, "max_concurrent"))
    limits = SelfMcpLimits()
    assert (config.serve.max_spawns, config.serve.max_warm, config.serve.retention, config.ladder.cancel_grace) == (
        limits.max_concurrent_spawns, limits.max_warm, limits.retention, limits.cancel_grace)
    liveness = LivenessSettings()
    assert (config.ladder.pong_timeout, config.ladder.progress_timeout) == (liveness.pong_timeout, liveness.progress_timeout)
    assert config.ladder.drain_timeout == SupervisorSettings().drain_timeout == defaults.DRAIN_TIMEOUT


def test_help_text_quotes_the_defaults() -> None:
    from agentd.config.argv import FLAGS_BY_DEST

    assert "(default 5s)" in FLAGS_BY_DEST["cancel_grace"].help
    assert "(default 250ms)" in FLAGS_BY_DEST["debounce"].help
    assert f"(default {defaults.MAX_CHILDREN})" in FLAGS_BY_DEST["max_children"].help
