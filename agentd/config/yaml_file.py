"""Reading one agentd YAML file (config, host config, manifest): safe-loaded, strict, one-line errors.

Every agentd file goes through :func:`read_mapping`, so they all refuse the same things the same way: an
unreadable file, invalid YAML (with line and column), a key given twice in one mapping (YAML would keep the
last one silently) and a top level that is not a mapping.
"""

from __future__ import annotations

from typing import Any

import yaml

from agentd.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """``safe_load`` that refuses a key given twice in one mapping (YAML would silently keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable: let the base class report it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_mapping(path: str, what: str) -> dict[Any, Any]:
    """The file's top-level mapping (an empty file is ``{}``); ``what`` starts every error (``--config``).

    Raises:
        ConfigError: ``{what} {path}: cannot read (...)``, ``not valid YAML at line L, column C``, or
            ``the top level must be a mapping``.
    """
    try:
        with open(path, encoding="utf-8") as file:
            raw = yaml.load(file, Loader=_StrictLoader)  # a SafeLoader subclass: safe_load semantics
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        detail = f" ({problem})" if isinstance(problem, str) else ""
        raise ConfigError(f"{what} {path}: not valid YAML{where}{detail}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} {path}: the top level must be a mapping, got {type(raw).__name__} @ $")
    return raw
