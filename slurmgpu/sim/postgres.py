"""A throwaway PostgreSQL server for tests and benchmarks: Debian's ``postgresql`` package
(``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/<version>/bin``), one data directory
in a private temporary directory, reached over a unix socket in that directory only (no
TCP port, nothing to collide with).

Tuned for tests, not for data: ``fsync``, ``full_page_writes`` and ``synchronous_commit``
are off (a crash of the machine loses the server, which is thrown away anyway). The
cluster is made with ``--locale=C`` so text sorts by bytes, as SQLite's does.

As root the server runs as the ``postgres`` user (which the package creates): PostgreSQL
refuses to run as root. Its directory is owned by that user.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from slurmgpu.errors import SimError

_PREFIX = "slurmgpu-pg-"
_PORT = 5432  # (names the socket file; nothing listens on TCP)
_OWNER_FILE = "owner.json"
_SETTINGS = {
    "listen_addresses": "''",
    "port": str(_PORT),
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "max_connections": "300",
    "shared_buffers": "'64MB'",
    "log_min_messages": "warning",
}


class PostgresNotAvailable(SimError):
    """PostgreSQL's server programs are not installed here (or cannot be run)."""


def bindir() -> Path:
    """Where initdb and pg_ctl are: the newest ``/usr/lib/postgresql/<version>/bin``
    (Debian's), else the directory of ``initdb`` on ``$PATH``."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _version(p.parent.name),
                        reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for path in candidates:
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise PostgresNotAvailable("no initdb/pg_ctl in /usr/lib/postgresql/*/bin or on $PATH "
                               "(apt-get install postgresql)")


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return (0,)


def _run_as() -> str | None:
    """The user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresNotAvailable("running as root and there is no 'postgres' user to run the "
                                   "server as") from None
    return "postgres"


class PgServer:
    """One server: ``up()``, ``create_database()`` (a URL for it), ``down()``."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.bin = bindir()
        self.user = _run_as()
        self.dir = Path(directory) if directory is not None else Path(
            tempfile.mkdtemp(prefix=_PREFIX, dir="/tmp"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._databases = 0

    # ------------------------------------------------------------------ life cycle

    def up(self, timeout_s: float = 60.0) -> float:
        """initdb and start; returns the seconds it took."""
        began = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / _OWNER_FILE).write_text(json.dumps({"owner_pid": os.getpid()}))
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.dir.chmod(0o700)
        if not (self.data / "PG_VERSION").is_file():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync",
                      "--locale=C", "--encoding=UTF8", timeout_s=timeout_s)
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(f"unix_socket_directories = '{self.dir}'\n")
                conf.writelines(f"{key} = {value}\n" for key, value in _SETTINGS.items())
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t",
                  str(int(timeout_s)), "start", timeout_s=timeout_s + 5)
        return time.monotonic() - began

    def down(self, *, purge: bool = True) -> None:
        """Stop the server (immediately: its data is thrown away) and, with ``purge``,
        remove its directory."""
        if (self.data / "postmaster.pid").is_file():
            with contextlib.suppress(PostgresNotAvailable):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout_s=60)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, program: str, *args: str, timeout_s: float) -> None:
        argv = [str(self.bin / program), *args]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  check=False, cwd=self.dir)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresNotAvailable(f"{program}: {exc}") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            if self.log.is_file():
                tail += self.log.read_text(errors="replace").strip().splitlines()[-5:]
            raise PostgresNotAvailable(f"{program} failed (exit {proc.returncode}): {' | '.join(tail)}")

    # ------------------------------------------------------------------ databases

    def url(self, database: str = "postgres") -> str:
        """A libpq URL for ``database`` on this server (over its unix socket)."""
        return f"postgresql:///{database}?host={self.dir}&port={_PORT}&user=postgres"

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database; returns its URL."""
        import psycopg

        self._databases += 1
        name = name or f"t{os.getpid()}_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, closing any connection still open to it."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reap_stale(pattern: str = _PREFIX + "*") -> None:
    """Stop servers left behind by killed test sessions (their owner process is gone)."""
    for path in Path("/tmp").glob(pattern):
        try:
            owner = int(json.loads((path / _OWNER_FILE).read_text())["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(PostgresNotAvailable):
                PgServer(path).down()
