"""Oversight: the hold a person and the operator have on a running agentd.

The drain latch (SIGTERM: stop taking work, let running work finish; agentd.oversight.drain), the
operator's switches (pause, lame duck, runs by id; agentd.oversight.operator) and the queue of what
waits for a person (tool-call approvals, elicitation; agentd.oversight.approvals).

Nothing is imported here: each part is imported from its module.
"""
