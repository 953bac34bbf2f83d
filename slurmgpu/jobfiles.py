"""Per-job directories and checkpoint files: ``<jobs_dir>/<job id>/checkpoint``.

The prolog makes ``<jobs_dir>/<job id>/`` (mode 0700, owned by the job's user); the
epilog moves it into ``<jobs_dir>/.trash/`` (``retire_job_dir``) and a bounded sweep
deletes it (``sweep_trash``). Everything in a job's directory is the job user's input:
reading and parsing it never raises, and deleting it is bounded in time, entries and memory. When the collector asks a job to checkpoint, the node's agent
writes ``checkpoint`` there (JSON, ``"state": "requested"``); the job acks by
replacing it (``slurmgpu ckpt ack``, or any text whose first word is ack/acked/done,
or JSON with ``"state": "acked"``) and the agent reports the ack.

``jobs_dir``: ``$SLURMGPU_JOBS_DIR``, else ``[agent] jobs_dir`` (default
/run/slurmgpu/jobs). Job ids are digits, or ``<digits>_<digits>`` for an array task:
nothing else ever becomes a path.

Standard library only, and light: the TaskProlog (run with ``python3 -I -S`` for each
task) and the prolog import this module. pathlib is imported only by the functions
that return a ``Path``, json only by those that need it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs start-up time; only type checkers need it
if TYPE_CHECKING:
    from collections.abc import Mapping
    from collections.abc import Set as AbstractSet
    from pathlib import Path
    from typing import Any

JOBS_DIR_ENV = "SLURMGPU_JOBS_DIR"
CHECKPOINT_FILE_ENV = "SLURMGPU_CHECKPOINT_FILE"
CONFIG_ENV = "SLURMGPU_CONFIG"
DEFAULT_JOBS_DIR = "/run/slurmgpu/jobs"
DEFAULT_CONFIG = "/etc/slurmgpu/slurmgpu.toml"
CHECKPOINT_NAME = "checkpoint"
#: A checkpoint file bigger than this is not a request nor an ack; only this much is read.
MAX_FILE_BYTES = 64 * 1024
#: An ack's note is cut to this many characters.
MAX_NOTE = 1000
ACK_WORDS = frozenset({"ack", "acked", "done"})
REQUESTED, ACKED = "requested", "acked"


def valid_job_id(job_id: object) -> bool:
    """``123`` or ``123_4`` (array task); ASCII digits only, so never a path trick."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > 64:
        return False
    parts = job_id.split("_")
    return len(parts) <= 2 and all(p and p.isascii() and p.isdigit() for p in parts)


def _check(job_id: str) -> str:
    if not valid_job_id(job_id):
        raise ValueError(f"bad job id {str(job_id)[:40]!r} (digits, or digits_digits)")
    return job_id


def jobs_dir(settings: Any) -> Path:
    """``settings.agent.jobs_dir`` (``$SLURMGPU_JOBS_DIR`` is in it: ``config.env``)."""
    from pathlib import Path

    return Path(settings.agent.jobs_dir)


def checkpoint_file(jobs_dir: str | os.PathLike[str], job_id: str) -> Path:
    """``<jobs_dir>/<job_id>/checkpoint``; ValueError for a bad job id."""
    from pathlib import Path

    return Path(jobs_dir) / _check(job_id) / CHECKPOINT_NAME


def job_dir(jobs_dir: str | os.PathLike[str], job_id: str) -> Path:
    from pathlib import Path

    return Path(jobs_dir) / _check(job_id)


# ------------------------------------------------------------------ config, no Settings


def config_path(environ: Mapping[str, str], config_file: str | None = None) -> str:
    return config_file or environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def configured_jobs_dir(environ: Mapping[str, str], config_file: str | None = None) -> str:
    """jobs_dir without loading the settings (TaskProlog, ``slurmgpu ckpt``): the order of
    ``slurmgpu.config.env`` for this one key, with the standard library only:
    ``$SLURMGPU_JOBS_DIR``, else ``[agent] jobs_dir`` of the config file's top level (its
    drop-ins' over it), else the default. An absent, unreadable or bad config file is the
    default, never an error."""
    configured = environ.get(JOBS_DIR_ENV)
    if configured:
        return configured
    from slurmgpu.quickgate import read_config

    data = read_config(config_path(environ, config_file))
    agent = data.get("agent")
    value = agent.get("jobs_dir") if isinstance(agent, dict) else None
    return value if isinstance(value, str) and value else DEFAULT_JOBS_DIR


