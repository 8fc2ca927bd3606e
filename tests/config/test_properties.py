"""Whatever the input, building a Config either succeeds or raises one ConfigError line; nothing else."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentd.config.argv import FLAGS
from agentd.config.load import load_config
from agentd.errors import ConfigError

FLAG_NAMES = [flag.name for flag in FLAGS if flag.name not in ("--instruction-file", "--config")]
VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "-1", "5s", "250ms", "soon", "test", "https://a/v1", "http://127.0.0.1:1/x",
                     "http://example.com", "a=https://a", "=x", "{{secret:X}}", "{{secret:}}", "sk-abcdefghijklmnop",
                     "reactive", "schedule", "* * * * *", "file:///x", "debug", "true"]),
    st.text(max_size=12),
)


def build(argv: list[str], env: dict[str, str]) -> None:
    try:
        load_config(argv, env=env)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FLAG_NAMES), VALUES), max_size=6))
def test_random_flags(pairs: list[tuple[str, str]]) -> None:
    argv = ["--instruction", "x", "--intelligence", "test"]
    for name, value in pairs:
        argv += [f"{name}={value}"]
    build(argv, {"X": "value"})


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from([f.name.removeprefix("--").replace("-", "_").upper() for f in FLAGS]),
                       VALUES, max_size=5))
def test_random_environment(values: dict[str, str]) -> None:
    build(["--instruction", "x", "--intelligence", "test"], {f"AGENTD_{k}": v for k, v in values.items()})


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                         st.text(max_size=10), VALUES)
yaml_values = st.recursive(yaml_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3)), max_leaves=8)
server = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["a", "b", ""]), yaml_scalars), "url": VALUES},
    optional={"required": yaml_scalars, "headers": st.dictionaries(st.sampled_from(["X-A", "Accept", "bad name"]),
                                                                   yaml_scalars, max_size=2),
              "tls": yaml_values, "connect_timeout": yaml_scalars, "bogus": yaml_scalars},
)
document = st.dictionaries(
    st.sampled_from(["mcp_servers", "max_steps", "mode", "intelligence", "deadline", "log_content", "subscribe",
                     "unknown_key", "serve_mcp", "model"]),
    st.one_of(yaml_values, st.lists(server, max_size=3)), max_size=5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document)
def test_random_config_files(doc: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "agentd.yaml"
        path.write_text(yaml.safe_dump(doc))
        build(["--instruction", "x", "--intelligence", "test", "--config", str(path)], {"X": "value"})


@settings(max_examples=60, deadline=None)
@given(file=st.none() | st.integers(1, 99), agent=st.none() | st.integers(1, 99),
       agentd=st.none() | st.integers(1, 99), flag=st.none() | st.integers(1, 99))
def test_precedence_is_a_total_order(file: int | None, agent: int | None, agentd: int | None,
                                     flag: int | None) -> None:
    """defaults < file < AGENT_ < AGENTD_ < flag, for any combination of layers that set the value."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--instruction", "x", "--intelligence", "test"]
        if file is not None:
            path = Path(tmp) / "c.yaml"
            path.write_text(f"max_tokens: {file}\n")
            argv += ["--config", str(path)]
        env = {}
        if agent is not None:
            env["AGENT_MAX_TOKENS"] = str(agent)
        if agentd is not None:
            env["AGENTD_MAX_TOKENS"] = str(agentd)
        if flag is not None:
            argv += ["--max-tokens", str(flag)]
        expected = next((v for v in (flag, agentd, agent, file) if v is not None), 200_000)
        assert load_config(argv, env=env).budgets.max_tokens == expected
