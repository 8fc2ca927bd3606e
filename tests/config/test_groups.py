"""Config's groups (agentd/config/model.py): every flag has one place, and the outward names stay the flags'.

The flags, the environment, the config file, a reload, ``--validate-config``, a run's ``config_digest`` and a
child's wire config all speak a setting's flat name (the flag's ``dest``); ``FLAT_NAMES`` is the one map from
that name to its group and field.
"""

from __future__ import annotations

import json

import attrs

from agentd.config.argv import FLAGS
from agentd.config.load import load_config
from agentd.config.model import (
    FLAT_NAMES,
    GROUPS,
    BudgetsConfig,
    Config,
    IntelligenceConfig,
    flat_settings,
    flattened,
    from_flat,
    nested,
)
from agentd.run import settings_of
from agentd.supervisor.wiring import config_from_wire, config_to_wire

#: Flags the loader folds into other settings (a server's tags, era, capabilities and approvals; a token file).
FOLDED = {"a2a_peer_tags", "approve", "intelligence_token_file", "mcp_capabilities", "mcp_era", "mcp_tags"}
ARGV = ["--instruction", "x", "--intelligence", "test", "--max-steps", "7", "--serve-mcp", "http://127.0.0.1:0/mcp",
        "--serve-max-sessions", "9", "--log-level", "debug", "--mode", "reactive", "--subscribe", "test://a",
        "--max-subagents", "3", "--budget-tokens-lifetime", "100", "--drain-timeout", "3s", "--model", "m1"]


def test_every_flag_of_agentd_has_one_place() -> None:
    top = {f.name for f in attrs.fields(Config) if f.name not in GROUPS}
    dests = {flag.dest for flag in FLAGS if "agentd" in flag.commands} - FOLDED
    assert sorted(d for d in dests if d not in top and d not in FLAT_NAMES) == []
    assert not top & set(FLAT_NAMES.keys() - GROUPS.keys())  # a name is flat or grouped, never both
    for name, (group, field) in FLAT_NAMES.items():
        assert field in attrs.fields_dict(GROUPS[group]), name
    assert len(set(FLAT_NAMES.values())) == len(FLAT_NAMES)  # one flat name per place


def test_a_flag_lands_in_its_group() -> None:
    cfg = load_config(ARGV, env={})
    assert (cfg.budgets.max_steps, cfg.serve.max_sessions, cfg.telemetry.log_level) == (7, 9, "debug")
    assert (cfg.subagents.max_total, cfg.budgets.tokens_lifetime, cfg.ladder.drain_timeout) == (3, 100, 3.0)
    assert (cfg.intelligence.endpoints, cfg.intelligence.model, cfg.modes.subscribe) == (("test",), "m1",
                                                                                         ("test://a",))


def test_flat_names_round_trip() -> None:
    cfg = load_config(ARGV, env={})
    flat = flat_settings(cfg)
    assert flat["max_steps"] == 7 and flat["serve_max_sessions"] == 9 and flat["cluster"] is None
    assert from_flat(flat) == cfg
    doc = attrs.asdict(cfg)
    assert nested(flattened(doc)) == doc


def test_from_flat_takes_whole_groups_and_flat_names() -> None:
    """A harness's ``from_flat(settings)``: a group given whole, then a flat setting of it on top."""
    cfg = from_flat({"instruction": "x", "intelligence": IntelligenceConfig(endpoints=("test",), model="m"),
                     "max_steps": 3, "budgets": BudgetsConfig(max_tokens=5), "cluster": None})
    assert (cfg.intelligence.endpoints, cfg.intelligence.model) == (("test",), "m")
    assert (cfg.budgets.max_steps, cfg.budgets.max_tokens, cfg.cluster.dsn) == (3, 5, None)
    other = from_flat({"intelligence": ("test",), "model": "m"})
    assert (other.intelligence.endpoints, other.intelligence.model) == (("test",), "m")


def test_outward_names_stay_flat() -> None:
    """A run's config_digest and a child's wire config name settings as the flags do (a journal written
    before the grouping resumes with the same digest)."""
    cfg = load_config(ARGV, env={})
    settings = settings_of(cfg)
    assert settings["max_steps"] == 7 and settings["serve_max_sessions"] == 9 and "budgets" not in settings
    json.dumps(settings, default=str)
    wire = json.loads(json.dumps(dict(config_to_wire(cfg))))
    assert wire["max_steps"] == 7 and wire["cluster"] is None and "serve" not in wire
    assert config_from_wire(wire) == attrs.evolve(cfg, allow_trifecta=False)
