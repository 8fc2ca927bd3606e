"""Each package's public names, pinned (trio's ``test_exports`` pattern).

A package's public surface is its ``__all__``: every name there must resolve, and the list itself is pinned here, so adding or removing a public name is a visible, reviewed change
(update :data:`PINNED` and the docs that describe the surface). Packages that are only folders of modules
(``agentd.mcp``, ``agentd.supervisor``, …) export nothing themselves: their modules are the surface.
"""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import agentd

PINNED: dict[str, list[str]] = {
    "agentd": ["Config", "RunResult", "RunStatus", "__version__", "load_config", "main"],
    "agentd.client": [
        "EraCache", "McpPool", "ResourceContents", "ResourceInfo", "ResourceTemplateInfo", "ResourceUpdated",
        "ResponseStreamBroken", "ServerConnection", "ToolInfo", "ToolResult", "Tuning", "open_mcp_pool",
        "process_era_cache",
    ],
    "agentd.config": ["Config", "McpServerConfig", "TlsConfig", "load_config", "parse_duration"],
    "agentd.telemetry": [
        "NOOP", "Span", "SpanKind", "child_settings", "content_allowed", "context_of", "current_span", "disable",
        "enable", "enabled", "flush", "inject", "log_ids", "mark_error", "remote_parent", "run_exporter", "span",
        "start_span",
    ],
    "agentd.intelligence": [
        "OFFLINE", "OFFLINE_MODEL_NAME", "WIRE_NAME", "Breaker", "BreakerState", "ChatTool", "GatewayError",
        "Intelligence", "ModelReply", "ToolCall", "ToolNameMap", "Usage", "completions_url", "example_value",
        "open_intelligence", "release_idle",
    ],
}


def _packages() -> list[str]:
    found = ["agentd"] + [f"agentd.{m.name}" for m in pkgutil.iter_modules(agentd.__path__) if m.ispkg]
    return sorted(found)


def test_every_package_is_pinned_or_a_folder_of_modules() -> None:
    for name in _packages():
        module = importlib.import_module(name)
        if name in PINNED:
            assert sorted(module.__all__) == sorted(PINNED[name]), name
        else:
            assert not hasattr(module, "__all__"), f"{name} grew an __all__: pin it in PINNED"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_exported_name_resolves(name: str) -> None:
    module = importlib.import_module(name)
    for attribute in module.__all__:
        assert getattr(module, attribute) is not None, f"{name}.{attribute}"


@pytest.mark.parametrize("name", [n for n in _packages() if n not in PINNED])
def test_folders_of_modules_define_nothing_public(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        key for key, value in vars(module).items()
        if not key.startswith("_") and not isinstance(value, types.ModuleType) and key != "annotations"
    }
    assert public == set(), f"{name} defines public names {sorted(public)}: move them into a module or pin them"
