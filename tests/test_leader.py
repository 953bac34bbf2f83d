"""Issue 15: exactly one collector leads (runs the automation and the checkpoint
coordination) on one PostgreSQL database, chosen by an advisory lock; when it dies
another takes over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from slurmgpu.collector.store import Store, queries
from slurmgpu.collector.store.leader import Leadership
from tests.agenthelpers import wait_until

REPO = Path(__file__).resolve().parent.parent

# A collector process that leads as soon as it can, says so, and stays.
LEADER = """
import sys, time
from slurmgpu.collector.store.leader import Leadership
lead = Leadership(sys.argv[1], timeout_s=5)
while not lead.poll():
    time.sleep(0.05)
print("leading", flush=True)
time.sleep(600)
"""


def wait_for(poll: Leadership, want: bool, within_s: float) -> float:
    """Seconds until ``poll`` says it leads (``want``), at most ``within_s``."""
    began = time.monotonic()
    wait_until(lambda: poll.poll() == want, within_s, f"leader={want}")
    return time.monotonic() - began


def test_with_sqlite_the_one_collector_leads(tmp_path: Path) -> None:
    lead = Leadership(tmp_path / "fleet.db")
    assert lead.poll() and lead.leader
    lead.release()
    assert lead.poll()


def test_two_collectors_on_one_postgresql_one_leads(pg_url: str) -> None:
    Store(pg_url).close()
    a, b = Leadership(pg_url), Leadership(pg_url)
    try:
        assert a.poll() and not b.poll()
        assert a.poll() and not b.poll()  # (held, not stacked: one release frees it)
        a.release()
        assert not a.leader
        assert b.poll() and not a.poll()
    finally:
        a.release()
        b.release()


def test_the_leader_killed_another_takes_over(pg_url: str) -> None:
    follower = Leadership(pg_url, timeout_s=5)
    proc = subprocess.Popen([sys.executable, "-c", LEADER, pg_url], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "leading"
        assert not follower.poll()
        proc.kill()  # kill -9: no clean release
        proc.wait(10)
        assert wait_for(follower, True, 5.0) < 5.0
    finally:
        proc.kill()
        proc.wait(10)
        follower.release()


def test_a_leader_whose_session_was_lost_does_not_lead_from_a_new_one(pg_url: str) -> None:
    a, b = Leadership(pg_url), Leadership(pg_url)
    try:
        assert a.poll()
        assert a._db is not None
        pid = a._db.execute("SELECT pg_backend_pid()").fetchone()[0]
        with queries.snapshot(pg_url) as db:  # the server drops the leader's session
            db.execute("SELECT pg_terminate_backend(?)", (pid,))
        wait_for(b, True, 5.0)  # the lock went with the session
        assert not a.poll()  # a new session of a's does not hold it
        b.release()
        wait_for(a, True, 5.0)
    finally:
        a.release()
        b.release()


def test_an_unreachable_database_is_not_leading() -> None:
    lead = Leadership("postgresql://slurmgpu@127.0.0.1:1/fleet", timeout_s=2)
    assert not lead.poll() and not lead.leader


# A collector's leadership as its loop polls it (every 0.2 s here), saying each change.
POLLING = """
import sys, time
from slurmgpu.collector.store.leader import Leadership
lead, said = Leadership(sys.argv[1], timeout_s=3), None
while True:
    now = lead.poll()
    if now != said:
        print("leading" if now else "following", flush=True)
        said = now
    time.sleep(0.2)
"""


def test_a_stopped_leader_loses_the_lead_and_knows_it_when_continued(pg_url: str) -> None:
    """Issue 28 item 7: a SIGSTOPped leader keeps its session (the kernel answers the
    keepalives), but stops renewing its lease (its polls): a follower ends its session
    after the lease (3 s here) and leads; the old leader, continued, follows. A leader
    that keeps polling keeps the lead past the lease."""
    follower = Leadership(pg_url, timeout_s=3)
    proc = subprocess.Popen([sys.executable, "-c", POLLING, pg_url], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "leading"
        time.sleep(4.0)  # (past the lease, renewed all along)
        assert not follower.poll()
        proc.send_signal(signal.SIGSTOP)
        assert wait_for(follower, True, 3.0 + 5.0) >= 2.0  # (not before the lease ran out)
        assert follower.ended is not None
        proc.send_signal(signal.SIGCONT)
        assert proc.stdout.readline().strip() == "following"
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
        follower.release()
