"""Reading one agentd YAML file (config, host config, manifest): safe-loaded, strict, bounded, one-line errors.

Every agentd file goes through :func:`read_mapping`, so they all refuse the same things the same way: an
unreadable file, one that is not a regular file (a FIFO would block the reader until someone writes to it), a
file larger than :data:`~agentd.defaults.CONFIG_MAX_BYTES`, invalid YAML (with line and column), aliases that
expand past :data:`~agentd.defaults.CONFIG_MAX_NODES` nodes (a "billion laughs" file: a few lines that stand
for gigabytes once walked), a key given twice in one mapping (YAML would keep the last one silently) and a
top level that is not a mapping.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from agentd import defaults
from agentd.errors import ConfigError


class _TooLarge(yaml.YAMLError):
    """The file's aliases expand past the node bound (or refer to themselves)."""


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

    def compose_document(self) -> yaml.Node | None:
        """The document's node graph, refused when its aliases expand past the bound (before any construction)."""
        node: yaml.Node | None = super().compose_document()
        if node is not None:
            _expanded_size(node, defaults.CONFIG_MAX_NODES)
        return node


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` stands for with every alias expanded (each distinct node sized once)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _TooLarge("an alias refers to the node that contains it")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
                if total > limit:
                    raise _TooLarge(f"its aliases expand past {limit} nodes")
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                total += size(key_node) + size(value_node)
                if total > limit:
                    raise _TooLarge(f"its aliases expand past {limit} nodes")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _read_bounded(path: str) -> str:
    """The file's text: a regular file, at most :data:`~agentd.defaults.CONFIG_MAX_BYTES` (opened without
    blocking, so a FIFO is refused instead of waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory")
        if not stat.S_ISREG(mode):
            raise _NotRegular()
        data = file.read(defaults.CONFIG_MAX_BYTES + 1)
    if len(data) > defaults.CONFIG_MAX_BYTES:
        raise _Oversized()
    return data.decode("utf-8")


class _NotRegular(Exception):
    pass


class _Oversized(Exception):
    pass


def read_mapping(path: str, what: str) -> dict[Any, Any]:
    """The file's top-level mapping (an empty file is ``{}``); ``what`` starts every error (``--config``).

    Raises:
        ConfigError: ``{what} {path}: cannot read (...)``, ``not valid YAML at line L, column C``, or
            ``the top level must be a mapping``.
    """
    try:
        text = _read_bounded(path)
        raw = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe_load semantics
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except _NotRegular:
        raise ConfigError(f"{what} {path}: cannot read (not a regular file)") from None
    except _Oversized:
        raise ConfigError(f"{what} {path}: larger than {defaults.CONFIG_MAX_BYTES} bytes") from None
    except _TooLarge as exc:
        raise ConfigError(f"{what} {path}: refused ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{what} {path}: refused (nested too deeply)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not UTF-8 text") from None
    except ValueError:  # open() refuses a path with a NUL byte
        raise ConfigError(f"{what} {path!r}: cannot read (the path holds a NUL byte)") from None
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
