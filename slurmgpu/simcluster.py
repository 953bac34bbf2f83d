"""A real Slurm mini-cluster on one machine, for tests, CI and demos.

``SimCluster(dir).up(nodes=4, gpus=8)`` runs one munged, one slurmctld and one slurmd per
simulated node (``slurmd -N gpu-nX``, each on its own port) on this host, as root, without
systemd. Each node's GPUs are a simulator scenario file (``nodes/<node>/scenario.json``)
read by the fake ``libnvidia-ml.so.1``, and its GRES devices are real character devices
under ``nodes/<node>/dev/`` so that Slurm hands jobs ``CUDA_VISIBLE_DEVICES``. The
Prolog/Epilog/HealthCheckProgram are generated sh hooks that point slurmgpu at the node's
simulated GPUs. Layout, slurm.conf and version notes: docs/simcluster.md.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slurmgpu.errors import SimError

ENV_CLUSTER_DIR = "SLURMGPU_CLUSTER_DIR"
DEFAULT_DIR = Path("/tmp/slurmgpu-cluster")
DEFAULT_SCENARIO = "h100-sxm-8"
BUNDLED_GPUS = 8  # bundled scenarios describe 8-GPU nodes
BASE_PORT = 17100
NODE_PREFIX = "gpu-n"
CLUSTER_NAME = "simgpu"
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
#: Programs `up` needs; any one missing triggers the apt-get install.
SLURM_PROGRAMS = ("slurmctld", "slurmd", "scontrol", "sbatch", "sinfo", "squeue", "scancel",
                  "munged", "mungekey")
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
HOOKS = ("prolog", "epilog", "healthcheck", "taskprolog")
#: The TaskProlog only exports $SLURMGPU_CHECKPOINT_FILE: it stays on with hooks disabled.
ALWAYS_ON_HOOKS = ("taskprolog",)
TASKPROLOG = "prolog/slurmgpu-taskprolog.py"
#: The repository's thin wrappers that the prolog/epilog hooks exec when present.
HOOK_WRAPPERS = {"prolog": "prolog/slurmgpu-prolog", "epilog": "epilog/slurmgpu-epilog"}
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_MAJOR = 195
XID_EVENT_TYPE = 0x8  # nvmlEventTypeXidCriticalError
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
DEFAULT_SLURMGPU_TOML = """\
# slurmgpu config used by the simulated cluster's hooks (SLURMGPU_CONFIG).
[gpu]
count = {gpus}
[pins]
driver = ["550.90.07"]
[prolog]
timeout_s = 20
[checks]
disabled = ["ib.*", "pin.ib_firmware", "pin.nccl", "pin.ofed", "pin.cuda"]
"""


class ClusterError(SimError):
    """The simulated Slurm cluster could not be brought up, queried or changed."""


class SlurmNotAvailable(ClusterError):
    """Slurm/munge are not installed and cannot be installed here (not root, no apt-get)."""


# --------------------------------------------------------------------------- helpers


def default_directory() -> Path:
    return Path(os.environ.get(ENV_CLUSTER_DIR) or DEFAULT_DIR)


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(1, count + 1)]


#: Log lines that every 22.05 daemon writes and that never explain a failure.
_LOG_NOISE = re.compile(r"pmix|MPI: Cannot create context|Node configuration differs")


def _tail(path: Path, lines: int = 6) -> str:
    """The last lines of a log, joined with ' | ' so an error stays on one line."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not _LOG_NOISE.search(ln)]
    return f"{path}: " + (" | ".join(kept[-lines:]) if kept else "(empty)")


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _proc_alive(pid: int) -> bool:
    """True for a running process; zombies (not reaped by a minimal init) count as dead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, start: int = BASE_PORT, prefer: list[int] | None = None) -> list[int]:
    """``count`` consecutive free TCP ports from ``start`` (``prefer`` first, if all free)."""
    if prefer and len(prefer) == count and all(_port_free(p) for p in prefer):
        return prefer
    port = start
    while port + count < 65000:
        block = list(range(port, port + count))
        busy = [p for p in block if not _port_free(p)]
        if not busy:
            return block
        port = busy[-1] + 1
    raise ClusterError(f"no {count} consecutive free TCP ports from {start}")


def slurm_version() -> tuple[int, int, int]:
    """The installed Slurm version from ``slurmd -V`` ("slurm-wlm 22.05.8" -> (22, 5, 8))."""
    try:
        out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot run `slurmd -V`: {exc}") from exc
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise ClusterError(f"cannot parse the Slurm version from `slurmd -V`: {out.strip()!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def path_additions() -> list[str]:
    """The directories of SANE_PATH that $PATH lacks (the Slurm clients live in /usr/bin)."""
    have = os.environ.get("PATH", "").split(os.pathsep)
    return [p for p in SANE_PATH.split(os.pathsep) if p not in have]


def missing_programs() -> list[str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), SANE_PATH])
    return [p for p in SLURM_PROGRAMS if shutil.which(p, path=path) is None]


def ensure_slurm_installed() -> None:
    """apt-get install the Slurm and munge packages if a program is missing (root only)."""
    missing = missing_programs()
    if not missing:
        return
    packages = " ".join(SLURM_PACKAGES)
    if os.geteuid() != 0:
        raise SlurmNotAvailable(
            f"Slurm is not installed ({', '.join(missing)} missing) and this is not root; "
            f"run: apt-get install -y --no-install-recommends {packages}"
        )
    if shutil.which("apt-get") is None:
        raise SlurmNotAvailable(f"Slurm is not installed and there is no apt-get; install {packages}")
    _apt_install()
    missing = missing_programs()
    if missing:
        raise SlurmNotAvailable(f"still missing after apt-get install: {', '.join(missing)}")


def _apt_install() -> None:
    created_policy = False
    if not POLICY_RC_D.exists():  # keep Debian's init scripts from starting the daemons
        POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n", encoding="utf-8")
        POLICY_RC_D.chmod(0o755)
        created_policy = True
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *SLURM_PACKAGES]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:  # stale or empty package lists: update once, then retry
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        if created_policy:
            POLICY_RC_D.unlink(missing_ok=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SlurmNotAvailable(f"apt-get install {' '.join(SLURM_PACKAGES)} failed: {last}")


def slurmgpu_command() -> str:
    """How hooks run slurmgpu: the console script next to this interpreter, else ``-m``."""
    script = Path(sys.executable).parent / "slurmgpu"
    if os.access(script, os.X_OK):
        return str(script)
    return f"{shlex.quote(sys.executable)} -m slurmgpu"


def repo_root() -> Path:
    """The directory holding the ``slurmgpu`` package (a checkout: prolog/, epilog/ too)."""
    return Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def _needs_pythonpath() -> bool:
    """True when this interpreter cannot import slurmgpu from a neutral directory."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", "import slurmgpu"], cwd="/", env=env,
                          capture_output=True, check=False)
    return proc.returncode != 0


# ------------------------------------------------------------------ scenario fitting


def fit_scenario(data: dict[str, Any], gpus: int) -> dict[str, Any]:
    """A copy of ``data`` with exactly ``gpus`` GPUs: trimmed, or extended by copying GPU
    entries with fresh uuid, serial and PCI bus id. Events for dropped GPUs are dropped."""
    out = copy.deepcopy(data)
    have: list[dict[str, Any]] = out.get("gpus") or []
    if not have:
        raise ClusterError(f"scenario {data.get('name', '?')!r} has no GPUs to copy")
    fitted = have[:gpus]
    used_buses = {_bus_of(g) for g in fitted}
    for index in range(len(fitted), gpus):
        gpu = copy.deepcopy(have[index % len(have)])
        gpu["uuid"] = f"GPU-{uuid.uuid4()}"
        gpu["serial"] = str(1654922100000 + index)
        pci = dict(gpu.get("pci") or {})
        bus = next(b for b in range(1, 256) if b not in used_buses)
        used_buses.add(bus)
        pci["bus_id"] = f"00000000:{bus:02X}:00.0"
        gpu["pci"] = pci
        fitted.append(gpu)
    out["gpus"] = fitted
    out["events"] = [e for e in out.get("events") or [] if int(e.get("gpu", 0)) < gpus]
    return out


