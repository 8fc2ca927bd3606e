"""Runtime modules: trusted Python code a host names with ``--runtime-module PATH``.

A runtime module may export (snake_case, or the document's camelCase):

* ``tool_adapter`` / ``toolAdapter``: ``list_tools()`` -> tool definitions ``{name, description,
  inputSchema}``; ``execute_tool(call, context)`` -> ``{callId, name, output}`` or ``{callId, name,
  error: {code, message}}``. An ``error`` result is an observation the model may recover from; a raised
  exception fails the step.
* ``connection_credentials`` / ``connectionCredentials``: the credential provider for ``auth: oauth``
  (``get_credential(request)``, optional ``invalidate_credential(request)``; see agentd.connections.auth).
* ``authorize_connection(request)`` / ``authorizeConnection`` and ``authorize_tool(request)`` /
  ``authorizeTool``: host policy binding connections and calls to the current user, tenant and run.
  ``True``/``None``/``{"allowed": true}`` allows; ``False`` or ``{"allowed": false, "reason": ...}`` denies.
* ``http_policy`` / ``httpPolicy`` (optional): when redirects or private destinations are required, the HTTP
  policy for MCP connections: ``{transport, event_hooks, follow_redirects}`` (an ``httpx.AsyncBaseTransport``,
  httpx event hooks, a bool; camelCase accepted), or a function of ``{connection, alias, url}`` returning one
  (None: agentd's default client for that connection). Without it agentd never follows a redirect.

Exports may be objects with methods or plain dicts of functions; functions may be sync or async
(coroutines run on trio). Calls carry ``.id``, ``.name``, ``.input`` (and mapping access); the context
carries the run, step, user and tenant, and a trio cancel scope with the deadline, so an adapter can
honour cancellation (``context.cancel_scope``, ``context.deadline``, ``context.signal``).
The module is loaded only when named and is trusted like the host itself (it can read the environment).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import attrs
import httpx
import trio

from agentd.connections.auth import call_maybe_async, member
from agentd.errors import ConfigError


@attrs.frozen
class AgentTool:
    """An application tool definition (``name``, ``description``, ``inputSchema``)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@attrs.frozen
class ToolCall:
    """A call handed to ``execute_tool``: ``.id``, ``.name``, ``.input`` (also as a mapping)."""

    id: str
    name: str
    input: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return {"id": self.id, "name": self.name, "input": self.input}[key]


@attrs.frozen
class ToolExecutionContext:
    run_id: str
    step_id: str
    user: str | None
    tenant: str | None
    cancel_scope: trio.CancelScope
    deadline: float  # trio time (trio.current_time()); math.inf when unbounded

    @property
    def signal(self) -> trio.CancelScope:
        """The document's ``context.signal``: here the trio cancel scope (``.cancel_called``)."""
        return self.cancel_scope

    @property
    def runId(self) -> str:
        return self.run_id

    @property
    def stepId(self) -> str:
        return self.step_id

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


@attrs.frozen
class ToolOutcome:
    """``execute_tool``'s result, normalized: ``output`` or ``error`` (code, message)."""

    output: Any = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def is_error(self) -> bool:
        return self.error_code is not None or self.error_message is not None

    def text(self) -> str:
        if self.is_error:
            return f"{self.error_code or 'ERROR'}: {self.error_message or ''}".rstrip(": ")
        return self.output if isinstance(self.output, str) else json.dumps(self.output, default=str)


class ApplicationToolFailed(Exception):
    """An application tool raised: the step fails (the document's "throw when the entire step must fail")."""

    def __init__(self, tool: str, exc: BaseException) -> None:
        super().__init__(f"application tool {tool!r} failed: {type(exc).__name__}: {exc}")
        self.tool = tool


@attrs.frozen
class Decision:
    allowed: bool
    reason: str | None = None


