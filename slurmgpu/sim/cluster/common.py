"""The simulated Slurm cluster's names, errors and small file helpers."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from slurmgpu.errors import SimError

ENV_CLUSTER_DIR = "SLURMGPU_CLUSTER_DIR"
DEFAULT_DIR = Path("/tmp/slurmgpu-cluster")
#: Where `slurmgpu demo` leaves its cluster up (its default --dir).
DEMO_DIR = Path("/tmp/slurmgpu-demo")
DEFAULT_SCENARIO = "h100-sxm-8"
BUNDLED_GPUS = 8  # bundled scenarios describe 8-GPU nodes
BASE_PORT = 17100
NODE_PREFIX = "gpu-n"
CLUSTER_NAME = "simgpu"
HOOKS = ("prolog", "epilog", "healthcheck", "taskprolog")
#: The TaskProlog only exports $SLURMGPU_CHECKPOINT_FILE: it stays on with hooks disabled.
ALWAYS_ON_HOOKS = ("taskprolog",)
#: The shipped TaskProlog wrapper (it tries each interpreter and never fails a task).
TASKPROLOG = "prolog/slurmgpu-taskprolog"
#: The repository's thin wrappers that the prolog/epilog hooks exec when present.
HOOK_WRAPPERS = {"prolog": "prolog/slurmgpu-prolog", "epilog": "epilog/slurmgpu-epilog"}
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_MAJOR = 195
STATE_FILE = "cluster.json"
COLLECTOR_BASE_PORT = 17600
COLLECTOR = "collector"
#: The agents' [agent] settings in the simulated cluster: short intervals for tests.
AGENT_INTERVAL_S = 2
AGENT_HEARTBEAT_S = 1
AGENT_MAX_AGE_S = 1
#: The collector asks Slurm for drained nodes this often (node_states history).
COLLECTOR_SLURM_POLL_S = 2
TERMINAL_JOB_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
})


class ClusterError(SimError):
    """The simulated Slurm cluster could not be brought up, queried or changed."""


class SlurmNotAvailable(ClusterError):
    """Slurm/munge are not installed and cannot be installed here (not root, no apt-get)."""


def default_directory() -> Path:
    return Path(os.environ.get(ENV_CLUSTER_DIR) or DEFAULT_DIR)


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(1, count + 1)]


#: Log lines that every 22.05 (and 25.11: no http_parser in the build) daemon writes and
#: that never explain a failure.
_LOG_NOISE = re.compile(r"pmix|MPI: Cannot create context|Node configuration differs|"
                        r"http_parser/libhttp_parser")


def log_tail(path: Path, lines: int = 6) -> str:
    """The last lines of a log, joined with ' | ' so an error stays on one line."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not _LOG_NOISE.search(ln)]
    return f"{path}: " + (" | ".join(kept[-lines:]) if kept else "(empty)")


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def text_digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def empty_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
