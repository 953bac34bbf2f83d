"""Per-job directories and checkpoint files: ``<jobs_dir>/<job id>/checkpoint``.

The prolog makes ``<jobs_dir>/<job id>/`` (mode 0700, owned by the job's user), the
epilog removes it. When the collector asks a job to checkpoint, the node's agent
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
    ``$SLURMGPU_JOBS_DIR``, else ``[agent] jobs_dir`` of the config file's top level, else
    the default. An absent, unreadable or bad config file is the default, never an error."""
    configured = environ.get(JOBS_DIR_ENV)
    if configured:
        return configured
    path = config_path(environ, config_file)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return DEFAULT_JOBS_DIR
    import tomllib

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return DEFAULT_JOBS_DIR
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
    ...}``; an ack carries ``acked_at`` (a number or None) and ``note`` (JSON "note")."""
    if text is None:
        return {"state": "absent"}
    import json

    words = text.split(None, 1)
    if words and words[0].lower() in ACK_WORDS:
        return {"state": ACKED, "acked_at": None, "note": None, "plain": True}
    try:
        data = json.loads(text)
    except ValueError:
        return {"state": "unknown"}
    if not isinstance(data, dict):
        return {"state": "unknown"}
    out = dict(data)
    state = data.get("state")
    if state == ACKED:
        at = data.get("acked_at")
        out["acked_at"] = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) \
            else None
        note = data.get("note")
        out["note"] = note if note is None or isinstance(note, str) else json.dumps(note)
    elif state != REQUESTED:
        out["state"] = "unknown"
    return out


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


def remove_job_dir(jobs_dir: str | os.PathLike[str], job_id: str) -> bool:
    """Remove the job's directory and all in it; False when there was none."""
    import shutil

    path = job_dir(jobs_dir, job_id)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return False
    return True


#: A checkpoint request's reason ends with this while the circuit breaker holds the drain
#: (``collector.checkpoint.held_request_note``).
BREAKER_HOLD = "drain held by the circuit breaker"


def held_note_of(reason: str | None) -> str | None:
    """The breaker's hold note at the end of a request's reason, if there is one."""
    if not reason or BREAKER_HOLD not in reason:
        return None
    return reason[reason.rindex(BREAKER_HOLD):].rstrip(")")
