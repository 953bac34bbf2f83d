"""A real Slurm mini-cluster on one machine, for tests, CI and demos.

``SimCluster(dir).up(nodes=4, gpus=8)`` runs one munged, one slurmctld and one slurmd per
simulated node (``slurmd -N gpu-nX``, each on its own port) on this host, as root, without
systemd. Each node's GPUs are a simulator scenario file (``nodes/<node>/scenario.json``)
read by the fake ``libnvidia-ml.so.1``, and its GRES devices are real character devices
under ``nodes/<node>/dev/`` so that Slurm hands jobs ``CUDA_VISIBLE_DEVICES``. The
Prolog/Epilog/HealthCheckProgram are generated sh hooks that point slurmgpu at the node's
simulated GPUs. Layout, slurm.conf and version notes: docs/simcluster.md.

Modules: ``common`` (names, errors, file helpers), ``install`` (Slurm packages),
``render`` (slurm.conf, gres.conf, cgroup.conf, hooks, agent configs), ``procs`` (PIDs,
ports, detached daemons, the agents' socket), and the layers of ``SimCluster``: ``base``,
``services`` (collector and agents), ``gpus`` (fault injection, config, hooks),
``daemons`` (Slurm daemons and clients), ``core`` (up, status, reset, down).

Nothing at runtime imports this package: it is the simulator, not the product.
"""

from slurmgpu.sim.cluster.common import (
    BUNDLED_GPUS,
    DEFAULT_DIR,
    DEFAULT_SCENARIO,
    DEMO_DIR,
    ENV_CLUSTER_DIR,
    HOOKS,
    STATE_FILE,
    TERMINAL_JOB_STATES,
    ClusterError,
    SlurmNotAvailable,
    default_directory,
    node_names,
)
from slurmgpu.sim.cluster.core import SimCluster, find_cluster
from slurmgpu.sim.cluster.install import (
    ensure_slurm_installed,
    missing_programs,
    path_additions,
    prefix_dirs,
    slurm_version,
)
from slurmgpu.sim.cluster.procs import (
    hello_times,
    local_query,
    pick_ports,
    proc_alive,
    spawn_detached,
)
from slurmgpu.sim.cluster.render import (
    check_installed_hooks,
    fit_scenario,
    hook_environment,
    render_agent_config,
    render_cgroup_conf,
    render_gres_conf,
    render_hook,
    render_slurm_conf,
    repo_root,
)

__all__ = [
    "BUNDLED_GPUS",
    "DEFAULT_DIR",
    "DEFAULT_SCENARIO",
    "DEMO_DIR",
    "ENV_CLUSTER_DIR",
    "HOOKS",
    "STATE_FILE",
    "TERMINAL_JOB_STATES",
    "ClusterError",
    "SimCluster",
    "SlurmNotAvailable",
    "check_installed_hooks",
    "default_directory",
    "ensure_slurm_installed",
    "find_cluster",
    "fit_scenario",
    "hello_times",
    "hook_environment",
    "local_query",
    "missing_programs",
    "node_names",
    "path_additions",
    "pick_ports",
    "prefix_dirs",
    "proc_alive",
    "render_agent_config",
    "render_cgroup_conf",
    "render_gres_conf",
    "render_hook",
    "render_slurm_conf",
    "repo_root",
    "slurm_version",
    "spawn_detached",
]