def _bus_of(gpu: Mapping[str, Any]) -> int:
    bus_id = str((gpu.get("pci") or {}).get("bus_id", ""))
    parts = bus_id.split(":")
    try:
        return int(parts[1], 16) if len(parts) == 3 else -1
    except ValueError:
        return -1


# ------------------------------------------------------------------- config files


def render_slurm_conf(d: Path, state: Mapping[str, Any]) -> str:
    """slurm.conf for the cluster described by ``state`` (see ``SimCluster._new_state``)."""
    hooks = d / "hooks"
    lines = [
        "# Generated by `slurmgpu sim cluster up`; rewritten on every fresh up.",
        f"ClusterName={CLUSTER_NAME}",
        "SlurmctldHost=localhost(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={state['ctld_port']}",
        f"AuthType=auth/munge\nAuthInfo=socket={d}/munge/munge.socket.2,cred_expire=10",
        "CredType=cred/munge",
        f"StateSaveLocation={d}/spool/slurmctld",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"PlugStackConfig={d}/etc/plugstack.conf",
        "MailProg=/bin/true",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=nohold_on_prolog_fail,sched_interval=2,bf_interval=2",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "PrologFlags=Alloc",
        f"Prolog={hooks}/prolog",
        f"Epilog={hooks}/epilog",
        f"HealthCheckProgram={hooks}/healthcheck",
        f"TaskProlog={hooks}/taskprolog",
        "HealthCheckInterval=0",
        "ReturnToService=2",
        # `scontrol reboot` (the automation's reboot action) is refused without one; the
        # simulated nodes reboot nothing, so reset() cancels pending reboots.
        "RebootProgram=/bin/true",
        "MinJobAge=300",
        "JobRequeue=1",
        "KillWait=2",
        "InactiveLimit=0",
        "MessageTimeout=10",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
    ]
    for node, port in zip(state["nodes"], state["node_ports"], strict=True):
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={state['cpus']} RealMemory={state['memory_mb']} Gres=gpu:{state['gpus']} "
            "State=UNKNOWN"
        )
    lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                 "OverSubscribe=YES")
    return "\n".join(lines) + "\n"


def render_gres_conf(d: Path, state: Mapping[str, Any]) -> str:
    last = state["gpus"] - 1
    files = "nvidia0" if last == 0 else f"nvidia[0-{last}]"
    lines = ["# Generated by `slurmgpu sim cluster up`.", "AutoDetect=off"]
    lines += [f"NodeName={n} Name=gpu File={d}/nodes/{n}/dev/{files}" for n in state["nodes"]]
    return "\n".join(lines) + "\n"


def render_cgroup_conf(d: Path, version: tuple[int, int, int]) -> str:
    head = "# Generated by `slurmgpu sim cluster up`.\n"
    if version >= (23, 11):
        # 23.11+ can run without any cgroup plugin (and needs no cgroup fs mounted).
        return head + "CgroupPlugin=disabled\n"
    # 22.05 always initialises a cgroup plugin and has no `disabled`. Autodetect fails
    # without a v1 hierarchy at /sys/fs/cgroup ("No filesystem mounted on /sys/fs/cgroup"),
    # but cgroup/v1 pointed at an empty private directory initialises fine, and with
    # proctrack/linuxproc + task/none nothing ever creates a cgroup: this works whatever
    # cgroup layout (v1, hybrid, v2, none) the host has.
    return head + f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={d}/cgroup\n"


def hook_environment(d: Path, node: str, lib: Path) -> dict[str, str]:
    """What a hook exports for ``node`` (``node`` may be the shell text "$node")."""
    nd = f"{d}/nodes/{node}"
    # The warm-path client (standard library only): run as a file with -I -S, it skips
    # site-packages (~30 ms of interpreter start-up) and needs no slurmgpu on sys.path.
    quick = repo_root() / "slurmgpu" / "quickgate.py"
    env = {
        "SLURM_CONF": f"{d}/etc/slurm.conf",
        "SLURMGPU_NVML_LIBRARY": str(lib),
        "SLURMGPU_SIM_SCENARIO": f"{nd}/scenario.json",
        "SLURMGPU_KMSG": f"{nd}/kmsg",
        "SLURMGPU_STATE_DIR": f"{nd}/state",
        # Per-job directories (checkpoint request files), as the agent's [agent] jobs_dir.
        "SLURMGPU_JOBS_DIR": f"{nd}/jobs",
        "SLURMGPU_CONFIG": f"{d}/etc/slurmgpu.toml",
        "SLURMGPU_BIN": slurmgpu_command(),
        "SLURMGPU_DEVICE_PATTERN": f"{nd}/dev/nvidia{{index}}",
        # The warm path: the prolog/epilog wrappers try the node's agent at this socket
        # first (falling back to $SLURMGPU_BIN when no agent answers).
        "SLURMGPU_AGENT_SOCKET": f"{nd}/agent.sock",
        "SLURMGPU_QUICKGATE": f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(quick))}",
    }
    if _needs_pythonpath():
        env["PYTHONPATH"] = str(repo_root())
    return env


#: What a hook exports to say where slurmgpu is; with installed wrappers (a package's
#: layout) they find it themselves, from /etc/default/slurmgpu or the packaged paths.
INSTALL_DISCOVERY = ("SLURMGPU_BIN", "SLURMGPU_QUICKGATE", "PYTHONPATH", "SLURMGPU_CONFIG")


def check_installed_hooks(libexec: Path) -> None:
    """A package's wrappers are all there and executable, or a one-line ClusterError."""
    missing = [f"slurmgpu-{name}" for name in HOOKS
               if not os.access(libexec / f"slurmgpu-{name}", os.X_OK)]
    if missing:
        raise ClusterError(f"--installed-hooks {libexec}: no executable {', '.join(missing)} there "
                           "(is the slurmgpu package installed?)")


def render_hook(name: str, d: Path, lib: Path, *, enabled: bool, installed: Path | None = None) -> str:
    """The hook slurm.conf names for ``name``. ``installed``: exec the wrapper a package
    installs there (slurmgpu-<name>), exporting only what simulates each node (its fake
    GPUs, kernel log, state and agent socket), nothing that says where slurmgpu is."""
    head = (f"#!/bin/sh\n# {name} hook of the simulated Slurm cluster in {d}\n"
            "# (generated by `slurmgpu sim cluster up`; rewritten on up and reset).\n")
    if not enabled:
        return head + "# Hooks are disabled (hooks_enabled=False).\nexit 0\n"
    lines = [head.rstrip("\n"),
             "# slurmd gives a prolog/epilog no PATH (22.05) and a health check only "
             "SLURMD_NODENAME.",
             'node="${SLURMD_NODENAME:?SLURMD_NODENAME is not set}"']
    for key, value in hook_environment(d, "@NODE@", lib).items():
        if installed is not None and key in INSTALL_DISCOVERY:
            continue
        quoted = "'" + "'\"$node\"'".join(value.replace("'", "'\\''").split("@NODE@")) + "'"
        lines.append(f"export {key}={quoted}")
    if installed is not None:
        lines.append(f'exec {shlex.quote(str(installed / f"slurmgpu-{name}"))} "$@"')
        return "\n".join(lines) + "\n"
    if name == "taskprolog":
        script = shlex.quote(str(repo_root() / TASKPROLOG))
        lines.append(f"exec {shlex.quote(sys.executable)} -I -S {script}")
        return "\n".join(lines) + "\n"
    wrapper = HOOK_WRAPPERS.get(name)
    if wrapper is not None:
        target = shlex.quote(str(repo_root() / wrapper))
        lines.append(f'[ -x {target} ] && exec {target} "$@"')
    lines.append(f': "${{PATH:={SANE_PATH}}}"; export PATH')
    lines.append(f'exec $SLURMGPU_BIN {name} "$@"')
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------- agents and collector


