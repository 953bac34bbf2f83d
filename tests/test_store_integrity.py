"""Issue 12 item 8: a damaged fleet database is refused at start with one line naming the
file and what to do, and is never written to, wiped or re-initialised. (Damaged files are
SQLite's; the checks at open run on both backends.)"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgpu.collector.store import SCHEMA_VERSION, Store, StoreError, queries
from slurmgpu.collector.store.backend import dialect_of, is_postgres


def fill(target: str | Path) -> None:
    with contextlib.closing(Store(target)) as store:
        with store.transaction():
            store.db.executemany("INSERT INTO nodes (node, first_seen, last_seen) VALUES (?, 1, 1)",
                                 [(f"n{i:05d}",) for i in range(3000)])
        if not is_postgres(target):
            store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def populated(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    fill(path)
    return path


def refused(path: Path, match: str) -> None:
    before = path.read_bytes()
    with pytest.raises(StoreError, match=match) as err:
        Store(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value) and "move it aside" in str(err.value)
    assert path.read_bytes() == before  # never written, never wiped


def test_a_zero_byte_file_is_refused_not_reinitialised(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    path.write_bytes(b"")
    refused(path, "empty")


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    path.write_bytes(b"this is not sqlite\n" * 100)
    refused(path, "not a usable database")


def test_mid_file_corruption_is_refused(tmp_path: Path) -> None:
    path = populated(tmp_path)
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(2 * page, len(data) - page, 3 * page):  # trash interior pages, keep the header
        data[offset + 100: offset + 400] = b"\xff" * 300
    path.write_bytes(bytes(data))
    refused(path, "integrity check failed|not a usable database")


def test_a_dropped_table_is_refused(store_url: str) -> None:
    fill(store_url)
    with contextlib.closing(Store(store_url)) as store, store.transaction() as db:
        db.execute("DROP TABLE messages")
    if not is_postgres(store_url):
        refused(Path(store_url), "messages missing")
        return
    with pytest.raises(StoreError, match="messages missing") as err:
        Store(store_url)
    assert "\n" not in str(err.value) and "move it aside" in str(err.value)
    with queries.snapshot(store_url) as db:  # never written, never re-initialised
        assert db.execute("SELECT count(*) FROM nodes").fetchone()[0] == 3000
        assert "messages" not in dialect_of(db).tables(db)


def test_the_collector_refuses_a_damaged_database_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    path.write_bytes(b"")
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "slurmgpu", "keys", "init", "--dir", str(keys)],
                   capture_output=True, check=True, timeout=60)
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "collector", "--db", str(path),
                           "--keys-dir", str(keys), "--bind", "tcp://127.0.0.1:0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "empty" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert path.read_bytes() == b""


def test_a_healthy_database_reopens(store_url: str) -> None:
    fill(store_url)
    store = Store(store_url)
    assert store.db.execute("SELECT count(*) FROM nodes").fetchone()[0] == 3000
    assert store.schema_version() == SCHEMA_VERSION
    store.close()


def test_an_unreachable_postgresql_is_one_line_without_its_password() -> None:
    url = "postgresql://slurmgpu:s3cret@127.0.0.1:1/fleet?connect_timeout=2"
    with pytest.raises(StoreError) as err:
        Store(url)
    text = str(err.value)
    assert "\n" not in text and "s3cret" not in text and "slurmgpu:***@127.0.0.1:1/fleet" in text


def test_the_collector_refuses_an_unreachable_postgresql_with_one_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "slurmgpu", "keys", "init", "--dir", str(keys)],
                   capture_output=True, check=True, timeout=60)
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "collector", "--db",
                           "postgresql://slurmgpu:s3cret@127.0.0.1:1/fleet", "--keys-dir", str(keys),
                           "--bind", "tcp://127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "127.0.0.1:1" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stderr


def test_the_collector_checkpoints_the_wal_in_a_thread_of_its_own(tmp_path: Path) -> None:
    """Issue 15: WAL checkpoints (and their fsyncs) happen in a background thread, not in
    the collector's commits; the writer's own automatic checkpoint runs only past RESTART_PAGES."""
    import os
    import time

    from slurmgpu.collector.store.walcheckpoint import RESTART_PAGES
    from slurmgpu.wire import EVENT, Envelope

    store = Store(tmp_path / "fleet.db")
    try:
        assert int(store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 1000  # readers: default
        store.checkpoint_in_background()
        checkpointer = store._checkpointer
        assert checkpointer is not None and checkpointer.is_alive()
        assert int(store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == RESTART_PAGES
        body = {"verdict": "OK", "findings": [], "kind": "xid", "gpu": 0, "data": 13, "pad": "x" * 4000}
        for batch in range(20):
            store.store_batch([(f"n{i}", Envelope(type=EVENT, node=f"n{i}", seq=batch + 1, body=body))
                               for i in range(100)])
        wal = tmp_path / "fleet.db-wal"
        deadline = time.monotonic() + 30
        while checkpointer.checkpoints < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpointer.checkpoints >= 2
        # the WAL's frames were copied into the database file (it has grown to hold them)
        assert os.path.getsize(tmp_path / "fleet.db") > 20 * 100 * 4000 and wal.exists()
    finally:
        store.close()
    assert not checkpointer.is_alive()


def collector_stderr(tmp_path: Path, db: str) -> str:
    """What `slurmgpu collector --db DB` says on stderr; it must refuse to start."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "slurmgpu", "keys", "init", "--dir", str(keys)],
                   capture_output=True, check=True, timeout=60)
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "collector", "--db", db, "--keys-dir", str(keys),
                           "--bind", "tcp://127.0.0.1:0"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    return proc.stderr


@pytest.mark.parametrize("where", ["a-directory", "under-a-file"])
def test_a_path_that_cannot_be_opened_is_one_line(tmp_path: Path, where: str) -> None:
    """Issue 28 item 10: a directory, or a path under a file: one line naming it and
    what [collector] db needs (not SQLite's or Python's traceback)."""
    (tmp_path / "file").write_text("")
    db = str(tmp_path / "dir") if where == "a-directory" else str(tmp_path / "file" / "fleet.db")
    (tmp_path / "dir").mkdir()
    with pytest.raises(StoreError, match=r"cannot open the database .*a directory this user can write"):
        Store(db)
    lines = [ln for ln in collector_stderr(tmp_path, db).splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot open the database" in lines[0], lines


READ_ONLY_OPEN = """
import subprocess, sys
from slurmgpu.collector.store import Store, StoreError
subprocess.run(["mount", "--bind", sys.argv[1], sys.argv[1]], check=True)
subprocess.run(["mount", "-o", "remount,ro,bind", sys.argv[1]], check=True)
try:
    Store(sys.argv[1] + "/fleet.db")
except StoreError as exc:
    print(exc)
"""


def test_a_good_database_on_a_read_only_filesystem_is_said_to_be_read_only(tmp_path: Path) -> None:
    """Issue 28 item 10: a healthy database on a read-only mount (a private mount
    namespace: ``unshare -m``, bind-mounted read-only) is refused as read-only, not as
    damage to restore from a backup; the file is left as it was."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a read-only bind mount")
    directory = tmp_path / "ro"
    directory.mkdir()
    path = populated(directory)
    before = path.read_bytes()
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", READ_ONLY_OPEN,
                           str(directory)], capture_output=True, text=True, timeout=60, check=False)
    if "mount" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()[-200:]}")
    assert "read-only filesystem" in proc.stdout and "backup" not in proc.stdout, (proc.stdout, proc.stderr)
    assert str(path) in proc.stdout and path.read_bytes() == before
