"""agentd: an MCP-native agent daemon on trio.

``trio.run(agentd.main, agentd.load_config(argv))`` is exactly what the command line does.

The exports are resolved lazily (PEP 562): a subagent re-exec imports ``agentd`` on its start-up path
and must not pay for the daemon, httpx, jsonschema or the distribution metadata it does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.deferred.lazy import lazy_exports

if TYPE_CHECKING:
    from agentd._version import __version__ as __version__
    from agentd.agent.result import RunResult as RunResult
    from agentd.agent.result import RunStatus as RunStatus
    from agentd.config.load import load_config as load_config
    from agentd.config.model import Config as Config
    from agentd.daemon import main as main

__all__ = ["Config", "RunResult", "RunStatus", "__version__", "load_config", "main"]

_LAZY = {
    "__version__": "agentd._version",
    "Config": "agentd.config.model",
    "load_config": "agentd.config.load",
    "main": "agentd.daemon",
    "RunResult": "agentd.agent.result",
    "RunStatus": "agentd.agent.result",
}


__getattr__ = lazy_exports("agentd", _LAZY, globals())
