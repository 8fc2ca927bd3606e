"""A throwaway PostgreSQL server for the tests: ``initdb`` + ``pg_ctl`` from the installed binaries.

Why our own (not pytest-postgresql): the suite runs as root here, and PostgreSQL refuses to run as root; this
helper runs the server as the ``postgres`` system user then (``runuser``), in a private temporary directory,
on a free loopback port, with password (SCRAM) authentication over TCP so the tests exercise the password path.
Durability is switched off (``fsync=off``): the tests check agentd's transactions, not the disk.

``stop()`` / ``start()`` are there for the tests that lose the database mid-run. Each test gets a fresh
database (:meth:`PgServer.new_database`) on the worker's one server. The multi-host tests (tests/multihost) start
a server of their own that also listens on the root namespace's address on a test network (``listen``) and
lets that network's hosts log in with the password (``allow``: their subnet in ``pg_hba.conf``).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping

import attrs

from tests.peers import launch

#: The superuser the tests connect as, and its password (test-only).
USER = "agentd"
PASSWORD = "s3cret-pg-pass"
_counter = itertools.count()


def bindir() -> str | None:
    """The PostgreSQL binaries: ``pg_config --bindir``, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("pg_config")
    if found:
        try:
            out = subprocess.run([found, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            path = out.stdout.strip()
            if os.path.exists(os.path.join(path, "initdb")):
                return path
        except (OSError, subprocess.SubprocessError):
            pass
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(candidates[-1]) if candidates else None


@attrs.define
class PgServer:
    bin: str
    root: str
    port: int
    _as_user: list[str] = attrs.field(factory=list)
    #: Addresses the server listens on (the first one is the DSN's host).
    listen: tuple[str, ...] = ("127.0.0.1",)
    #: Subnets (CIDR) besides loopback whose hosts may log in with the password.
    allow: tuple[str, ...] = ()
    #: Server settings ``name=value`` over the defaults below (the benches' ``fsync=on``, say).
    settings: tuple[str, ...] = ()

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._as_user, *argv], capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)

    def init(self) -> None:
        pwfile = os.path.join(self.root, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD + "\n")
        if self._as_user:
            shutil.chown(pwfile, "postgres")
        done = self._run(os.path.join(self.bin, "initdb"), "-D", self.data, "-U", USER, "--pwfile", pwfile,
                         "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr[-2000:]}")
        os.unlink(pwfile)
        if self.allow:
            with open(os.path.join(self.data, "pg_hba.conf"), "a") as hba:
                hba.writelines(f"host all all {cidr} scram-sha-256\n" for cidr in self.allow)

    def start(self) -> None:
        options = (f"-c port={self.port} -c listen_addresses={','.join(self.listen)} -c unix_socket_directories={self.root} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
                   + "".join(f" -c {setting}" for setting in self.settings))
        done = self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-o", options, "-w", "-t", "60",
                         "-l", os.path.join(self.root, "log"), "start")
        if done.returncode != 0:
            log = open(os.path.join(self.root, "log")).read()[-2000:] if os.path.exists(
                os.path.join(self.root, "log")) else ""
            raise RuntimeError(f"pg_ctl start failed: {done.stderr[-1000:]} {log}")

    def stop(self, mode: str = "fast") -> None:
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = self._run(os.path.join(self.bin, "psql"), "-h", self.root, "-p", str(self.port), "-U", USER,
                         "-d", database, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr}")
        return done.stdout

    def new_database(self) -> str:
        name = f"t{os.getpid()}_{next(_counter)}"
        self.psql(f"CREATE DATABASE {name}")
        return name

    def dsn(self, database: str, *, password: bool = False) -> str:
        secret = f":{PASSWORD}" if password else ""
        return f"postgresql://{USER}{secret}@{self.listen[0]}:{self.port}/{database}"

    def env(self) -> Mapping[str, str]:
        """The standard PG environment that carries the password (never in the DSN)."""
        return {"PGPASSWORD": PASSWORD}

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_server(listen: tuple[str, ...] = ("127.0.0.1",), allow: tuple[str, ...] = (),
                 settings: tuple[str, ...] = ()) -> PgServer:
    """A fresh server on ``listen`` (raises RuntimeError when no PostgreSQL is installed or it does not start)."""
    path = bindir()
    if path is None:
        raise RuntimeError("PostgreSQL is not installed (no pg_config, no /usr/lib/postgresql/*/bin); "
                           "scripts/test installs it")
    root = tempfile.mkdtemp(prefix="agentd-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        pwd.getpwnam("postgres")
        os.chmod(root, 0o700)
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    server = PgServer(path, root, launch.free_port(), as_user, listen, allow, settings)
    try:
        server.init()
        server.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return server
