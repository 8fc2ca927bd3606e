"""The environment layer: ``AGENTD_<FLAG>`` (wins) or ``AGENT_<FLAG>``, for every flag the table marks.

Flags the original agentd keeps flag-only (``--mcp``, ``--subscribe``, ``--continue``, ``--interval``,
``--max-depth``, ``--instruction-file``, ...) have no variable. An empty variable counts as unset, so
``AGENTD_MODEL=`` in a unit file does not override the config file with an empty model name.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from agentd.config.argv import FLAGS, Flag


@attrs.frozen
class EnvValue:
    """One setting read from the environment, with the variable it came from (for error messages)."""

    flag: Flag
    variable: str
    value: str


def read_env(env: Mapping[str, str]) -> dict[str, EnvValue]:
    """The settings the environment supplies, by dest."""
    found: dict[str, EnvValue] = {}
    for flag in FLAGS:
        for variable in flag.env_names:
            value = env.get(variable)
            if value is not None and value.strip() != "":
                found[flag.dest] = EnvValue(flag, variable, value)
                break
    return found
