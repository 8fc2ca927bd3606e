"""Operator controls of a running daemon: pause/resume, lame duck, cancel by run id, status, reload.

:mod:`agentd.oversight.operator` (a leaf) holds the state the daemon's parts consult (the loop at each turn boundary, the
daemon modes before a new run, readiness); :mod:`agentd.ctl.server` serves it on a local Unix socket;
:mod:`agentd.ctl.cli` is ``agentd ctl``; :mod:`agentd.ctl.reload` decides what a re-read config may change.
"""