# ------------------------------------------------------------------ reading


def read_file(path: str | os.PathLike[str]) -> tuple[str, float] | None:
    """(text, mtime) of the file (at most MAX_FILE_BYTES of it), None when absent.
    Never follows a symlink nor blocks on a FIFO: the directory belongs to the job's
    user. Anything but a regular file is an OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{os.fspath(path)} is not a regular file")
        data = os.read(fd, MAX_FILE_BYTES)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace"), st.st_mtime


def read_text(path: str | os.PathLike[str]) -> str | None:
    got = read_file(path)
    return None if got is None else got[0]


def parse(text: str | None) -> dict[str, Any]:
    """What a checkpoint file says: ``{"state": "requested"|"acked"|"absent"|"unknown",
    ...}``; an ack carries ``acked_at`` (a finite number or None) and ``note`` (JSON
    "note", at most MAX_NOTE characters). Total: any text the job wrote (too deep, a
    number too large for a float, ...) is ``"unknown"`` with an ``error``, never an
    exception."""
    if text is None:
        return {"state": "absent"}
    words = text.split(None, 1)
    if words and words[0].lower() in ACK_WORDS:
        return {"state": ACKED, "acked_at": None, "note": None, "plain": True}
    try:
        return _parse_json(text)
    except Exception as exc:  # the job's own bytes: whatever they hold is "not understood"
        return {"state": "unknown", "error": f"{type(exc).__name__}: {str(exc)[:120]}"}


def _parse_json(text: str) -> dict[str, Any]:
    import json

    data = json.loads(text)
    if not isinstance(data, dict):
        return {"state": "unknown", "error": f"JSON {type(data).__name__}, not an object"}
    out = dict(data)
    state = data.get("state")
    if state == ACKED:
        out["acked_at"] = _finite(data.get("acked_at"))
        if out["acked_at"] is None and data.get("acked_at") is not None:
            out["error"] = "acked_at is not a finite number (the file's time is used)"
        note = data.get("note")
        out["note"] = note[:MAX_NOTE] if isinstance(note, str) else \
            None if note is None else json.dumps(note)[:MAX_NOTE]
    elif state != REQUESTED:
        out["state"] = "unknown"
    return out


def _finite(value: object) -> float | None:
    """A JSON number as a float; None for anything else, and for an integer past a float's
    range, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if number - number == 0.0 else None


# ------------------------------------------------------------------ writing


def write_atomic(path: str | os.PathLike[str], data: dict[str, Any], *, mode: int = 0o644,
                 owner: tuple[int, int] | None = None) -> None:
    """JSON into ``path`` through a new temporary file in the same directory and
    ``os.replace``; ``owner`` (uid, gid) is set on the temporary file first."""
    import contextlib
    import json

    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    tmp = os.path.join(directory, f".{os.path.basename(target)}.{os.getpid()}."
                                  f"{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.write(fd, (json.dumps(data, sort_keys=True) + "\n").encode())
            os.fchmod(fd, mode)
            if owner is not None:
                st = os.fstat(fd)
                if (st.st_uid, st.st_gid) != owner:
                    # not root: the owner of the directory can still replace it
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, *owner)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_job_dir(jobs_dir: str | os.PathLike[str], job_id: str, uid: int | None = None,
                 gid: int | None = None) -> Path:
    """``<jobs_dir>/<job_id>/`` (mode 0700, ``uid``/``gid`` when given; jobs_dir itself
    is made 0755). An existing directory is re-owned, not replaced."""
    path = job_dir(jobs_dir, job_id)
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o755)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise OSError(f"{path} exists and is not a directory") from None
    os.chmod(path, 0o700)
    if uid is not None or gid is not None:
        os.chown(path, -1 if uid is None else uid, -1 if gid is None else gid)
    return path


# ------------------------------------------------------------------ removing, bounded

#: Retired job directories wait here (mode 0700, root's) until a sweep deletes them.
TRASH_NAME = ".trash"
#: What one sweep may do at most: entries removed (or moved), and seconds.
SWEEP_ENTRIES = 100_000
SWEEP_S = 2.0


