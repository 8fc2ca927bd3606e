"""load_config: defaults < config file < environment (AGENTD_ wins over AGENT_) < flags."""

from pathlib import Path

import attrs
import pytest

from agentd.config import Config
from agentd.config.load import load_config
from agentd.errors import ConfigError

BASE = ["--instruction", "do it", "--intelligence", "test"]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_defaults_match_the_original() -> None:
    cfg = load_config(BASE, env={})
    assert (cfg.budgets.max_steps, cfg.budgets.max_tokens, cfg.budgets.deadline, cfg.subagents.max_depth) == (50, 200_000, 600.0, 4)
    assert (cfg.subagents.max_children, cfg.subagents.max_total, cfg.budgets.token_ceiling) == (8, 64, 2_000_000)
    assert (cfg.ladder.drain_timeout, cfg.budgets.tokens_lifetime, cfg.modes.debounce, cfg.modes.max_concurrent_wakes) == (
        25.0, 0, 0.25, 4)
    assert (cfg.mode, cfg.intelligence.model, cfg.telemetry.log_level, cfg.telemetry.log_content) == ("once", "default", "info", False)
    assert cfg.modes.poll_interval is None and cfg.mcp == () and cfg.config_path is None
    assert cfg.run_id  # time + pid + a random tag
    assert load_config(BASE, env={}).run_id != cfg.run_id  # two Configs in one process: two runs


def test_every_layer_in_order(tmp_path: Path) -> None:
    config = write(tmp_path / "a.yaml", "max_steps: 10\nmax_tokens: 1000\nmodel: from-file\ndeadline: 1m\n")
    env = {"AGENTD_MAX_TOKENS": "2000", "AGENT_MODEL": "from-env", "AGENTD_DEADLINE": "90s"}
    cfg = load_config([*BASE, "--config", config, "--deadline", "250ms"], env=env)
    assert cfg.budgets.max_steps == 10  # file over default
    assert cfg.budgets.max_tokens == 2000  # env over file
    assert cfg.intelligence.model == "from-env"  # AGENT_ alias
    assert cfg.budgets.deadline == 0.25  # flag over env
    assert cfg.config_path == config


def test_agentd_prefix_wins_over_agent_alias() -> None:
    cfg = load_config(BASE, env={"AGENT_MAX_STEPS": "3", "AGENTD_MAX_STEPS": "4"})
    assert cfg.budgets.max_steps == 4


def test_budget_tokens_env_spellings() -> None:
    assert load_config(BASE, env={"AGENT_BUDGET_TOKENS": "77"}).budgets.tokens_lifetime == 77
    env = {"AGENT_BUDGET_TOKENS": "77", "AGENT_BUDGET_TOKENS_LIFETIME": "88"}
    assert load_config(BASE, env=env).budgets.tokens_lifetime == 88
    assert load_config([*BASE, "--budget-tokens-lifetime", "9"], env=env).budgets.tokens_lifetime == 9
    env = {"AGENT_BUDGET_TOKENS": "77", "AGENTD_BUDGET_TOKENS": "66"}
    assert load_config(BASE, env=env).budgets.tokens_lifetime == 66


def test_flag_only_settings_ignore_the_environment() -> None:
    env = {"AGENTD_MAX_DEPTH": "9", "AGENTD_MCP": "x=https://x", "AGENTD_SUBSCRIBE": "file:///x",
           "AGENTD_INTERVAL": "5"}
    cfg = load_config(BASE, env=env)
    assert cfg.subagents.max_depth == 4 and cfg.mcp == () and cfg.modes.subscribe == () and cfg.modes.interval is None