def render_agent_config(base: str, *, socket_path: Path, spool: Path, address: str,
                        keys_dir: Path, jobs_dir: Path | None = None,
                        interval_s: float = AGENT_INTERVAL_S,
                        heartbeat_s: float = AGENT_HEARTBEAT_S,
                        max_age_s: float = AGENT_MAX_AGE_S) -> str:
    """A node agent's config: the cluster's slurmgpu.toml (``base``) plus ``[agent]`` and
    ``[collector]`` keys. When ``base`` already has one of those tables, the keys go right
    under its header (TOML forbids a table twice), so ``base`` must not set them itself."""
    tables = {
        "agent": [f"interval_s = {interval_s}", f"heartbeat_s = {heartbeat_s}",
                  f"max_age_s = {max_age_s}", f"socket = {json.dumps(str(socket_path))}",
                  f"spool_dir = {json.dumps(str(spool))}"]
                 + ([f"jobs_dir = {json.dumps(str(jobs_dir))}"] if jobs_dir is not None else []),
        "collector": [f"address = {json.dumps(address)}",
                      f"keys_dir = {json.dumps(str(keys_dir))}"],
    }
    lines = base.rstrip("\n").splitlines()
    tail: list[str] = []
    for table, keys in tables.items():
        header = re.compile(rf"^\s*\[\s*{table}\s*\]\s*(#.*)?$")
        at = next((i for i, line in enumerate(lines) if header.match(line)), None)
        if at is None:
            tail += [f"[{table}]", *keys]
        else:
            lines[at + 1:at + 1] = keys
    head = "# Generated by `slurmgpu sim cluster`: etc/slurmgpu.toml + this node's agent keys.\n"
    extra = "\n# --- the simulated node's agent\n" + "\n".join(tail) + "\n" if tail else ""
    return head + "\n".join(lines) + "\n" + extra


def spawn_detached(args: list[str], *, env: Mapping[str, str], log: Path, pid_file: Path,
                   cwd: Path | None = None) -> int:
    """Start ``args`` as a daemon: its own session, reparented to init (so nobody has to
    reap it), output appended to ``log``, PID written to ``pid_file``. Returns the PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.unlink(missing_ok=True)
    # sh starts `setsid prog` in the background (not a group leader: setsid execs in
    # place, so $! is the program's PID) and exits; the program is orphaned to init.
    script = 'exec </dev/null >>"$1" 2>&1; shift; setsid "$@" & echo $! >"$0.tmp" && mv "$0.tmp" "$0"'
    with open(log, "ab") as fh:
        fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {shlex.join(args)}\n".encode())
    proc = subprocess.run(["sh", "-c", script, str(pid_file), str(log), *args], env=dict(env),
                          cwd=cwd, timeout=30, check=False)
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise ClusterError(f"could not start {args[0]} (status {proc.returncode}); "
                           f"{_tail(log)}") from exc
    return pid


def local_query(path: str | os.PathLike[str], request: Mapping[str, Any],
                timeout: float = 2.0) -> dict[str, Any]:
    """One request to an agent's local socket; ``{"ok": False, "error": ...}`` when it
    does not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        reply = json.loads(buf.split(b"\n", 1)[0])
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"{path}: {exc}"}
    return reply if isinstance(reply, dict) else {"ok": False, "error": "reply is not an object"}


def hello_times(db: Path) -> dict[str, float]:
    """{node: received_at of its latest hello} in a collector database (read-only)."""
    import sqlite3

    if not db.exists():
        return {}
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
    except sqlite3.Error:
        return {}
    try:
        rows = conn.execute("SELECT node, max(received_at) FROM messages WHERE type = 'hello' "
                            "GROUP BY node").fetchall()
    except sqlite3.Error:
        return {}
    finally:
        conn.close()
    return {str(n): float(t) for n, t in rows}



# ------------------------------------------------------------------------ cluster


