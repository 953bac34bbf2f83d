"""Small file helpers shared by the commands."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: a
    reader sees the old file or the new one, never half of it."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory; made 0700 (whatever the umask) when missing."""
    target = Path(path)
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    return target


def append_private(path: str | os.PathLike[str], text: str) -> None:
    """Append ``text``; a new file is made 0600 (whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)


def touch_private(path: str | os.PathLike[str]) -> None:
    """Make ``path`` 0600 when missing (so what opens it next keeps that mode)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
