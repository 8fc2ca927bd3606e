"""``agentd top URL``: the live run tree of a serving daemon, drawn in the terminal from its ``/events`` stream.

It connects with trio-websocket (``ws://`` or ``wss://``; an ``http(s)://`` serve URL works too, its path is
replaced by ``/events``), keeps every ``tree.node`` it is sent and the last few event lines, and redraws at
most ten times a second. Keys: ``j``/``k`` or the arrows move, space or enter collapses/expands the selected
node, ``q`` quits. A lost connection is retried with exponential backoff (the one formula in agentd.backoff)
until ``q``. The bearer token, when the daemon wants one, is given as a reference (``--bearer
'{{secret:NAME}}'``), never as a literal. A daemon whose certificate a private CA signed is reached with
``--tls-ca PATH`` (that CA is then the only one trusted); without it the system's trust store decides, and
an untrusted certificate is named on the status line (the connection is retried, as any other failure).

This command is for a person: its stdout is the screen, not a JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import ssl
import sys
import termios
import tty
from collections.abc import Iterator, Sequence
from typing import Any, Final, TextIO
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentd.backoff import exponential
from agentd.terminal.visible import visible_line

REDRAW_INTERVAL: Final = 0.1
RECENT_LINES: Final = 8
RECONNECT_BASE: Final = 0.5
RECONNECT_CAP: Final = 10.0
CONNECT_TIMEOUT: Final = 10.0
#: Bound on the nodes kept (the daemon's snapshot is bounded too).
MAX_NODES: Final = 2000
#: Columns when the terminal does not say (a pipe, a pty without a size).
DEFAULT_WIDTH: Final = 120


def events_url(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"not a ws://, wss://, http:// or https:// URL: {url!r}")
    return urlunsplit((scheme, parts.netloc, "/events", "", ""))


@attrs.define
class View:
    """What the screen shows: the nodes by handle, which are collapsed, the selection, recent lines."""

    nodes: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    collapsed: set[str] = attrs.field(factory=set)
    selected: int = 0
    recent: list[str] = attrs.field(factory=list)
    status: str = "connecting"
    dirty: bool = True

    def take(self, message: dict[str, Any]) -> None:
        if message.get("event") == "tree.node" and isinstance(message.get("handle"), str):
            key = f"{message.get('run_id')}#{message['handle']}"
            self.nodes.pop(key, None)
            self.nodes[key] = message
            while len(self.nodes) > MAX_NODES:
                self.nodes.pop(next(iter(self.nodes)))
        else:
            fields = " ".join(f"{k}={v}" for k, v in message.items()
                              if k not in ("ts", "level", "event", "run_id", "pid", "comp"))[:100]
            self.recent = [*self.recent, f"{message.get('event')} {fields}"][-RECENT_LINES:]
        self.dirty = True

    def rows(self) -> list[tuple[str, dict[str, Any], int]]:
        """The visible nodes in tree order: (key, node, depth)."""
        by_parent: dict[tuple[Any, Any], list[str]] = {}
        for key, node in self.nodes.items():
            by_parent.setdefault((node.get("run_id"), node.get("parent")), []).append(key)
        out: list[tuple[str, dict[str, Any], int]] = []

        def walk(key: str, depth: int) -> None:
            node = self.nodes[key]
            out.append((key, node, depth))
            if key in self.collapsed:
                return
            for child in sorted(by_parent.get((node.get("run_id"), node.get("handle")), []),
                                key=lambda k: _order(self.nodes[k]["handle"])):
                walk(child, depth + 1)

        roots = [k for k, n in self.nodes.items()
                 if n.get("parent") is None or f"{n.get('run_id')}#{n.get('parent')}" not in self.nodes]
        for key in roots:
            walk(key, 0)
        return out

    def key(self, data: bytes) -> bool:
        """Apply a key press; False to quit."""
        rows = self.rows()
        if data in (b"q", b"Q", b"\x03"):
            return False
        if data in (b"j", b"\x1b[B"):
            self.selected = min(self.selected + 1, max(0, len(rows) - 1))
        elif data in (b"k", b"\x1b[A"):
            self.selected = max(0, self.selected - 1)
        elif data in (b" ", b"\r", b"\n") and rows:
            key = rows[min(self.selected, len(rows) - 1)][0]
            self.collapsed.symmetric_difference_update({key})
        self.dirty = True
        return True

    def render(self, width: int = 100, *, color: bool = False) -> str:
        """The whole screen, drawn with rich: a table of the visible nodes and the recent lines. Every string
        from the daemon (handles, statuses, tool names, event fields: model- or server-supplied text among
        them) is shown with its control characters made visible, so none can move the cursor or restyle
        the terminal."""
        out = io.StringIO()
        console = Console(file=out, width=width, color_system="standard" if color else None, no_color=not color,
                          force_terminal=color, highlight=False, emoji=False)
        head = Text("agentd top  ", style="bold")
        head.append(f"[{visible_line(self.status)}]", style="green" if self.status == "connected" else "yellow")
        head.append("  j/k move  space collapse/expand  q quit", style="dim")
        console.print(head)
        table = Table(box=None, expand=False, pad_edge=False, show_edge=False)
        for column, justify in (("handle", "left"), ("status", "left"), ("steps", "right"), ("tokens", "right"),
                                ("elapsed", "right"), ("tools", "left"), ("run", "left")):
            table.add_column(column, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
        for index, (key, node, depth) in enumerate(self.rows()):
            mark = "+" if key in self.collapsed else " "
            pointer = ">" if index == self.selected else " "
            status = str(node.get("status"))
            tone = "green" if status == "completed" else "yellow" if status == "running" else "red"
            elapsed = node.get("elapsed_s")
            tools = node.get("tools") or []
            table.add_row(
                Text(pointer + "  " * depth + mark + visible_line(str(node.get("handle"))),
                     style="reverse" if index == self.selected else ""),
                Text(visible_line(status), style=tone), str(node.get("steps", 0)), str(node.get("tokens", 0)),
                f"{elapsed:.0f} s" if isinstance(elapsed, int | float) else "—",
                Text(visible_line(", ".join(map(str, tools))) if isinstance(tools, list) else "", style="cyan"),
                Text(visible_line(str(node.get("run_id"))), style="dim"))
        console.print(table)
        console.print(Text("recent:", style="bold"))
        for line in self.recent:
            console.print(Text("  " + visible_line(line)), overflow="ellipsis", no_wrap=True)
        return "\x1b[H\x1b[2J" + out.getvalue().replace("\n", "\r\n")


def _order(handle: str) -> list[int]:
    return [int(part) if part.isdigit() else 0 for part in handle.split(".")]


@contextlib.contextmanager
def _raw_terminal(stream: TextIO) -> Iterator[None]:
    """Keys one at a time without echo while the block runs (nothing when stdin is not a terminal)."""
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, termios.error):
        yield
        return
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _follow(url: str, headers: list[tuple[bytes, bytes]], view: View,
                  tls: ssl.SSLContext | None = None) -> None:
    """Receive messages into ``view``, reconnecting with backoff, until cancelled."""
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    attempt = 0
    while True:
        try:
            if url.startswith("wss:"):
                await _tls_probe(url, tls)
            async with open_websocket_url(url, ssl_context=tls, extra_headers=headers,
                                          connect_timeout=CONNECT_TIMEOUT,
                                          disconnect_timeout=CONNECT_TIMEOUT) as ws:
                view.status, view.dirty, attempt = "connected", True, 0
                while True:
                    try:
                        message = json.loads(await ws.get_message())
                    except ValueError:
                        continue
                    if isinstance(message, dict):
                        view.take(message)
        except (OSError, HandshakeError, ConnectionClosed, trio.BrokenResourceError, trio.TooSlowError) as exc:
            attempt += 1
            delay = exponential(attempt, RECONNECT_BASE, RECONNECT_CAP)
            view.status = f"disconnected ({_why(exc)}); retrying in {delay:.1f}s"
            view.dirty = True
            await trio.sleep(delay)


async def _tls_probe(url: str, tls: ssl.SSLContext | None) -> None:
    """A TLS handshake with the daemon, bounded, before the WebSocket's: trio-websocket turns a refused
    certificate into a bare timeout, and a person must see that the certificate is the problem."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    with trio.fail_after(CONNECT_TIMEOUT):
        stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=tls or ssl.create_default_context())
        try:
            await stream.do_handshake()
        finally:
            await trio.aclose_forcefully(stream)


