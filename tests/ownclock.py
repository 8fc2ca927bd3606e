"""The time this test's own thread would have taken on an idle machine: the wall clock minus the time the
thread spent waiting for a CPU.

A bound on how long something took in a test is a bound on the machine's load unless the load is taken out.
The kernel counts, per thread, the time it was ready to run but waiting for a CPU (``run_delay``,
``/proc/thread-self/schedstat``); with the machine's other work queued ahead of it, that is what load adds.
What is left is the thread's own work, and its waits for others (a peer, a sleep, a stall): exactly what a
bound like "the well-behaved client was answered within 3 s while the server was flooded" is about, when the
server and its flood run on this thread. A stall (a task sleeping, a lock held) is not a wait for a CPU, so
it still counts in full. A server in a process of its own is named, and its main thread's waits are taken out
too.

Where the kernel keeps no such count, this is the monotonic clock.
"""

from __future__ import annotations

import time

#: The last wait read from each file: a process that has exited keeps the wait it had (the clock never jumps).
_seen: dict[str, float] = {}


def _run_delay(path: str) -> float:
    try:
        with open(path) as stat:
            _seen[path] = int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    return _seen.get(path, 0.0)


def own_time(*processes: int) -> float:
    """Seconds on this thread's own clock (compare two readings with the same ``processes``): the monotonic
    clock less the thread's total wait for a CPU, and less that of the main thread of each of ``processes``
    (a server in a process of its own, whose thread's work the measured time waits for as well)."""
    waited = _run_delay("/proc/thread-self/schedstat")
    waited += sum(_run_delay(f"/proc/{pid}/schedstat") for pid in processes)
    return time.monotonic() - waited