def retire_job_dir(jobs_dir: str | os.PathLike[str], job_id: str) -> str | None:
    """Move ``<jobs_dir>/<job_id>/`` into ``<jobs_dir>/.trash/`` under a new name: one
    rename, whatever the job left in it, and out of the job's reach by path. The path it
    went to; None when there was no directory."""
    source = os.fspath(job_dir(jobs_dir, job_id))
    if not os.path.lexists(source):
        return None
    trash = _trash(jobs_dir)
    target = os.path.join(trash, f"{job_id}.{os.urandom(6).hex()}")
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return None
    return target


def _trash(jobs_dir: str | os.PathLike[str]) -> str:
    """``<jobs_dir>/.trash``, made 0700 when missing; an OSError when it is not this
    process's own directory."""
    import stat

    trash = os.path.join(os.fspath(jobs_dir), TRASH_NAME)
    os.makedirs(trash, 0o700, exist_ok=True)
    st = os.lstat(trash)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{trash} is not a directory of uid {os.geteuid()}")
    return trash


class Sweep:
    """What one ``sweep_trash`` did: ``removed`` entries, ``done`` (the trash is empty),
    ``errors`` (entries that could not be removed: left for a later sweep). ``busy``:
    entries that filled up again while being emptied (a process still writing, another
    sweep at work): not errors, left for the next sweep."""

    def __init__(self, max_entries: int, max_s: float) -> None:
        import time

        self.removed = 0
        self.done = False
        self.errors: dict[str, str] = {}
        self.busy: set[str] = set()
        self._left = max_entries
        self._until = time.monotonic() + max_s

    def spent(self) -> bool:
        import time

        return self._left <= 0 or time.monotonic() >= self._until

    def count(self) -> None:
        self.removed += 1
        self._left -= 1


def sweep_trash(jobs_dir: str | os.PathLike[str], max_entries: int = SWEEP_ENTRIES,
                max_s: float = SWEEP_S) -> Sweep:
    """Delete what ``<jobs_dir>/.trash`` holds, at most ``max_entries`` entries and
    ``max_s`` seconds; the rest waits for the next sweep. Streaming (``os.scandir``, one
    entry at a time: memory does not grow with what a job left), iterative (a
    subdirectory is moved up into the trash, so nesting depth costs neither stack nor
    file descriptors) and relative to open directories without following a symlink (a
    swapped entry is removed itself, never what it points to)."""
    sweep = Sweep(max_entries, max_s)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        trash = os.open(os.path.join(os.fspath(jobs_dir), TRASH_NAME), flags)
    except FileNotFoundError:
        sweep.done = True
        return sweep
    try:
        while not sweep.spent():
            name = _next_entry(trash, sweep.errors.keys() | sweep.busy)
            if name is None:
                sweep.done = not sweep.errors and not sweep.busy
                break
            _empty_or_note(trash, name, sweep)
    finally:
        os.close(trash)
    return sweep


def _empty_or_note(trash: int, name: str, sweep: Sweep) -> None:
    import errno

    try:
        _empty(trash, name, sweep)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            sweep.busy.add(name)
        else:
            sweep.errors[name] = f"{type(exc).__name__}: {exc}"


def _next_entry(trash: int, skip: AbstractSet[str]) -> str | None:
    with os.scandir(trash) as entries:
        for entry in entries:
            if entry.name not in skip:
                return entry.name
    return None


def _empty(trash: int, name: str, sweep: Sweep) -> None:
    """Remove the trash entry ``name``: a file or link at once; a directory's files one by
    one, its subdirectories moved up into the trash, then the directory itself."""
    import errno

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=trash)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(name, dir_fd=trash)
        sweep.count()
        return
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if sweep.spent():
                    return
                _take(entry, fd, trash)
                sweep.count()
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=trash)
    sweep.count()


def _take(entry: os.DirEntry[str], parent: int, trash: int) -> None:
    try:
        if entry.is_dir(follow_symlinks=False):
            os.rename(entry.name, f"d{os.urandom(8).hex()}", src_dir_fd=parent, dst_dir_fd=trash)
        else:
            os.unlink(entry.name, dir_fd=parent)
    except FileNotFoundError:
        pass


#: A checkpoint request's reason ends with this while the circuit breaker holds the drain
#: (``collector.checkpoint.held_request_note``).
BREAKER_HOLD = "drain held by the circuit breaker"


def held_note_of(reason: str | None) -> str | None:
    """The breaker's hold note at the end of a request's reason, if there is one."""
    if not reason or BREAKER_HOLD not in reason:
        return None
    return reason[reason.rindex(BREAKER_HOLD):].rstrip(")")