def test_config_path_from_env(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", "max_steps: 5\n")
    assert load_config(BASE, env={"AGENTD_CONFIG": config}).budgets.max_steps == 5


def test_empty_env_value_is_unset(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", "model: from-file\n")
    assert load_config([*BASE, "--config", config], env={"AGENTD_MODEL": ""}).intelligence.model == "from-file"


def test_instruction_and_intelligence_from_env() -> None:
    cfg = load_config([], env={"AGENTD_INSTRUCTION": "hello", "AGENT_INTELLIGENCE": "https://a/v1,https://b/v1"})
    assert cfg.instruction == "hello" and cfg.intelligence.endpoints == ("https://a/v1", "https://b/v1")


def test_booleans() -> None:
    assert load_config([*BASE, "--log-content"], env={}).telemetry.log_content
    assert load_config(BASE, env={"AGENTD_LOG_CONTENT": "yes"}).telemetry.log_content
    assert not load_config([*BASE, "--no-log-content"], env={"AGENTD_LOG_CONTENT": "1"}).telemetry.log_content
    with pytest.raises(ConfigError, match=r"\$AGENTD_LOG_CONTENT: expected true or false, got 'maybe'"):
        load_config(BASE, env={"AGENTD_LOG_CONTENT": "maybe"})


def test_bad_values_name_their_origin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--max-steps: expected a whole number, got 'ten'$"):
        load_config([*BASE, "--max-steps", "ten"], env={})
    with pytest.raises(ConfigError, match=r"^\$AGENT_DEADLINE: not a duration"):
        load_config(BASE, env={"AGENT_DEADLINE": "soon"})
    config = write(tmp_path / "c.yaml", "max_steps: '10'\n")
    with pytest.raises(ConfigError, match=r"c\.yaml \$\.max_steps: expected a whole number"):
        load_config([*BASE, "--config", config], env={})


def test_instruction_file(tmp_path: Path) -> None:
    path = write(tmp_path / "i.txt", "from a file\n")
    cfg = load_config(["--instruction-file", path, "--intelligence", "test"], env={})
    assert cfg.instruction == "from a file\n" and cfg.instruction_file == path
    with pytest.raises(ConfigError, match="mutually exclusive"):
        load_config([*BASE, "--instruction-file", path], env={})
    # A flag-level instruction file replaces an instruction from the environment.
    cfg = load_config(["--instruction-file", path, "--intelligence", "test"], env={"AGENTD_INSTRUCTION": "x"})
    assert cfg.instruction == "from a file\n"
    with pytest.raises(ConfigError, match="empty"):
        load_config(["--instruction-file", write(tmp_path / "e.txt", " \n"), "--intelligence", "test"],
                         env={})


def test_intelligence_token_forms(tmp_path: Path) -> None:
    cfg = load_config([*BASE, "--intelligence-token", "{{secret:GW}}"], env={"GW": "value-1234"})
    assert cfg.intelligence.token == "{{secret:GW}}"
    token = write(tmp_path / "tok", "value-1234\n")
    cfg = load_config([*BASE, "--intelligence-token-file", token], env={})
    assert cfg.intelligence.token == f"{{{{secret-file:{token}}}}}"
    # A literal in the environment is fine (the environment is a secret store); the Config keeps a reference.
    cfg = load_config(BASE, env={"AGENTD_INTELLIGENCE_TOKEN": "sk-live-abcdefghijklmnop"})
    assert cfg.intelligence.token == "{{secret:AGENTD_INTELLIGENCE_TOKEN}}"
    assert "sk-live" not in repr(cfg)


def test_run_id_flag_and_env() -> None:
    assert load_config([*BASE, "--run-id", "job-42"], env={}).run_id == "job-42"
    assert load_config(BASE, env={"AGENT_RUN_ID": "pod-7"}).run_id == "pod-7"
    with pytest.raises(ConfigError, match="--run-id"):
        load_config([*BASE, "--run-id", "has space"], env={})


def test_no_abbreviations() -> None:
    # a suggestion, never a guess: the prefix is still an error
    with pytest.raises(ConfigError, match=r"unknown flag --max-step \(did you mean --max-steps\?\);"):
        load_config([*BASE, "--max-step", "3"], env={})


def test_unknown_arguments_never_echo_values() -> None:
    with pytest.raises(ConfigError) as info:
        load_config([*BASE, "--intelligence-tokn", "sk-live-abcdefghijklmnop", "stray"], env={})
    assert "--intelligence-tokn" in str(info.value) and "sk-live" not in str(info.value)
    assert "2 unexpected arguments" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config([*BASE, "--api-key=sk-live-abcdefghijklmnop"], env={})
    assert str(info.value) == "unknown flag --api-key (see agentd --help)"


def test_config_round_trips_through_cattrs() -> None:
    """The supervisor ships a Config to children as JSON; every field type must (un)structure."""
    import json

    import cattrs

    cfg = load_config([*BASE, "--mcp", "a=http://127.0.0.1:1/m", "--mode", "reactive", "--subscribe",
                            "file:///x", "--poll-interval", "2s"], env={})
    converter = cattrs.Converter()
    assert converter.structure(json.loads(json.dumps(converter.unstructure(cfg))), Config) == cfg


def test_with_changes_revalidates() -> None:
    from agentd.config.load import with_changes

    cfg = load_config(BASE, env={})
    assert with_changes(cfg, {}, budgets=attrs.evolve(cfg.budgets, max_steps=3)).budgets.max_steps == 3
    with pytest.raises(ConfigError, match="--subscribe"):
        with_changes(cfg, {}, mode="reactive")
