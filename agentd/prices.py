"""Model prices and money, as exact integers: what a reply cost and how a US-dollar amount is written.

Why integers: a tree's money budget is reserved, charged and refunded through the same ledger as its token
ceiling (agentd.journal.ledger), across processes and restarts; a float sum would drift with every reply and
could not be compared with the budget exactly. Money is counted in *picodollars* (10^-12 USD): a price is
given in US dollars per million tokens, so a price of ``P`` dollars per million tokens is ``P * 10^6``
picodollars per token, a whole number for any price written with up to six decimal places. A reply's cost,
``prompt * input + completion * output``, is then exact, and so is every sum of costs. Decimal is used only
to read what a person wrote (``--price``, ``--budget-usd``, ``prices:``), never to add, and never on a step:
an amount is written out as dollars with integer arithmetic (:func:`usd`, :func:`usd_text`), since every step's
``loop.step`` event carries the run's cost.

A leaf (no agentd imports but :mod:`agentd.errors`): the config, the loop and the supervisor all use it.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from typing import Final

import attrs

from agentd.errors import ConfigError

#: Picodollars in one US dollar.
PICO_PER_USD: Final = 10**12
#: Picodollars per token for a price of one US dollar per million tokens.
_PER_TOKEN: Final = PICO_PER_USD // 10**6
#: Decimal places a price (dollars per million tokens) may have: beyond them a price is not a whole number of
#: picodollars per token.
PRICE_PLACES: Final = 6
#: Decimal places a budget (dollars) may have.
USD_PLACES: Final = 12
#: The name of the money budget: what a usage report answers when it is spent (agentd.agent.runner), the cap a
#: spawn refusal names, the ``loop.budget`` event's ``budget``.
BUDGET_USD: Final = "budget_usd"


@attrs.frozen
class Price:
    """One model's price, in picodollars per token (``--price MODEL=IN/OUT`` gives dollars per million)."""

    input: int
    output: int

    def cost(self, prompt_tokens: int, completion_tokens: int) -> int:
        """What a reply of that many tokens cost, in picodollars (exact; a negative count costs nothing). Two
        integer products on every priced step: no Decimal, no lookup (the run's meter holds its model's price)."""
        return ((prompt_tokens * self.input if prompt_tokens > 0 else 0)
                + (completion_tokens * self.output if completion_tokens > 0 else 0))


def _decimal(text: str | int | float, what: str, places: int) -> int:
    """``text`` (a non-negative decimal amount) times ``10**places``, exactly, or a ConfigError (``what``, when
    given, leads its message)."""
    lead = f"{what}: " if what else ""
    if isinstance(text, bool):
        raise ConfigError(f"{lead}expected a number of US dollars, got {text!r}")
    raw = str(text).strip().removeprefix("$")
    try:
        value = decimal.Decimal(raw)
    except decimal.InvalidOperation:
        raise ConfigError(f"{lead}expected a number of US dollars, got {raw!r}") from None
    if not value.is_finite() or value < 0:
        raise ConfigError(f"{lead}expected a non-negative number of US dollars, got {raw!r}")
    scaled = value.scaleb(places)
    if scaled != scaled.to_integral_value():
        raise ConfigError(f"{lead}{raw} has more than {places} decimal places")
    return int(scaled)


def parse_usd(text: str | int | float, what: str = "--budget-usd") -> int:
    """A US-dollar amount (``2.50``, ``$2.5``) in picodollars."""
    return _decimal(text, what, USD_PLACES)


def price_of(per_million: str | int | float, what: str) -> int:
    """Dollars per million tokens, in picodollars per token."""
    return _decimal(per_million, what, PRICE_PLACES) * (_PER_TOKEN // 10**PRICE_PLACES)


def parse_price_flag(item: str) -> tuple[str, Price]:
    """``MODEL=IN/OUT`` (dollars per million input / output tokens)."""
    model, sep, rest = item.partition("=")
    model = model.strip()
    if not sep or not model:
        raise ConfigError(f"--price: expected MODEL=IN/OUT (dollars per million tokens), got {item!r}")
    given, slash, out = rest.partition("/")
    if not slash:
        raise ConfigError(f"--price {model}: expected IN/OUT (dollars per million input / output tokens)")
    return model, Price(price_of(given, f"--price {model} input"), price_of(out, f"--price {model} output"))


def parse_price_table(raw: object, where: str) -> dict[str, Price]:
    """A config file's ``prices: {MODEL: {input: X, output: Y}}``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping of model names to {{input, output}}")
    table: dict[str, Price] = {}
    for model, entry in raw.items():
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"{where}: a model name must be a non-empty string")
        if not isinstance(entry, Mapping) or set(entry) != {"input", "output"}:
            raise ConfigError(f"{where}.{model}: expected {{input: DOLLARS, output: DOLLARS}} (per million tokens)")
        table[model] = Price(price_of(entry["input"], f"{where}.{model}.input"),
                             price_of(entry["output"], f"{where}.{model}.output"))
    return table


def usd(picodollars: int) -> float:
    """Picodollars as the JSON number of dollars: the float nearest the exact decimal amount (Python's true
    division of two integers is correctly rounded, so this is ``float(Decimal(picodollars) / 10**12)``, without
    the Decimal)."""
    return picodollars / PICO_PER_USD


def usd_text(picodollars: int) -> str:
    """Picodollars as dollars for a person (``0.000123``): trailing zeros dropped."""
    whole, part = divmod(abs(picodollars), PICO_PER_USD)
    sign = "-" if picodollars < 0 else ""
    return f"{sign}{whole}.{part:012d}".rstrip("0").rstrip(".") if part else f"{sign}{whole}"
