"""A2A (Agent2Agent protocol): peers a run delegates to (client side) and the wire values both sides share.

``types`` is I/O-free; ``client`` fetches cards and speaks JSON-RPC over httpx. The ``a2a.*`` control
tools are in :mod:`agentd.agent.a2a`; the served side is :mod:`agentd.selfmcp.a2a`. See docs/a2a.md.
"""
