"""Issue 12 item 8: a damaged fleet database is refused at start with one line naming the
file and what to do, and is never written to, wiped or re-initialised."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgpu.collector.store import Store, StoreError


def populated(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    store = Store(path)
    with store.transaction():
        store.db.executemany("INSERT INTO nodes (node, first_seen, last_seen) VALUES (?, 1, 1)",
                             [(f"n{i:05d}",) for i in range(3000)])
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
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


def test_a_dropped_table_is_refused(tmp_path: Path) -> None:
    path = populated(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE messages")
    refused(path, "messages missing")


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


def test_a_healthy_database_reopens(tmp_path: Path) -> None:
    path = populated(tmp_path)
    store = Store(path)
    assert store.db.execute("SELECT count(*) FROM nodes").fetchone()[0] == 3000
    store.close()