@attrs.define(eq=False)
class RuntimeModule:
    """What one loaded module offers (every member optional)."""

    path: str | None = None
    tool_adapter: Any = None
    connection_credentials: Any = None
    authorize_connection: Any = None
    authorize_tool: Any = None
    http_policy: Any = None
    _tools: list[AgentTool] | None = None

    async def list_tools(self) -> list[AgentTool]:
        if self.tool_adapter is None:
            return []
        if self._tools is None:
            function = member(self.tool_adapter, "list_tools", "listTools")
            if not callable(function):
                raise ConfigError(f"runtime module {self.path}: tool_adapter has no list_tools()")
            raw = await call_maybe_async(function)
            self._tools = [_tool(item, index, self.path) for index, item in enumerate(raw or [])]
        return list(self._tools)

    async def execute(self, call: ToolCall, context: ToolExecutionContext) -> ToolOutcome:
        function = member(self.tool_adapter, "execute_tool", "executeTool")
        if not callable(function):
            raise ApplicationToolFailed(call.name, RuntimeError("tool_adapter has no execute_tool()"))
        try:
            result = await call_maybe_async(function, call, context)
        except trio.Cancelled:
            raise
        except Exception as exc:
            raise ApplicationToolFailed(call.name, exc) from exc
        return _outcome(result)

    async def authorize(self, which: str, request: Mapping[str, Any]) -> Decision:
        function = self.authorize_connection if which == "connection" else self.authorize_tool
        if function is None:
            return Decision(True)
        verdict = await call_maybe_async(function, _Request(dict(request)))
        if verdict is None or verdict is True:
            return Decision(True)
        if verdict is False:
            return Decision(False)
        allowed = member(verdict, "allowed", "allow")
        reason = member(verdict, "reason", "message")
        return Decision(bool(allowed), str(reason) if reason is not None else None)


class _Request(dict[str, Any]):
    """A request handed to an authorize callback: a dict that also reads as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _tool(item: Any, index: int, path: str | None) -> AgentTool:
    name = member(item, "name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"runtime module {path}: tool_adapter.list_tools()[{index}] has no name")
    description = member(item, "description") or ""
    schema = member(item, "inputSchema", "input_schema") or {"type": "object", "properties": {}}
    if not isinstance(schema, Mapping):
        raise ConfigError(f"runtime module {path}: tool {name!r}: inputSchema must be an object")
    return AgentTool(name, str(description), dict(schema))


def _outcome(result: Any) -> ToolOutcome:
    error = member(result, "error")
    if error is not None:
        code = member(error, "code")
        message = member(error, "message")
        return ToolOutcome(error_code=str(code) if code is not None else "ERROR",
                           error_message=str(message) if message is not None else "")  # fmt: skip
    return ToolOutcome(output=member(result, "output"))


_EXPORTS = {
    "tool_adapter": ("tool_adapter", "toolAdapter"),
    "connection_credentials": ("connection_credentials", "connectionCredentials"),
    "authorize_connection": ("authorize_connection", "authorizeConnection"),
    "authorize_tool": ("authorize_tool", "authorizeTool"),
    "http_policy": ("http_policy", "httpPolicy"),
}


def load_runtime_module(path: str | None) -> RuntimeModule:
    """Import the module at ``path`` (a ``.py`` file) under a private name; None means no module.

    Raises:
        ConfigError: missing file, or an import that fails (the module's own error, named).
    """
    if path is None:
        return RuntimeModule()
    if not os.path.isfile(path):
        raise ConfigError(f"--runtime-module {path}: no such file")
    name = f"agentd_runtime_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--runtime-module {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ConfigError(f"--runtime-module {path}: import failed ({type(exc).__name__}: {exc})") from None
    return _from_module(module, path)


def _from_module(module: ModuleType, path: str) -> RuntimeModule:
    found: dict[str, Any] = {}
    for field, names in _EXPORTS.items():
        for name in names:
            if hasattr(module, name):
                found[field] = getattr(module, name)
                break
    for field in ("authorize_connection", "authorize_tool"):
        if field in found and not callable(found[field]):
            raise ConfigError(f"--runtime-module {path}: {field} must be a function")
    return RuntimeModule(path=path, **found)


def http_client_factory(
    policy: Any, *, connection: str, alias: str, url: str, verify: Any = True
) -> Callable[[], httpx.AsyncClient] | None:
    """The client factory a connection uses under the module's HTTP policy (None: the default client)."""
    if policy is None:
        return None
    if callable(policy) and not isinstance(policy, Mapping):
        policy = policy(_Request({"connection": connection, "alias": alias, "url": url}))
        if policy is None:
            return None
    transport = member(policy, "transport")
    hooks = member(policy, "event_hooks", "eventHooks")
    follow = member(policy, "follow_redirects", "followRedirects")
    if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
        raise ConfigError(f"http_policy for {alias!r}: transport must be an httpx.AsyncBaseTransport")
    if hooks is not None and not isinstance(hooks, Mapping):
        raise ConfigError(f"http_policy for {alias!r}: event_hooks must be a mapping of lists")

    def factory() -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=transport,
            event_hooks={k: list(v) for k, v in hooks.items()} if hooks else None,
            follow_redirects=bool(follow),
            verify=verify,
            trust_env=False,
            timeout=httpx.Timeout(None),
        )

    return factory


def tool_names(tools: Sequence[AgentTool]) -> list[str]:
    return [tool.name for tool in tools]