class SimCluster:
    """One simulated cluster, living in one directory (see docs/simcluster.md)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.dir = Path(directory).expanduser() if directory is not None else default_directory()
        self.dir = self.dir.absolute()
        self._state: dict[str, Any] = self._load_state() or {}

    # ---- paths and recorded state

    @property
    def nodes(self) -> list[str]:
        return list(self._state.get("nodes", []))

    @property
    def gpus(self) -> int:
        return int(self._state.get("gpus", 0))

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def library(self) -> Path:
        return Path(self._state.get("library") or self.dir / "lib" / "libnvidia-ml.so.1")

    def node_dir(self, node: str) -> Path:
        self._check_node(node)
        return self.dir / "nodes" / node

    def scenario_path(self, node: str) -> Path:
        return self.node_dir(node) / "scenario.json"

    def kmsg_path(self, node: str) -> Path:
        return self.node_dir(node) / "kmsg"

    def jobs_dir(self, node: str) -> Path:
        """The node's per-job directories (``SLURMGPU_JOBS_DIR`` of its hooks and agent)."""
        return self.node_dir(node) / "jobs"

    def state_dir(self, node: str) -> Path:
        return self.node_dir(node) / "state"

    def hook(self, name: str) -> Path:
        if name not in HOOKS:
            raise ClusterError(f"unknown hook {name!r} (one of {', '.join(HOOKS)})")
        return self.dir / "hooks" / name

    def log_path(self, daemon: str) -> Path:
        """``slurmctld``, ``munged`` or a node name (its slurmd log)."""
        if daemon == "munged":
            return self.dir / "munge" / "munged.log"
        if daemon == "slurmctld":
            return self.dir / "log" / "slurmctld.log"
        return self.dir / "log" / f"slurmd-{daemon}.log"

    def _pid_file(self, daemon: str) -> Path:
        name = daemon if daemon in ("munged", "slurmctld") else f"slurmd-{daemon}"
        return self.dir / "run" / f"{name}.pid"

    # agents and collector

    @property
    def keys_dir(self) -> Path:
        return self.dir / "keys"

    def bundle_dir(self, node: str) -> Path:
        """The node's CURVE key bundle (``keys.add_node``'s default place)."""
        self._check_node(node)
        return self.keys_dir / "bundles" / node

    def agent_config_path(self, node: str) -> Path:
        return self.node_dir(node) / "agent.toml"

    def agent_socket(self, node: str) -> Path:
        """The agent's local socket: the path the hooks export as SLURMGPU_AGENT_SOCKET."""
        return Path(hook_environment(self.dir, node, self.library)["SLURMGPU_AGENT_SOCKET"])

    def agent_spool(self, node: str) -> Path:
        return self.node_dir(node) / "spool"

    def collector_db(self) -> Path:
        return self.dir / "fleet.db"

    @property
    def collector_address(self) -> str:
        port = self._state.get("collector_port")
        if not port:
            raise ClusterError(f"no collector port chosen yet in {self.dir}")
        return f"tcp://127.0.0.1:{port}"

    def _service_log(self, name: str) -> Path:
        return self.dir / "log" / f"{name}.log"

    def _service_pid(self, name: str) -> int | None:
        """PID of our collector (``collector``) or a node's agent (``agent-<node>``), if it
        runs and its command line names this cluster's files (PID reuse)."""
        try:
            pid = int((self.dir / "run" / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not _proc_alive(pid):
            return None
        argv = _cmdline(pid)
        if name == COLLECTOR:
            want = ("collector", str(self.collector_db()))
        else:
            want = ("agent", str(self.dir / "nodes" / name[len("agent-"):] / "agent.toml"))
        return pid if all(w in argv for w in want) else None

    def agent_pid(self, node: str) -> int | None:
        self._check_node(node)
        return self._service_pid(f"agent-{node}")

    def collector_pid(self) -> int | None:
        return self._service_pid(COLLECTOR)

    def _load_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.dir / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _save_state(self) -> None:
        _write_atomic(self.dir / STATE_FILE, json.dumps(self._state, indent=2) + "\n")

    def _check_node(self, node: str) -> None:
        if node not in self.nodes:
            known = ", ".join(self.nodes) or "none: the cluster was never brought up"
            raise ClusterError(f"unknown node {node!r} in {self.dir} (nodes: {known})")

    # ---- processes

    def _pid(self, daemon: str) -> int | None:
        """The PID recorded for a daemon, if that process is still running and is ours."""
        try:
            pid = int(self._pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not _proc_alive(pid):
            return None
        argv = _cmdline(pid)
        program = "slurmd" if daemon not in ("munged", "slurmctld") else daemon
        if not argv or Path(argv[0]).name != program:
            return None  # the PID was reused by something else
        marker = str(self.dir / "munge" / "munge.key") if daemon == "munged" else str(self.conf)
        return pid if any(marker in arg for arg in argv) else None

    def _daemons(self) -> list[str]:
        return ["munged", "slurmctld", *self.nodes]

    def _client_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env())
        return env

    def _run(self, args: list[str], *, timeout: float = 30, check: bool = True,
             input_text: str | None = None, cwd: Path | None = None) -> str:
        try:
            proc = subprocess.run(args, env=self._client_env(), capture_output=True, text=True,
                                  timeout=timeout, check=False, input=input_text, cwd=cwd)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"`{shlex.join(args)}` timed out after {timeout:.0f}s") from exc
        except OSError as exc:
            raise ClusterError(f"cannot run {args[0]}: {exc.strerror or exc}") from exc
        if check and proc.returncode != 0:
            msg = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
            raise ClusterError(f"`{shlex.join(args)}` failed: {msg}")
        return proc.stdout

    def _spawn(self, args: list[str], daemon: str) -> None:
        """Start a self-daemonizing program; its early stderr goes to log/<daemon>.stderr."""
        stderr_path = self.dir / "log" / f"{daemon}.stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.run(args, env=self._client_env(), stdin=subprocess.DEVNULL,
                                  stdout=err, stderr=err, timeout=30, check=False)
        if proc.returncode != 0:
            raise ClusterError(
                f"{args[0]} exited with status {proc.returncode}; {_tail(stderr_path)}; "
                f"{_tail(self.log_path(daemon))}"
            )

    # ---- public API

    def env(self) -> dict[str, str]:
        """What a Slurm client needs: SLURM_CONF, the cluster dir, and PATH when Slurm's
        directories are missing from it."""
        env = {"SLURM_CONF": str(self.conf), ENV_CLUSTER_DIR: str(self.dir)}
        extra = path_additions()
        if extra:
            env["PATH"] = os.pathsep.join([p for p in [os.environ.get("PATH", "")] if p] + extra)
        return env

    def shell_env(self) -> dict[str, str]:
        """``env`` plus the head node's config, for an operator's shell (`sim cluster env`):
        `fleet`, `report`, `breaker` and `jobs events` then read this cluster's database
        and automation state."""
        if self._state and not self.head_config.exists():
            self._write_head_config()
        return {**self.env(), "SLURMGPU_CONFIG": str(self.head_config)}

    def node_env(self, node: str) -> dict[str, str]:
        """The variables the hooks export for ``node`` (run slurmgpu as that node)."""
        self._check_node(node)
        return hook_environment(self.dir, node, self.library)

    def is_up(self) -> bool:
        """All our daemons run and slurmctld answers."""
        if not self._state or any(self._pid(d) is None for d in self._daemons()):
            return False
        return self._ping()

    def _ping(self) -> bool:
        try:
            out = self._run(["scontrol", "ping"], timeout=15, check=False)
        except ClusterError:
            return False
        return "is UP" in out

    def up(self, nodes: int = 4, gpus: int = 8,
           scenario: str | os.PathLike[str] = DEFAULT_SCENARIO, *,
           hooks_enabled: bool = True, timeout: float = 60, cpus: int | None = None,
           agents: bool | None = None, installed_hooks: Path | None = None) -> None:
        """Bring the cluster up (idempotent: a healthy cluster with these settings is kept).

        With ``agents`` (True, or None on a fresh cluster: the default) it also makes CURVE
        keys, starts one collector and one ``slurmgpu agent`` per node, and waits until
        every agent answers on its socket and has said hello to the collector. On a cluster
        that is already up, True/False starts/stops just the agents and the collector, and
        None keeps the choice made at its ``up``. ``installed_hooks``: slurm.conf's hooks run
        the wrappers a package installed there (see use_installed_hooks)."""
        if installed_hooks is not None:
            check_installed_hooks(installed_hooks)
        if not 1 <= nodes <= 64:
            raise ClusterError(f"--nodes must be 1..64, not {nodes}")
        if not 1 <= gpus <= 64:
            raise ClusterError(f"--gpus must be 1..64, not {gpus}")
        wanted = {"nodes": node_names(nodes), "gpus": gpus, "scenario": str(scenario)}
        if self.is_up():
            have = {k: self._state.get(k) for k in wanted}
            if have == wanted:
                if installed_hooks is not None and self.installed_hooks != installed_hooks:
                    self.use_installed_hooks(installed_hooks)
                if self._state.get("hooks_at_up") != hooks_enabled or \
                        self._state.get("hooks_enabled") != hooks_enabled:
                    self._state["hooks_at_up"] = hooks_enabled
                    self.set_hooks_enabled(hooks_enabled)
                if agents is None:
                    agents = bool(self._state.get("agents_at_up"))
                if self._state.get("agents_at_up") != agents:
                    self._state["agents_at_up"] = agents
                    self._save_state()
                if agents:
                    self.start_agents(timeout)
                else:
                    self.stop_agents()
                return
            raise ClusterError(
                f"a cluster with {len(self.nodes)} nodes x {self.gpus} GPUs "
                f"(scenario {self._state.get('scenario')}) is already up in {self.dir}; "
                "run `slurmgpu sim cluster down` first"
            )
        if self._state or (self.dir / STATE_FILE).exists():
            self._stop_daemons()
        elif self.dir.exists() and any(self.dir.iterdir()):
            raise ClusterError(f"{self.dir} exists, is not empty and holds no simulated cluster")
        if os.geteuid() != 0:
            raise SlurmNotAvailable("the simulated Slurm cluster must run as root")
        ensure_slurm_installed()
        base = fit_scenario(self._load_named(scenario), gpus) if gpus != BUNDLED_GPUS \
            else self._load_named(scenario)
        agents = True if agents is None else agents
        self._state = self._new_state(wanted, hooks_enabled, cpus, agents)
        self._state["installed_hooks"] = str(installed_hooks) if installed_hooks is not None else None
        self._prepare(base)
        try:
            deadline = time.monotonic() + timeout
            self._start(timeout)
            if agents:
                self.start_agents(max(deadline - time.monotonic(), 15))
        except ClusterError:
            self._stop_daemons()  # leave nothing half-up; the logs stay for a look
            raise

    def _load_named(self, scenario: str | os.PathLike[str]) -> dict[str, Any]:
        from slurmgpu.sim.scenario import load_scenario

        return load_scenario(scenario)

    def _new_state(self, wanted: dict[str, Any], hooks_enabled: bool,
                   cpus: int | None, agents: bool = False) -> dict[str, Any]:
        old_ports = [self._state.get("ctld_port"), *self._state.get("node_ports", [])]
        ports = pick_ports(len(wanted["nodes"]) + 1,
                           prefer=old_ports if None not in old_ports else None)
        old_collector = self._state.get("collector_port")
        collector_port = pick_ports(1, start=COLLECTOR_BASE_PORT,
                                    prefer=[old_collector] if old_collector else None)[0]
        version = slurm_version()
        ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
        return {
            **wanted,
            "slurm_version": "{}.{:02d}.{}".format(*version),
            "ctld_port": ports[0],
            "node_ports": ports[1:],
            # One CPU per GPU at least, so one 1-GPU job per GPU can run at once.
            "cpus": cpus or max(ncpu, wanted["gpus"], 2),
            "memory_mb": 16000,
            "hooks_enabled": hooks_enabled,  # now (set_hooks_enabled)
            "hooks_at_up": hooks_enabled,  # what reset() restores
            "agents_at_up": agents,  # agents + collector (what reset() restores)
            "collector_port": collector_port,
            "library": str(self.dir / "lib" / "libnvidia-ml.so.1"),
            "owner_pid": os.getpid(),
            "started": time.time(),
        }

    def _prepare(self, base: dict[str, Any]) -> None:
        """Write every file of a fresh cluster (logs and spool from a previous run go)."""
        from slurmgpu.sim.build import build_library
        from slurmgpu.sim.scenario import write_scenario

        d = self.dir
        for sub in ("log", "spool", "run", "hooks", "jobs", "nodes", "cgroup", "keys"):
            shutil.rmtree(d / sub, ignore_errors=True)
        for suffix in ("", "-wal", "-shm"):
            (d / f"fleet.db{suffix}").unlink(missing_ok=True)
        for sub in ("etc", "log", "spool/slurmctld", "run", "hooks", "jobs", "nodes", "lib",
                    "cgroup"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        self._state["library"] = str(build_library(d / "lib"))
        self._save_state()
        write_scenario(d / "scenario.base.json", base)
        for node in self.nodes:
            self._prepare_node(node, base)
        major, minor, patch = (int(x) for x in self._state["slurm_version"].split("."))
        _write_atomic(self.conf, render_slurm_conf(d, self._state))
        _write_atomic(d / "etc" / "gres.conf", render_gres_conf(d, self._state))
        _write_atomic(d / "etc" / "cgroup.conf", render_cgroup_conf(d, (major, minor, patch)))
        _write_atomic(d / "etc" / "plugstack.conf", "# no SPANK plugins\n")
        self.write_config(self.default_config())
        self.set_hooks_enabled(bool(self._state["hooks_enabled"]))

    def _prepare_node(self, node: str, base: dict[str, Any]) -> None:
        from slurmgpu.sim.scenario import write_scenario

        nd = self.dir / "nodes" / node
        shutil.rmtree(nd, ignore_errors=True)
        (nd / "state").mkdir(parents=True)
        (nd / "jobs").mkdir()
        (nd / "dev").mkdir()
        (self.dir / "spool" / node).mkdir(parents=True, exist_ok=True)
        write_scenario(nd / "scenario.json", base)
        (nd / "kmsg").write_text("", encoding="utf-8")
        for index in range(self.gpus):
            dev = nd / "dev" / f"nvidia{index}"
            try:
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
            except OSError as exc:
                raise ClusterError(
                    f"cannot create the GRES device {dev} (mknod c {NVIDIA_MAJOR} {index}): "
                    f"{exc.strerror or exc}"
                ) from exc
            dev.chmod(0o666)

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._start_munged()
        self._spawn(["slurmctld", "-c", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self._pid("slurmctld") is not None and self._ping(), deadline,
                   lambda: f"slurmctld did not come up; {_tail(self.log_path('slurmctld'))}")
        for node in self.nodes:
            self._spawn(["slurmd", "-N", node, "-f", str(self.conf)], node)
        self.wait_idle(max(deadline - time.monotonic(), 5))

    def _start_munged(self) -> None:
        m = self.dir / "munge"
        m.mkdir(exist_ok=True)
        m.chmod(0o755)  # munged wants the socket's directory searchable by everyone
        key = m / "munge.key"
        if not key.is_file():
            if shutil.which("mungekey"):
                self._run(["mungekey", "--create", f"--keyfile={key}"])
            else:
                key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn([
            "munged", "--force", f"--key-file={key}", f"--socket={m}/munge.socket.2",
            f"--pid-file={self._pid_file('munged')}", f"--seed-file={m}/munged.seed",
            f"--log-file={m}/munged.log",
        ], "munged")
        self._wait(lambda: self._pid("munged") is not None and (m / "munge.socket.2").exists(),
                   time.monotonic() + 10, lambda: f"munged did not start; {_tail(m / 'munged.log')}")

    @staticmethod
    def _wait(ready: Callable[[], bool], deadline: float, why: Callable[[], str],
              interval: float = 0.1) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise ClusterError(why())
            time.sleep(interval)

    def node_states(self) -> dict[str, str]:
        """sinfo's long state per node: idle, allocated, mixed, drained, idle*, down*..."""
        out = self._run(["sinfo", "-h", "-N", "-o", "%N|%T"], timeout=15)
        states = {}
        for line in out.splitlines():
            name, _, state = line.partition("|")
            states[name.strip()] = state.strip()
        return states

    def node_reasons(self) -> dict[str, str]:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N|%E"], timeout=15)
        return {n.strip(): r.strip() for n, _, r in (ln.partition("|") for ln in out.splitlines())}

    def wait_idle(self, timeout: float = 30, nodes: Iterable[str] | None = None) -> None:
        """Wait until every (given) node is idle. Fails early when a slurmd died or a node is
        INVAL (config mismatch); the error carries the state and slurmd/slurmctld log tails."""
        names = list(nodes) if nodes is not None else self.nodes
        start = time.monotonic()
        deadline = start + timeout
        grace = start + 2  # a just-started slurmd may not have its pid file yet
        states: dict[str, str] = {}
        while True:
            with contextlib.suppress(ClusterError):
                states = self.node_states()
            busy = [n for n in names if states.get(n) != "idle"]
            if not busy:
                return
            now = time.monotonic()
            dead = [n for n in busy if self._pid(n) is None] if now > grace else []
            broken = dead + [n for n in busy if states.get(n, "").startswith("inval")]
            if broken or now > deadline:
                detail = ", ".join(f"{n}: {states.get(n, '?')}"
                                   f"{' (slurmd not running)' if n in dead else ''}"
                                   for n in busy)
                logs = "; ".join(_tail(self.log_path(n), 4) for n in (broken or busy)[:2])
                raise ClusterError(f"nodes not idle after {now - start:.1f}s "
                                   f"({detail}); {logs}; {_tail(self.log_path('slurmctld'), 3)}")
            time.sleep(0.1)

    def down(self, *, purge: bool = False) -> None:
        """Stop this cluster's daemons (only the PIDs it recorded); ``purge`` removes the dir."""
        if not (self.dir / STATE_FILE).exists():
            if purge and self.dir.exists() and any(self.dir.iterdir()):
                raise ClusterError(f"{self.dir} holds no simulated cluster; not removing it")
            return
        if self._pid("slurmctld") is not None:
            with contextlib.suppress(ClusterError):
                self.cancel_all(timeout=10)
        self._stop_daemons()
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            self._state = {}

    def _stop_daemons(self, grace: float = 10) -> None:
        self.stop_agents(grace)
        slurm = [p for p in (self._pid(n) for n in [*self.nodes, "slurmctld"]) if p]
        _terminate(slurm, grace)
        munged = self._pid("munged")
        if munged:
            _terminate([munged], grace)
        for daemon in self._daemons():
            self._pid_file(daemon).unlink(missing_ok=True)

    def stop_controller(self, grace: float = 10) -> None:
        """Stop slurmctld only (to test what slurmgpu does when it is unreachable)."""
        pid = self._pid("slurmctld")
        if pid is not None:
            _terminate([pid], grace)

    def start_controller(self, timeout: float = 30) -> None:
        """Start slurmctld again, keeping its saved state (no -c), and wait for it."""
        if self._pid("slurmctld") is None:
            self._spawn(["slurmctld", "-f", str(self.conf)], "slurmctld")
        deadline = time.monotonic() + timeout
        self._wait(lambda: self._pid("slurmctld") is not None and self._ping(), deadline,
                   lambda: f"slurmctld did not come back; {_tail(self.log_path('slurmctld'))}")

    def job_ids(self) -> list[str]:
        """Jobs slurmctld still tracks that are not finished (pending, running, completing...)."""
        out = self._run(["squeue", "-h", "-o", "%A|%T"], timeout=15)
        return [j for j, _, s in (ln.partition("|") for ln in out.split()) if s not in
                TERMINAL_JOB_STATES]

    def cancel_all(self, timeout: float = 30) -> None:
        """scancel every job until none is left. A job whose prolog failed is requeued by
        slurmctld, and a cancel that arrives while it is requeued can be lost: ask again."""
        deadline = time.monotonic() + timeout
        asked = 0.0
        while ids := self.job_ids():
            now = time.monotonic()
            if now > deadline:
                raise ClusterError(f"jobs still queued after scancel: {', '.join(ids)}")
            if now - asked >= 2.0:
                self._run(["scancel", *ids], check=False)
                asked = now
            time.sleep(0.2)

    def status(self) -> dict[str, Any]:
        daemons = {d: self._pid(d) for d in ("munged", "slurmctld")}
        ping = daemons["slurmctld"] is not None and self._ping()
        states: dict[str, str] = {}
        if ping:
            with contextlib.suppress(ClusterError):
                states = self.node_states()
        nodes = []
        for node, port in zip(self.nodes, self._state.get("node_ports", []), strict=False):
            pid = self._pid(node)
            agent = self._service_pid(f"agent-{node}")
            nodes.append({"name": node, "state": states.get(node, "unknown"), "port": port,
                          "slurmd_pid": pid, "slurmd_running": pid is not None,
                          "agent_pid": agent, "agent_running": agent is not None})
        collector = self._service_pid(COLLECTOR)
        agents = bool(self._state.get("agents_at_up"))
        up = bool(self._state) and ping and all(n["slurmd_running"] for n in nodes) and \
            daemons["munged"] is not None and \
            (not agents or (collector is not None and all(n["agent_running"] for n in nodes)))
        return {
            "dir": str(self.dir),
            "up": up,
            "exists": bool(self._state),
            "slurm_version": self._state.get("slurm_version"),
            "gpus": self.gpus,
            "scenario": self._state.get("scenario"),
            "hooks_enabled": self._state.get("hooks_enabled"),
            "installed_hooks": self._state.get("installed_hooks"),
            "slurm_conf": str(self.conf),
            "munged": {"pid": daemons["munged"], "running": daemons["munged"] is not None},
            "slurmctld": {"pid": daemons["slurmctld"], "running": daemons["slurmctld"] is not None,
                          "port": self._state.get("ctld_port"), "responding": ping},
            "agents": agents,
            "collector": {"pid": collector, "running": collector is not None,
                          "address": (f"tcp://127.0.0.1:{self._state['collector_port']}"
                                      if self._state.get("collector_port") else None),
                          "db": str(self.collector_db())},
            "nodes": nodes,
        }

    # ---- GPUs, hooks, config

    def inject(self, node: str, scenario: str | os.PathLike[str] | dict[str, Any]) -> None:
        """Replace ``node``'s simulated GPUs, atomically (running NVML users see the change).

        A bundled scenario name is fitted to the cluster's GPU count like at ``up``; a file or
        a dict is written as it is.
        """
        from slurmgpu.sim.scenario import (
            SCENARIO_DIR,
            resolve_scenario,
            validate_scenario,
            write_scenario,
        )

        self._check_node(node)
        if isinstance(scenario, dict):
            validate_scenario(scenario)
            data = scenario
        else:
            data = self._load_named(scenario)
            bundled = resolve_scenario(scenario).parent == SCENARIO_DIR
            if bundled and self.gpus != BUNDLED_GPUS:
                data = fit_scenario(data, self.gpus)
        write_scenario(self.scenario_path(node), data)
        self._mark_agent_dirty(node)

    def inject_xid(self, node: str, gpu: int, xid: int, text: str = "simulated XID") -> None:
        """Log XID ``xid`` for GPU ``gpu`` in the node's kernel log and as an NVML event."""
        from slurmgpu.sim.scenario import write_scenario
        from slurmgpu.sources.kmsg import append_xid

        path = self.scenario_path(node)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {path}: {exc}") from exc
        gpus = data.get("gpus") or []
        if not 0 <= gpu < len(gpus):
            raise ClusterError(f"{node} has no GPU {gpu} (it has {len(gpus)})")
        bus_id = str((gpus[gpu].get("pci") or {}).get("bus_id", ""))
        try:
            append_xid(str(self.kmsg_path(node)), bus_id, xid, text)
        except ValueError as exc:
            raise ClusterError(f"{node} GPU {gpu}: {exc}") from exc
        events = data.setdefault("events", [])
        # Ids unique across resets (microseconds): the fake delivers each id once per
        # event set, so a restarted count would hide new events from a running agent.
        next_id = max([int(e.get("id", i + 1)) for i, e in enumerate(events)] +
                      [time.time_ns() // 1000]) + 1
        events.append({"gpu": gpu, "type": XID_EVENT_TYPE, "data": xid, "id": next_id})
        write_scenario(path, data)
        self._mark_agent_dirty(node)

    def default_config(self) -> str:
        return DEFAULT_SLURMGPU_TOML.format(gpus=self.gpus or BUNDLED_GPUS)

    def write_config(self, text: str) -> None:
        """Replace ``etc/slurmgpu.toml``, the slurmgpu config every hook reads."""
        (self.dir / "etc").mkdir(parents=True, exist_ok=True)
        _write_atomic(self.dir / "etc" / "slurmgpu.toml", text)
        # Agents read their config once: restart the running ones that run another text.
        stale = [n for n in self.nodes if self._service_pid(f"agent-{n}") is not None
                 and self._state.get("agent_configs", {}).get(n) != _digest(text)]
        if stale:
            self._restart_agents(stale)

    def set_hooks_enabled(self, enabled: bool) -> None:
        """Rewrite the hooks: slurmgpu's prolog/epilog/healthcheck, or ``exit 0``.

        slurmd runs the files afresh for every job, so this takes effect at once.
        """
        installed = self.installed_hooks
        for name in HOOKS:
            _write_atomic(self.hook(name), render_hook(
                name, self.dir, self.library, enabled=enabled or name in ALWAYS_ON_HOOKS,
                installed=installed), 0o755)
        if self._state:
            self._state["hooks_enabled"] = enabled
            self._save_state()

    @property
    def installed_hooks(self) -> Path | None:
        """The directory of a package's wrappers the hooks run (None: this checkout's)."""
        value = self._state.get("installed_hooks")
        return Path(value) if value else None

    def use_installed_hooks(self, libexec: Path | None) -> None:
        """Run the wrappers installed in ``libexec`` as a package installs them (kept across
        reset; None: back to this checkout's): slurmgpu is then found as on a real node,
        through /etc/default/slurmgpu or the packaged paths, never through this process."""
        if libexec is not None:
            check_installed_hooks(libexec)
        if not self._state:
            raise ClusterError(f"no simulated cluster in {self.dir}")
        self._state["installed_hooks"] = str(libexec) if libexec is not None else None
        self.set_hooks_enabled(True)

    def run_hook(self, name: str, node: str, env: Mapping[str, str] | None = None,
                 *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a hook the way slurmd does: as this user, with (almost) no environment.

        Prolog and epilog get SLURMD_NODENAME, SLURM_CONF and SLURM_SCRIPT_CONTEXT; the health
        check only SLURMD_NODENAME. Add the job's variables (SLURM_JOB_ID, SLURM_JOB_GPUS,
        CUDA_VISIBLE_DEVICES, SLURM_JOB_USER...) with ``env``. No PATH, as on 22.05.
        """
        self._check_node(node)
        run_env = {"SLURMD_NODENAME": node}
        if name != "healthcheck":
            run_env["SLURM_CONF"] = str(self.conf)
            run_env["SLURM_SCRIPT_CONTEXT"] = f"{name}_slurmd"
        run_env.update(env or {})
        return subprocess.run([str(self.hook(name))], env=run_env, capture_output=True,
                              text=True, timeout=timeout, check=False, cwd=self.dir / "log")

    def reset(self, timeout: float = 60) -> None:
        """Back to the state right after ``up``: no jobs, up() scenario on every node, empty
        kmsg and state dirs, default slurmgpu.toml, hooks as at up, a slurmd for every node
        (restarted if it died), drained/down nodes resumed, every node idle."""
        from slurmgpu.sim.scenario import load_scenario, write_scenario

        if not self._state:
            raise ClusterError(f"no simulated cluster in {self.dir}")
        enabled = bool(self._state.get("hooks_at_up", True))
        self.set_hooks_enabled(False)  # cancelled jobs' epilogs must not drain nodes
        try:
            self.cancel_all(timeout)
            base = load_scenario(self.dir / "scenario.base.json")
            for node in self.nodes:
                write_scenario(self.scenario_path(node), base)
                self.kmsg_path(node).write_text("", encoding="utf-8")
                _empty_dir(self.state_dir(node))
            self.write_config(self.default_config())
            for node in self.nodes:
                _empty_dir(self.jobs_dir(node))
            if self._state.get("automation") is not None:
                self.set_automation(None, timeout)
            if self._state.get("agents_at_up"):
                # Dead agents come back; agents of nodes a test injected into are restarted
                # (they remember XIDs for an hour and NVML event ids per event set).
                dirty = set(self._state.get("agents_dirty", []))
                self._start_collector()
                self._restart_agents([n for n in self.nodes if n in dirty or
                                      self._service_pid(f"agent-{n}") is None], timeout)
            else:
                self.stop_agents()
            for node in self.nodes:  # a test may have killed a slurmd
                if self._pid(node) is None:
                    self._spawn(["slurmd", "-N", node, "-f", str(self.conf)], node)
            self._resume_all()
            self.wait_idle(timeout)
        finally:
            self.set_hooks_enabled(enabled)

    def _reboot_slurmd(self, node: str, timeout: float = 15) -> None:
        """Finish a reboot the RebootProgram (/bin/true) never did: restart the node's
        slurmd with -b, which tells slurmctld the node has just booted."""
        pid = self._pid(node)
        if pid is not None:
            _terminate([pid], timeout)
        self._spawn(["slurmd", "-b", "-N", node, "-f", str(self.conf)], node)

    def _resume_all(self) -> None:
        """Resume drained, draining and down nodes (idle* just waits for its slurmd)."""
        for node, state in self.node_states().items():
            if state.endswith("^"):  # reboot issued: "reboot" it (slurmd -b says it booted)
                self._reboot_slurmd(node)
            elif "reboot" in state or state.endswith("@"):  # reboot pending: cancel it
                self._run(["scontrol", "cancel_reboot", node], check=False)
            if any(word in state for word in ("drain", "down", "fail")):
                self._run(["scontrol", "update", f"nodename={node}", "state=resume"],
                          check=False)


    # ---- agents and collector

    def _mark_agent_dirty(self, node: str) -> None:
        dirty = self._state.setdefault("agents_dirty", [])
        if self._state and node not in dirty:
            dirty.append(node)
            self._save_state()

    def _ensure_keys(self) -> None:
        """The collector keypair and one bundle per node under ``<dir>/keys``."""
        from slurmgpu import keys

        if not (self.keys_dir / "collector.key_secret").is_file():
            shutil.rmtree(self.keys_dir, ignore_errors=True)
            keys.init(self.keys_dir)
        for node in self.nodes:
            if not (self.bundle_dir(node) / "node.key_secret").is_file():
                keys.add_node(self.keys_dir, node, force=True)

    def _service_env(self, node: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
               and not k.startswith("SLURMGPU_") and not k.startswith("PYTEST")}
        env.update(self.env())
        if node is not None:
            env.update(self.node_env(node))
            env["SLURMD_NODENAME"] = node
        elif _needs_pythonpath():
            env["PYTHONPATH"] = str(repo_root())
        path = env.get("PATH", "")
        env["PATH"] = os.pathsep.join([p for p in [path] if p] +
                                      [p for p in SANE_PATH.split(os.pathsep)
                                       if p not in path.split(os.pathsep)])
        return env

    @property
    def head_config(self) -> Path:
        """The head node's config (the collector's, and what `fleet`, `report`, `breaker`
        and `jobs events` read: `sim cluster env` exports it as $SLURMGPU_CONFIG)."""
        return self.dir / "etc" / "collector.toml"

    def _write_head_config(self) -> Path:
        config = self.head_config
        address = self.collector_address if self._state.get("collector_port") else ""
        automation = self._state.get("automation")
        _write_atomic(config, (
            "# Generated by `slurmgpu sim cluster`: the simulated cluster's collector.\n"
            "[collector]\n"
            + (f"bind = {json.dumps(address)}\naddress = {json.dumps(address)}\n" if address else "")
            + f"db = {json.dumps(str(self.collector_db()))}\n"
            f"keys_dir = {json.dumps(str(self.keys_dir))}\n"
            f"heartbeat_s = {AGENT_HEARTBEAT_S}\n"
            f"slurm_poll_s = {COLLECTOR_SLURM_POLL_S}\n"
            f"[paths]\nstate_dir = {json.dumps(str(self.collector_state_dir))}\n"
            + (f"[automation]\nenabled = true\n{automation}\n" if automation is not None else "")))
        return config

    @property
    def collector_state_dir(self) -> Path:
        """The collector's ``paths.state_dir`` (the automation's state file, its journal)."""
        return self.dir / "collector-state"

    def automation_settings(self) -> str | None:
        """The collector's extra ``[automation]`` lines (None: automation off)."""
        value = self._state.get("automation") if self._state else None
        return value if isinstance(value, str) else None

    def set_automation(self, settings: str | None, timeout: float = 15) -> None:
        """Restart the collector with ``[automation] enabled = true`` plus ``settings`` (TOML
        lines of that table), or without automation (None). Its state starts afresh."""
        if not self._state:
            raise ClusterError(f"no simulated cluster in {self.dir}")
        self.kill_collector(signal.SIGTERM)
        self._clear_automation_state()
        if settings is None:
            self._state.pop("automation", None)
        else:
            self._state["automation"] = settings
        self._save_state()
        self._start_collector(timeout)

    def _clear_automation_state(self) -> None:
        """With the collector stopped: no automation state, no pending checkpoints."""
        import sqlite3

        _empty_dir(self.collector_state_dir)
        if self.collector_db().is_file():
            db = sqlite3.connect(str(self.collector_db()), timeout=10)
            try:
                with db:
                    for table in ("pending_drains", "checkpoints", "job_events", "decisions"):
                        with contextlib.suppress(sqlite3.OperationalError):  # older schema
                            db.execute(f"DELETE FROM {table}")
            finally:
                db.close()

    def start_collector(self, timeout: float = 15) -> None:
        """Start the collector again (same port and database) after a stop or a kill."""
        self._start_collector(timeout)

    def kill_collector(self, sig: int = 9) -> None:
        """Kill the collector (SIGKILL by default) to test that nothing is lost."""
        pid = self.collector_pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while _proc_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _start_collector(self, timeout: float = 15) -> None:
        """Start the collector (if ours is not running) and wait until it listens."""
        if not self._state:
            raise ClusterError(f"no simulated cluster in {self.dir}")
        if self._service_pid(COLLECTOR) is not None:
            return
        self._ensure_keys()
        port = self._state.get("collector_port")
        if not port or not _port_free(int(port)):
            port = pick_ports(1, start=COLLECTOR_BASE_PORT)[0]
            self._state["collector_port"] = port
            self._save_state()
        address = self.collector_address
        config = self._write_head_config()
        log = self._service_log(COLLECTOR)
        spawn_detached([sys.executable, "-m", "slurmgpu", "collector", "--config", str(config),
                        "--bind", address, "--db", str(self.collector_db()),
                        "--keys-dir", str(self.keys_dir)],
                       env=self._service_env(), log=log,
                       pid_file=self.dir / "run" / f"{COLLECTOR}.pid", cwd=self.dir)
        deadline = time.monotonic() + timeout
        grace = time.monotonic() + 1

        def listening() -> bool:
            if self._service_pid(COLLECTOR) is None:
                if time.monotonic() > grace:
                    raise ClusterError(f"the collector exited; {_tail(log)}")
                return False
            with socket.socket() as sock:
                sock.settimeout(0.2)
                return sock.connect_ex(("127.0.0.1", int(port))) == 0

        self._wait(listening, deadline, lambda: f"the collector does not listen on {address} "
                   f"after {timeout:.0f}s; {_tail(log)}", 0.05)

    def _write_agent_config(self, node: str) -> str:
        """Write ``nodes/<node>/agent.toml`` from the current slurmgpu.toml; its digest."""
        base = (self.dir / "etc" / "slurmgpu.toml").read_text(encoding="utf-8")
        self.agent_spool(node).mkdir(parents=True, exist_ok=True)
        _write_atomic(self.agent_config_path(node), render_agent_config(
            base, socket_path=self.agent_socket(node), spool=self.agent_spool(node),
            address=self.collector_address, keys_dir=self.bundle_dir(node),
            jobs_dir=self.jobs_dir(node)))
        return _digest(base)

    def _spawn_agent(self, node: str) -> None:
        digest = self._write_agent_config(node)
        spawn_detached([sys.executable, "-m", "slurmgpu", "agent", "--node", node,
                        "--config", str(self.agent_config_path(node)),
                        "--keys-dir", str(self.bundle_dir(node))],
                       env=self._service_env(node), log=self._service_log(f"agent-{node}"),
                       pid_file=self.dir / "run" / f"agent-{node}.pid", cwd=self.node_dir(node))
        self._state.setdefault("agent_configs", {})[node] = digest
        dirty = self._state.get("agents_dirty", [])
        if node in dirty:
            dirty.remove(node)
        self._save_state()

    def _wait_agents(self, nodes: Iterable[str], since: float | None, timeout: float) -> None:
        """Wait until each agent answers ``status`` on its socket and the collector has a
        hello from it (received at or after ``since``, when given)."""
        waiting = list(nodes)
        start = time.monotonic()
        deadline = start + timeout
        while waiting:
            hellos = hello_times(self.collector_db())
            for node in list(waiting):
                if self._service_pid(f"agent-{node}") is None and time.monotonic() > start + 1:
                    raise ClusterError(f"the agent of {node} exited; "
                                       f"{_tail(self._service_log(f'agent-{node}'))}")
                said_hello = node in hellos and (since is None or hellos[node] >= since)
                if said_hello and local_query(self.agent_socket(node), {"op": "status"},
                                              0.5).get("ok"):
                    waiting.remove(node)
            if not waiting:
                return
            if time.monotonic() > deadline:
                node = waiting[0]
                raise ClusterError(
                    f"agents not ready after {timeout:.0f}s ({', '.join(waiting)}: no hello in "
                    f"{self.collector_db()} or no answer on the socket); "
                    f"{_tail(self._service_log(f'agent-{node}'))}; "
                    f"{_tail(self._service_log(COLLECTOR), 3)}")
            time.sleep(0.05)

    def start_agents(self, timeout: float = 30) -> None:
        """Start the collector and every node's agent that is not running; wait for them."""
        self._start_collector()
        todo = [n for n in self.nodes if self._service_pid(f"agent-{n}") is None]
        since = time.time()
        for node in todo:
            self._spawn_agent(node)
        self._wait_agents(todo, since, timeout)
        self._wait_agents([n for n in self.nodes if n not in todo], None, timeout)

    def stop_agents(self, grace: float = 10) -> None:
        """Stop every agent and the collector (only the PIDs this cluster recorded)."""
        names = [f"agent-{n}" for n in self.nodes]
        _terminate([p for p in (self._service_pid(n) for n in names) if p], grace)
        collector = self._service_pid(COLLECTOR)
        if collector:
            _terminate([collector], grace)
        for name in [*names, COLLECTOR]:
            (self.dir / "run" / f"{name}.pid").unlink(missing_ok=True)

    def _restart_agents(self, nodes: list[str], timeout: float = 30) -> None:
        if not nodes:
            return
        _terminate([p for p in (self._service_pid(f"agent-{n}") for n in nodes) if p], 10)
        self._start_collector()
        since = time.time()
        for node in nodes:
            self._spawn_agent(node)
        self._wait_agents(nodes, since, timeout)

    def restart_agent(self, node: str, timeout: float = 30) -> None:
        """Stop (SIGTERM) the node's agent if it runs, start it with the current config,
        and wait until it answers and has said hello to the collector again."""
        self._check_node(node)
        self._restart_agents([node], timeout)

    def kill_agent(self, node: str, signal: int = 9) -> None:
        """Send ``signal`` (default SIGKILL) to the node's agent; for a kill, wait until it
        is gone. Its socket file and spool stay behind, as after a crash."""
        pid = self.agent_pid(node)
        if pid is None:
            raise ClusterError(f"no agent runs for {node}")
        os.kill(pid, signal)
        if signal in (9, 15):
            self._wait(lambda: not _proc_alive(pid), time.monotonic() + 15,
                       lambda: f"the agent of {node} (pid {pid}) did not exit", 0.02)

    def agent_status(self, node: str, timeout: float = 2.0) -> dict[str, Any]:
        """The agent's ``{"op": "status"}`` answer (``{"ok": False, ...}`` if none)."""
        self._check_node(node)
        return local_query(self.agent_socket(node), {"op": "status"}, timeout)

    # ---- Slurm clients

    def scontrol(self, *args: str) -> str:
        return self._run(["scontrol", *args])

    def sbatch(self, script: str, *args: str) -> str:
        """Submit a batch job and return its id. ``script`` is the script's text (a ``#!``
        line is added when missing); pass ``""`` with ``--wrap CMD`` in ``args``. The job runs
        in ``<dir>/jobs``, so its default output is ``<dir>/jobs/slurm-<id>.out``."""
        cmd = ["sbatch", "--parsable", *args]
        text = None
        if script:
            text = script if script.startswith("#!") else "#!/bin/sh\n" + script
        out = self._run(cmd, input_text=text, cwd=self.dir / "jobs")
        return out.strip().split(";")[0]

    def job_output(self, job_id: str) -> str:
        path = self.dir / "jobs" / f"slurm-{job_id}.out"
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ClusterError(f"no output for job {job_id} at {path}") from exc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -d -o`` as a dict (JobState, NodeList, Reason, GRES...)."""
        out = self.scontrol("show", "job", "-d", "-o", str(job_id))
        return dict(re.findall(r"(\S+?)=(\S*)", out))

    def wait_job(self, job_id: str, states: Iterable[str] = ("COMPLETED",),
                 timeout: float = 60) -> str:
        """Wait until the job reaches one of ``states`` or a final state; return that state."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "?")
            if state in wanted or state in TERMINAL_JOB_STATES:
                return state
            time.sleep(0.2)
        raise ClusterError(f"job {job_id} still {state} after {timeout:.0f}s")


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _empty_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _terminate(pids: list[int], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_proc_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _proc_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
