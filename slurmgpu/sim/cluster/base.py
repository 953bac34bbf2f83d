"""The simulated cluster's directory: its paths, its recorded state (cluster.json), its
daemons' PIDs and how Slurm clients are run against it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmgpu.sim.cluster.common import (
    COLLECTOR,
    ENV_CLUSTER_DIR,
    HOOKS,
    STATE_FILE,
    ClusterError,
    default_directory,
    log_tail,
    write_atomic,
)
from slurmgpu.sim.cluster.install import path_additions, prefix_dirs
from slurmgpu.sim.cluster.procs import proc_alive, proc_cmdline
from slurmgpu.sim.cluster.render import hook_environment


class ClusterBase:
    """One simulated cluster, living in one directory (see docs/simcluster.md): paths,
    state and process helpers shared by the layers that make up ``SimCluster``."""

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
    def slurm_prefix(self) -> Path | None:
        """The Slurm build the cluster runs (tools/build_slurm.sh), None: Debian's packages."""
        value = self._state.get("slurm_prefix")
        return Path(value) if value else None

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
        if not proc_alive(pid):
            return None
        argv = proc_cmdline(pid)
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
        write_atomic(self.dir / STATE_FILE, json.dumps(self._state, indent=2) + "\n")

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
        if not proc_alive(pid):
            return None
        argv = proc_cmdline(pid)
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
                f"{args[0]} exited with status {proc.returncode}; {log_tail(stderr_path)}; "
                f"{log_tail(self.log_path(daemon))}"
            )

    # ---- environments, scenarios, waiting

    def env(self) -> dict[str, str]:
        """What a Slurm client needs: SLURM_CONF, the cluster dir, and PATH when Slurm's
        directories are missing from it (a prefix's bin and sbin first)."""
        env = {"SLURM_CONF": str(self.conf), ENV_CLUSTER_DIR: str(self.dir)}
        first = prefix_dirs(self.slurm_prefix)
        extra = path_additions()
        if first or extra:
            env["PATH"] = os.pathsep.join(
                [*first, *[p for p in [os.environ.get("PATH", "")] if p], *extra])
        return env

    def node_env(self, node: str) -> dict[str, str]:
        """The variables the hooks export for ``node`` (run slurmgpu as that node)."""
        self._check_node(node)
        return hook_environment(self.dir, node, self.library, slurm_prefix=self.slurm_prefix)

    def _load_named(self, scenario: str | os.PathLike[str]) -> dict[str, Any]:
        from slurmgpu.sim.scenario import load_scenario

        return load_scenario(scenario)

    @staticmethod
    def _wait(ready: Callable[[], bool], deadline: float, why: Callable[[], str],
              interval: float = 0.1) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise ClusterError(why())
            time.sleep(interval)

    def _mark_agent_dirty(self, node: str) -> None:
        dirty = self._state.setdefault("agents_dirty", [])
        if self._state and node not in dirty:
            dirty.append(node)
            self._save_state()
