"""``--price``, ``--budget-usd`` and ``--models`` through the one loader: flags over the config file's
``prices:``/``models:``/``budget_usd:``, and a money budget that cannot be priced refused (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.config.load import load_config
from agentd.errors import ConfigError
from agentd.prices import PICO_PER_USD, Price

BASE = ["--instruction", "do it", "--intelligence", "test", "--model", "big"]


def refused(*argv: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config([*BASE, *argv], env={})
    return str(info.value)


def test_flags_and_the_config_file_give_prices_models_and_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text("prices:\n  big: {input: 3, output: 15}\n  small: {input: 0.25, output: 1.25}\n"
                    "models: [small]\nbudget_usd: 2.5\n")
    cfg = load_config([*BASE, "--config", str(path), "--price", "big=2/10"], env={})
    assert cfg.intelligence.prices == {"big": Price(2_000_000, 10_000_000), "small": Price(250_000, 1_250_000)}
    assert cfg.intelligence.models == ("small",) and cfg.budgets.usd == 5 * PICO_PER_USD // 2
    assert cfg.price() == Price(2_000_000, 10_000_000)
    cfg = load_config([*BASE, "--models", "a, b", "--models", "c", "--price", "big=1/1"], env={})
    assert cfg.intelligence.models == ("a", "b", "c") and cfg.price() is None  # a, b and c have no price: no cost claimed


def test_a_money_budget_over_an_unpriced_model_is_a_config_error() -> None:
    assert "--budget-usd: model 'big' has no price" in refused("--budget-usd", "1")
    assert "model 'small' has no price" in refused("--budget-usd", "1", "--price", "big=1/1", "--models", "small")
    assert "--budget-usd must be more than 0" in refused("--budget-usd", "0", "--price", "big=1/1")
    assert "--budget-usd: expected a number of US dollars" in refused("--budget-usd", "lots")
    assert "--price: 'big' given twice" in refused("--price", "big=1/1", "--price", "big=2/2")


def test_a_bad_prices_section_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text("prices:\n  big: {input: 3}\n")
    assert "$.prices.big: expected {input: DOLLARS, output: DOLLARS}" in refused("--config", str(path))
