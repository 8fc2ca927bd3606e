"""The sans-io MCP core: JSON-RPC messages, SSE framing, versions, and the session state machines.

Nothing in this package performs I/O or imports trio, httpx, h11 or any other I/O library (a test pins that). The trio
adapters in :mod:`agentd.transport` carry it over HTTP, as a client and as a server. Both roles share one
set of rules (``versions``, ``meta``, ``streamable_http``, ``jsonrpc``, ``sse``); the two session modules
add only their state machines (docs/architecture.md, "The sans-io core").
"""
