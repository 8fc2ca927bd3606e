"""agentd: an MCP-native agent daemon on trio.

``trio.run(agentd.main, agentd.Config.from_argv(argv))`` is exactly what the command line does.

The exports are resolved lazily (PEP 562): a subagent re-exec imports ``agentd`` on its start-up path
and must not pay for the daemon, httpx, jsonschema or the distribution metadata it does not use. For the
same reason httpx's optional command-line client is kept out (below).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from agentd.lazy import lazy_exports

# httpx's package imports its own command-line client (click, rich, pygments: more than half of ``import httpx``)
# whenever those happen to be installed; agentd never uses it. A ``None`` entry makes that optional import fail
# at once, exactly as where they are not installed (httpx then defines a stub ``httpx.main``). Only before httpx
# is first imported, so a process that already has the real one keeps it.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

if TYPE_CHECKING:
    from agentd._version import __version__ as __version__
    from agentd.config.model import Config as Config
    from agentd.daemon import main as main
    from agentd.loop.result import RunResult as RunResult
    from agentd.loop.result import RunStatus as RunStatus

__all__ = ["Config", "RunResult", "RunStatus", "__version__", "main"]

_LAZY = {
    "__version__": "agentd._version",
    "Config": "agentd.config",  # the package attaches Config.from_argv
    "main": "agentd.daemon",
    "RunResult": "agentd.loop.result",
    "RunStatus": "agentd.loop.result",
}


__getattr__ = lazy_exports("agentd", _LAZY, globals())
