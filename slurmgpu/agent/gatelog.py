"""The prolog's full-path refusals -> the collector.

Design notes: docs/design-notes.md (``slurmgpu/agent/gatelog.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmgpu.decision import Action
from slurmgpu.result import Severity

GATE_LOG = "gate.jsonl"
POSITION = "gate.jsonl.sent"
MAX_BYTES = 1 << 20
MAX_PROBLEMS = 20
MAX_TEXT = 512
MAX_TS = 1e11  # slurmgpu.wire.MAX_TS
HEAD_BYTES = 256  # the file's first bytes, to tell the same file from a rewritten one

# send(event body, its time or None for now) -> anything (the agent's spool seq)
Send = Callable[[dict[str, Any], float | None], Any]


def refused(record: dict[str, Any]) -> bool:
    """A prolog record whose hook exited non-zero (the job did not start)."""
    code = record.get("exit")
    if isinstance(code, int) and not isinstance(code, bool):
        return code != 0
    return str(record.get("action")) not in (Action.NONE, "fail-open")


def blocked_event(record: dict[str, Any], path: str) -> dict[str, Any]:
    """The ``prolog_blocked`` event body for a gate record (warm or full path)."""
    job = record.get("job")
    problems = record.get("problems") if isinstance(record.get("problems"), list) else []
    return {"kind": "prolog_blocked", "gpu": None, "data": None,
            "verdict": str(record.get("verdict") or Severity.FAIL.name)[:16], "findings": [],
            "job_id": None if job is None else str(job)[:MAX_TEXT],
            "problems": [str(p)[:MAX_TEXT] for p in (problems or [])[:MAX_PROBLEMS]],
            "action": str(record.get("action") or "")[:64], "path": path}


class GateLogForwarder:
    def __init__(self, state_dir: str | os.PathLike[str], node: str, send: Send) -> None:
        self.dir = Path(state_dir)
        self.node = node
        self.send = send
        # (inode, offset, digest of the first min(offset, HEAD_BYTES) bytes); None: not loaded
        self._pos: tuple[int | None, int, str] | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / GATE_LOG

    def poll(self) -> int:
        """Send the new refusals; returns how many were sent."""
        try:
            st = os.stat(self.log_path)
        except FileNotFoundError:
            if self._pos is None:
                self._pos = self._load() or (None, 0, "")
            return 0
        with open(self.log_path, "rb") as f:
            if self._pos is None:
                self._pos = self._load() or (st.st_ino, st.st_size, _head(f, st.st_size))
            ino, offset, head = self._pos
            if ino not in (None, st.st_ino) or st.st_size < offset or _head(f, offset) != head:
                offset = 0  # rotated, truncated or rewritten: a new file
            elif st.st_size == offset:
                return 0
            f.seek(offset)
            chunk = f.read(MAX_BYTES)
            end = chunk.rfind(b"\n") + 1  # whole lines only; a line being written waits
            if end == 0 and len(chunk) == MAX_BYTES:
                end = len(chunk)  # one line longer than MAX_BYTES: not a record, skip it
            sent = 0
            for line in chunk[:end].splitlines():
                sent += self._forward(line)
            self._pos = (st.st_ino, offset + end, _head(f, offset + end))
        self._save()
        return sent

    def _forward(self, line: bytes) -> int:
        try:
            record = json.loads(line)
        except ValueError:
            return 0
        if not isinstance(record, dict) or record.get("phase") != "prolog" \
                or record.get("path") == "agent" or record.get("node") != self.node \
                or not refused(record):
            return 0
        ts = record.get("time")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 < ts <= MAX_TS:
            ts = None
        self.send(blocked_event(record, "full"), ts)
        return 1

    def _load(self) -> tuple[int | None, int, str] | None:
        try:
            data = json.loads((self.dir / POSITION).read_text())
            ino, offset, head = data["ino"], data["offset"], data["head"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(offset, int) or offset < 0 or not (ino is None or isinstance(ino, int)) \
                or not isinstance(head, str):
            return None
        return ino, offset, head

    def _save(self) -> None:
        """Best effort: an unwritable state dir costs duplicates after a restart."""
        if self._pos is None:
            return
        path = self.dir / POSITION
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(OSError):
            ino, offset, head = self._pos
            tmp.write_text(json.dumps({"ino": ino, "offset": offset, "head": head}))
            os.replace(tmp, path)


def _head(f: Any, upto: int) -> str:
    """Digest of the first ``min(upto, HEAD_BYTES)`` bytes of the open file ``f``."""
    f.seek(0)
    return hashlib.blake2b(f.read(min(upto, HEAD_BYTES)), digest_size=8).hexdigest()
