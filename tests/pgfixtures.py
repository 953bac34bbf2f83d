"""Fixtures for tests that run the store on a real PostgreSQL server (``slurmgpu.sim.postgres``).

tests/conftest.py star-imports this module (only the names in ``__all__``).

- ``pg_server`` (session): one server (Debian's ``postgresql`` package: initdb + pg_ctl,
  as the ``postgres`` user when the tests run as root) in ``/tmp/slurmgpu-pg-<random>``,
  reached over a unix socket there; up in ~1.5 s, stopped at the end. Without PostgreSQL
  or psycopg the tests that need it skip, but under ``$CI`` they fail: CI must not
  silently skip them.
- ``pg_url`` (function): a new, empty database on that server (~50 ms), dropped after the
  test; its ``postgresql://`` URL.
- ``store_url`` (function, parametrized ``sqlite`` / ``postgresql``): what a test gives
  ``Store()`` or ``[collector] db``: a file in ``tmp_path``, or ``pg_url``. The
  ``postgresql`` cases carry the ``postgresql`` mark (``-m "not postgresql"`` leaves
  them out).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

from slurmgpu.sim.postgres import PgServer, PostgresNotAvailable, reap_stale

__all__ = ["BACKENDS", "pg_server", "pg_url", "store_url"]

#: The store's backends, as ``store_url`` is parametrized.
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)]


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):  # CI installs PostgreSQL: a skip would hide failures
        pytest.fail(f"PostgreSQL unavailable under CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    """The session's PostgreSQL server (see the module docstring)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install -e '.[postgres]')")
    reap_stale()
    try:
        server = PgServer()
        server.up()
    except PostgresNotAvailable as exc:
        _unavailable(str(exc))
    yield server
    # Keep the directory (its server.log) when something failed.
    server.down(purge=request.session.testsfailed == 0)


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A new, empty database on the session's server (dropped after the test)."""
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(Path(urlsplit(url).path).name)


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The fleet database of a test, on each backend: a file, or a PostgreSQL URL."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    url: str = request.getfixturevalue("pg_url")
    return url
