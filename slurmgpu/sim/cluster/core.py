"""``SimCluster``: bring a simulated cluster up (idempotent), its status, reset and down.

The layers it is built from, one module each: ``base`` (directory, state, PIDs),
``services`` (keys, collector, agents), ``gpus`` (scenario and XID injection, config,
hooks), ``daemons`` (munged, slurmctld, slurmd; Slurm clients).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from slurmgpu.sim.cluster.common import (
    BUNDLED_GPUS,
    COLLECTOR,
    COLLECTOR_BASE_PORT,
    DEFAULT_SCENARIO,
    DEMO_DIR,
    ENV_CLUSTER_DIR,
    NVIDIA_MAJOR,
    STATE_FILE,
    ClusterError,
    SlurmNotAvailable,
    default_directory,
    empty_dir,
    node_names,
    write_atomic,
)
from slurmgpu.sim.cluster.daemons import SlurmDaemons
from slurmgpu.sim.cluster.install import check_slurm_prefix, ensure_slurm_installed, slurm_version
from slurmgpu.sim.cluster.procs import pick_ports
from slurmgpu.sim.cluster.render import (
    check_installed_hooks,
    fit_scenario,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
)


class SimCluster(SlurmDaemons):
    """One simulated cluster, living in one directory (see docs/simcluster.md)."""

    def up(self, nodes: int = 4, gpus: int = 8,
           scenario: str | os.PathLike[str] = DEFAULT_SCENARIO, *,
           hooks_enabled: bool = True, timeout: float = 60, cpus: int | None = None,
           agents: bool | None = None, installed_hooks: Path | None = None,
           slurm_prefix: Path | None = None) -> None:
        """Bring the cluster up (idempotent: a healthy cluster with these settings is kept).

        With ``agents`` (True, or None on a fresh cluster: the default) it also makes CURVE
        keys, starts one collector and one ``slurmgpu agent`` per node, and waits until
        every agent answers on its socket and has said hello to the collector. On a cluster
        that is already up, True/False starts/stops just the agents and the collector, and
        None keeps the choice made at its ``up``. ``installed_hooks``: slurm.conf's hooks run
        the wrappers a package installed there (see use_installed_hooks). ``slurm_prefix``:
        run the Slurm that tools/build_slurm.sh built there instead of Debian's packages."""
        if installed_hooks is not None:
            check_installed_hooks(installed_hooks)
        check_slurm_prefix(slurm_prefix)
        if not 1 <= nodes <= 64:
            raise ClusterError(f"--nodes must be 1..64, not {nodes}")
        if not 1 <= gpus <= 64:
            raise ClusterError(f"--gpus must be 1..64, not {gpus}")
        wanted = {"nodes": node_names(nodes), "gpus": gpus, "scenario": str(scenario),
                  "slurm_prefix": str(Path(slurm_prefix).absolute()) if slurm_prefix else None}
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
                f"(scenario {self._state.get('scenario')}, Slurm "
                f"{self._state.get('slurm_prefix') or 'from the packages'}) is already up in {self.dir}; "
                "run `slurmgpu sim cluster down` first"
            )
        if self._state or (self.dir / STATE_FILE).exists():
            self._stop_daemons()
        elif self.dir.exists() and any(self.dir.iterdir()):
            raise ClusterError(f"{self.dir} exists, is not empty and holds no simulated cluster")
        if os.geteuid() != 0:
            raise SlurmNotAvailable("the simulated Slurm cluster must run as root")
        ensure_slurm_installed(slurm_prefix)
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

    def _new_state(self, wanted: dict[str, Any], hooks_enabled: bool,
                   cpus: int | None, agents: bool = False) -> dict[str, Any]:
        old_ports = [self._state.get("ctld_port"), *self._state.get("node_ports", [])]
        ports = pick_ports(len(wanted["nodes"]) + 1,
                           prefer=old_ports if None not in old_ports else None)
        old_collector = self._state.get("collector_port")
        collector_port = pick_ports(1, start=COLLECTOR_BASE_PORT,
                                    prefer=[old_collector] if old_collector else None)[0]
        version = slurm_version(wanted["slurm_prefix"])
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
        write_atomic(self.conf, render_slurm_conf(d, self._state))
        write_atomic(d / "etc" / "gres.conf", render_gres_conf(d, self._state))
        write_atomic(d / "etc" / "cgroup.conf", render_cgroup_conf(d, (major, minor, patch)))
        write_atomic(d / "etc" / "plugstack.conf", "# no SPANK plugins\n")
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

    def running_daemons(self) -> list[str]:
        """The daemons of this cluster that run now, named for people: ``slurmctld (pid 7)``."""
        names = ["munged", "slurmctld", *self.nodes]
        found = [(f"slurmd {n}" if n in self.nodes else n, self._pid(n)) for n in names]
        found += [(name, self._service_pid(name)) for name in
                  (COLLECTOR, *(f"agent-{n}" for n in self.nodes))]
        return [f"{name} (pid {pid})" for name, pid in found if pid is not None]

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

    def reset(self, timeout: float = 60) -> None:
        """Back to the state right after ``up``: no jobs, no reservations, up() scenario on every node, empty
        kmsg and state dirs, default slurmgpu.toml, hooks as at up, a slurmd for every node
        (restarted if it died), drained/down nodes resumed, every node idle and without a
        reason."""
        from slurmgpu.sim.scenario import load_scenario, write_scenario

        if not self._state:
            raise ClusterError(f"no simulated cluster in {self.dir}")
        enabled = bool(self._state.get("hooks_at_up", True))
        self.set_hooks_enabled(False)  # cancelled jobs' epilogs must not drain nodes
        try:
            self.cancel_all(timeout)
            self.delete_reservations()
            base = load_scenario(self.dir / "scenario.base.json")
            for node in self.nodes:
                write_scenario(self.scenario_path(node), base)
                self.kmsg_path(node).write_text("", encoding="utf-8")
                empty_dir(self.state_dir(node))
            self.write_config(self.default_config())
            for node in self.nodes:
                empty_dir(self.jobs_dir(node))
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
            self._clear_stale_reasons(timeout)
        finally:
            self.set_hooks_enabled(enabled)


def find_cluster() -> SimCluster:
    """The cluster in $SLURMGPU_CLUSTER_DIR or /tmp/slurmgpu-cluster, else the demo's;
    ClusterError naming where it looked when none is there."""
    looked = [default_directory()]
    if ENV_CLUSTER_DIR not in os.environ:
        looked.append(DEMO_DIR)
    for directory in looked:
        if (directory / STATE_FILE).is_file():
            return SimCluster(directory)
    where = " nor ".join(str(d) for d in looked)
    raise ClusterError(f"no simulated cluster in {where}: start one with `slurmgpu sim cluster up` "
                       "(or `slurmgpu demo`), or name it with --dir")
