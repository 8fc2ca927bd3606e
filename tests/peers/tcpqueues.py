"""What the kernel still holds of this network namespace's TCP connections: bytes a program has not read yet.

A test sometimes has to know that a real process has *read* what a peer sent it, not only that the peer sent
it: that a child has taken in the whole stream its model sent before the test cancels it, that a daemon has
taken in every request before the test lets the next step happen. The process cannot be asked; the kernel can.
``/proc/net/tcp`` lists every connection's send queue (bytes not yet acknowledged by the other end) and receive
queue (bytes received that the program has not read). A loopback connection whose ends both show empty queues
has been read to its end by both programs, however slow the machine is.
"""

from __future__ import annotations

import attrs

ESTABLISHED = "01"


@attrs.frozen
class End:
    """One end of an established IPv4 TCP connection: its port, its peer's, and what its queues hold."""

    port: int
    peer: int
    #: Bytes this end sent that the other end has not acknowledged yet.
    unsent: int
    #: Bytes this end received that its program has not read yet.
    unread: int


def ends(port: int) -> list[End]:
    """The established connection ends (IPv4, this network namespace) at ``port`` or talking to it: for a
    loopback connection to a server on ``port``, the server's end and the client's."""
    found = []
    with open("/proc/net/tcp") as table:
        next(table)  # the header line
        for line in table:
            fields = line.split()
            if fields[3] != ESTABLISHED:
                continue
            local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
            if port not in (local, remote):
                continue
            unsent, unread = (int(n, 16) for n in fields[4].split(":"))
            found.append(End(local, remote, unsent, unread))
    return found


def server_has_read(port: int, *, connections: int = 1) -> bool:
    """At least ``connections`` connections are open to the server on ``port``, and the server has read every
    byte its clients sent on them."""
    found = ends(port)
    served = [e for e in found if e.port == port]
    return len(served) >= connections and all(not e.unread for e in served) and \
        all(not e.unsent for e in found if e.peer == port)


def clients_have_read(port: int) -> bool:
    """Every client of the server on ``port`` has read every byte the server sent it (on the connections still
    open)."""
    found = ends(port)
    return all(not e.unsent for e in found if e.port == port) and all(not e.unread for e in found if e.peer == port)
