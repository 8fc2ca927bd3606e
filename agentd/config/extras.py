"""The optional extras a setting needs, found before anything runs.

Why here: ``--otel`` and ``--cluster`` import their libraries (OpenTelemetry, psycopg) only once tracing or
the cluster starts, long after sockets were opened and a run began; a missing package then surfaced as an
unexpected ``ModuleNotFoundError`` and exit 1. Validation asks instead whether each module *could* be
imported (``importlib.util.find_spec``: a file look-up, nothing is executed) and refuses the configuration
with exit 2 and the line that installs the extra.
"""

from __future__ import annotations

import importlib.util
from typing import Final, Literal

from agentd.errors import ConfigError

Extra = Literal["otel", "cluster"]

#: The distribution the extras belong to (``pip install 'agentd-trio[otel]'``).
DISTRIBUTION: Final = "agentd-trio"
#: The modules each extra of pyproject.toml provides that agentd imports.
MODULES: Final[dict[Extra, tuple[str, ...]]] = {
    "otel": ("opentelemetry.trace", "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.common"),
    "cluster": ("psycopg",),
}


def importable(module: str) -> bool:
    """Could ``module`` be imported? Its parent packages are imported to find it (for the modules above:
    namespace packages, nothing else); the module itself is not."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(extra: Extra) -> str | None:
    """The first module of ``extra`` that cannot be imported, or ``None``."""
    return next((module for module in MODULES[extra] if not importable(module)), None)


def require(extra: Extra, what: str) -> None:
    """Raise the exit-2 :class:`ConfigError` when ``what`` (``--otel``) cannot work for want of ``extra``."""
    module = missing(extra)
    if module is not None:
        raise ConfigError(f"{what} needs the optional [{extra}] packages ({module} cannot be imported); "
                          f"install them with: pip install '{DISTRIBUTION}[{extra}]'")
