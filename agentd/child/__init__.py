"""The child program: what ``python -m agentd`` runs as a subagent (``AGENT_SUBAGENT=1``), on the far side of the
control channel from agentd.supervisor.

- :mod:`agentd.child.entry`: :func:`child_main`, the fork server or one session;
- :mod:`agentd.child.session`: one session: the control reader, the turn loop;
- :mod:`agentd.child.context`: what a turn runner gets; :mod:`agentd.child.parent`: watching the parent;
- :mod:`agentd.child.turn`: a real turn, one agent-loop run (agentd.run) configured from the run payload;
- :mod:`agentd.child.scripted`: the scripted turns the supervisor's process-boundary tests ask for;
- :mod:`agentd.child.forkserver`: the fork server's own blocking loop, which forks children pre-imported.

Nothing here is imported by the parent side: the supervisor starts this program and talks to it in frames.
"""