def _why(exc: BaseException) -> str:
    """What a failed connection says on the status line: an untrusted certificate is named as such (the
    TLS error arrives as the cause of trio's ``BrokenResourceError``)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return "certificate not trusted: --tls-ca names the daemon's CA"
        if isinstance(cause, ssl.SSLError):
            return f"TLS: {cause.reason or type(cause).__name__}"
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


async def _keys(view: View, done: trio.CancelScope) -> None:
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while True:
            data = await stream.receive_some(16)
            if not data or not view.key(data):
                done.cancel()
                return


async def _draw(view: View, out: TextIO, color: bool) -> None:
    while True:
        if view.dirty:
            view.dirty = False
            width = (os.get_terminal_size(out.fileno()).columns if out.isatty() else 0) or DEFAULT_WIDTH
            out.write(view.render(width, color=color))
            out.flush()
        await trio.sleep(REDRAW_INTERVAL)


async def run_top(url: str, headers: list[tuple[bytes, bytes]], tls: ssl.SSLContext | None = None, *,
                  color: bool = False) -> int:
    view = View()
    with _raw_terminal(sys.stdin):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_follow, url, headers, view, tls)
            nursery.start_soon(_draw, view, sys.stdout, color)
            nursery.start_soon(_keys, view, nursery.cancel_scope)
    sys.stdout.write("\r\n")
    return 0


def top_main(args: Sequence[str], env: dict[str, str]) -> int:
    from agentd.errors import AgentdError
    from agentd.security.secrets import SecretResolver

    parser = argparse.ArgumentParser(prog="agentd top", description="Draw a serving daemon's live run tree.")
    parser.add_argument("url", help="the daemon's serve URL (http(s)://HOST:PORT/mcp) or its ws(s)://.../events")
    parser.add_argument("--bearer", help="the serve bearer token as '{{secret:NAME}}' or '{{secret-file:PATH}}'")
    parser.add_argument("--tls-ca", metavar="PATH",
                        help="trust this CA bundle (PEM) for a wss:// or https:// daemon instead of the system's")
    options = parser.parse_args(list(args))
    try:
        url = events_url(options.url)
        tls = None
        if options.tls_ca is not None:
            try:
                tls = ssl.create_default_context(cafile=options.tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--tls-ca {options.tls_ca}: cannot load "
                                 f"({getattr(exc, 'strerror', None) or getattr(exc, 'reason', None) or exc})")
        headers: list[tuple[bytes, bytes]] = []
        if options.bearer:
            token = SecretResolver(env).resolve(options.bearer)
            if token == options.bearer:
                raise ValueError("--bearer takes a reference ('{{secret:NAME}}'), not the token itself")
            headers.append((b"authorization", f"Bearer {token}".encode()))
    except (ValueError, AgentdError) as exc:
        sys.stderr.write(json.dumps({"event": "config.invalid", "level": "error", "error": str(exc)}) + "\n")
        return 2
    from agentd.terminal.mode import color_allowed

    return trio.run(functools.partial(run_top, url, headers, tls, color=color_allowed(env) and sys.stdout.isatty()))
