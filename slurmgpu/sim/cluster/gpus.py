"""The simulated cluster's GPUs and hooks: scenario and XID injection, the slurmgpu config
the hooks read, the hooks themselves."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmgpu.sim.cluster.common import (
    ALWAYS_ON_HOOKS,
    BUNDLED_GPUS,
    HOOKS,
    ClusterError,
    text_digest,
    write_atomic,
)
from slurmgpu.sim.cluster.render import (
    DEFAULT_SLURMGPU_TOML,
    check_installed_hooks,
    fit_scenario,
    render_hook,
)
from slurmgpu.sim.cluster.services import ServicesCluster


class GpuCluster(ServicesCluster):
    """GPU and fault injection, config and hooks of a simulated cluster."""

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
        from slurmgpu.errors import SimError
        from slurmgpu.sim.scenario import inject_xid, write_scenario

        path = self.scenario_path(node)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {path}: {exc}") from exc
        try:
            inject_xid(data, gpu, xid, kernel_log=self.kmsg_path(node), text=text)
        except SimError as exc:
            raise ClusterError(f"{node}: {exc}") from exc
        write_scenario(path, data)
        self._mark_agent_dirty(node)

    def default_config(self) -> str:
        return DEFAULT_SLURMGPU_TOML.format(gpus=self.gpus or BUNDLED_GPUS)

    def write_config(self, text: str) -> None:
        """Replace ``etc/slurmgpu.toml``, the slurmgpu config every hook reads."""
        (self.dir / "etc").mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "etc" / "slurmgpu.toml", text)
        # Agents read their config once: restart the running ones that run another text.
        stale = [n for n in self.nodes if self._service_pid(f"agent-{n}") is not None
                 and self._state.get("agent_configs", {}).get(n) != text_digest(text)]
        if stale:
            self._restart_agents(stale)

    def set_hooks_enabled(self, enabled: bool) -> None:
        """Rewrite the hooks: slurmgpu's prolog/epilog/healthcheck, or ``exit 0``.

        slurmd runs the files afresh for every job, so this takes effect at once.
        """
        installed = self.installed_hooks
        for name in HOOKS:
            write_atomic(self.hook(name), render_hook(
                name, self.dir, self.library, enabled=enabled or name in ALWAYS_ON_HOOKS,
                installed=installed, slurm_prefix=self.slurm_prefix), 0o755)
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
