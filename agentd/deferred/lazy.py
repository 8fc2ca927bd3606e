"""One rule for a package's lazily resolved exports (PEP 562 module ``__getattr__``).

Why: ``agentd``, ``agentd.client`` and ``agentd.intelligence`` name public things whose modules are costly
(httpx, the daemon) and which a subagent or an offline run never touches; each export is imported on first
use and then cached in the package's namespace, so the lookup runs once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, table: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``table`` maps each export to the module that defines it."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
