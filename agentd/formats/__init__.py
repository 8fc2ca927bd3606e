"""The formats of the strings agentd mints and writes.

Run ids and tool-call idempotency keys (agentd.formats.ids), the ``__`` between a connection's and
its tool's name (agentd.formats.tool_separator), and the one rule for lone surrogates in JSON text
(agentd.formats.jsontext).

Nothing is imported here: each part is imported from its module.
"""
