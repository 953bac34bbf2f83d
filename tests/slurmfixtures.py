"""Fixtures for tests that need the real Slurm mini-cluster (``slurmgpu.sim.cluster``).

tests/conftest.py star-imports this module (only the names in ``__all__``). Mark such tests
``@pytest.mark.slurm``.

- ``slurm_cluster`` (session): 4 nodes x 8 simulated H100s, hooks enabled, brought up once
  per test session in ``/tmp/slurmgpu-test-cluster-<pid>`` (short: the munge socket path
  must fit in 108 bytes; ``$SLURMGPU_TEST_CLUSTER_DIR`` overrides) and stopped at the end.
  Needs root. Without root or Slurm (and no way to install it) the tests skip, but under
  ``$CI`` they fail: CI must not silently skip them. ``$SLURMGPU_SLURM_PREFIX``: run the
  Slurm tools/build_slurm.sh built there (25.11) instead of Debian's packages (22.05).
  It runs no agents (``agents=False``): its tests exercise the direct prolog/epilog path.
- ``cluster`` (function): the same cluster after ``reset()`` (no jobs, fresh scenarios,
  empty kmsg/state dirs, default slurmgpu.toml, all nodes idle), with SLURM_CONF, PATH and
  SLURMGPU_CLUSTER_DIR set in ``os.environ`` for the test.
- ``fleet_cluster`` (module): a separate, small cluster (2 nodes x 8 GPUs, its own
  directory ``/tmp/slurmgpu-fleet-test-<pid>`` and ports) WITH a collector and one agent per
  node, so the prolog takes the agent's warm path. Stopped at the end of the module.
- ``fleet`` (function): that cluster after ``reset()`` (agents as at up: dead ones and
  those of nodes a test injected into are restarted), with its client environment set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from slurmgpu.sim.build import SimToolchainError
from slurmgpu.sim.cluster import SimCluster, SlurmNotAvailable

__all__ = ["FLEET_CLUSTER_GPUS", "FLEET_CLUSTER_NODES", "TEST_CLUSTER_GPUS", "TEST_CLUSTER_NODES",
           "cluster", "fleet", "fleet_cluster", "slurm_cluster", "slurm_prefix"]

TEST_CLUSTER_NODES = 4
TEST_CLUSTER_GPUS = 8
FLEET_CLUSTER_NODES = 2
FLEET_CLUSTER_GPUS = 8
_DIR_PREFIX = "/tmp/slurmgpu-test-cluster-"
_FLEET_PREFIX = "/tmp/slurmgpu-fleet-test-"


def pytest_configure(config: pytest.Config) -> None:
    """Registers the marker when this module is loaded as a plugin (``-p tests.slurmfixtures``)."""
    config.addinivalue_line("markers", "slurm: needs the real Slurm mini-cluster")


def slurm_prefix() -> Path | None:
    """The Slurm build the fixtures' clusters run (``$SLURMGPU_SLURM_PREFIX``), else None."""
    value = os.environ.get("SLURMGPU_SLURM_PREFIX")
    return Path(value) if value else None


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):  # CI installs Slurm and runs as root: a skip would hide failures
        pytest.fail(f"simulated Slurm cluster unavailable under CI: {reason}", pytrace=False)
    pytest.skip(f"simulated Slurm cluster unavailable: {reason}")


def _reap_stale_clusters(pattern: str = "slurmgpu-test-cluster-*") -> None:
    """Stop test clusters left behind by killed pytest sessions (their owner pid is gone)."""
    for path in Path("/tmp").glob(pattern):
        try:
            owner = int(json.loads((path / "cluster.json").read_text())["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            SimCluster(path).down(purge=True)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """The session's simulated Slurm cluster (see the module docstring)."""
    if os.geteuid() != 0:
        _unavailable("the cluster's daemons must run as root")
    explicit = os.environ.get("SLURMGPU_TEST_CLUSTER_DIR")
    if not explicit:
        _reap_stale_clusters()
    sim = SimCluster(explicit or f"{_DIR_PREFIX}{os.getpid()}")
    try:
        sim.up(nodes=TEST_CLUSTER_NODES, gpus=TEST_CLUSTER_GPUS, hooks_enabled=True,
               agents=False, slurm_prefix=slurm_prefix())
    except (SlurmNotAvailable, SimToolchainError) as exc:
        _unavailable(str(exc))
    yield sim
    # Keep the directory (logs!) when something failed or the caller chose the directory.
    failed = request.session.testsfailed > 0
    sim.down(purge=not explicit and not failed)


@pytest.fixture
def cluster(slurm_cluster: SimCluster, monkeypatch: pytest.MonkeyPatch) -> SimCluster:
    """The session cluster, reset for this test, with its client environment set."""
    slurm_cluster.reset()
    for key, value in slurm_cluster.env().items():
        monkeypatch.setenv(key, value)
    return slurm_cluster


@pytest.fixture(scope="module")
def fleet_cluster(request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """A small cluster with a collector and one agent per node (see the module docstring)."""
    if os.geteuid() != 0:
        _unavailable("the cluster's daemons must run as root")
    _reap_stale_clusters("slurmgpu-fleet-test-*")
    sim = SimCluster(f"{_FLEET_PREFIX}{os.getpid()}")
    failed_before = request.session.testsfailed
    try:
        sim.up(nodes=FLEET_CLUSTER_NODES, gpus=FLEET_CLUSTER_GPUS, hooks_enabled=True,
               agents=True, slurm_prefix=slurm_prefix())
    except (SlurmNotAvailable, SimToolchainError) as exc:
        _unavailable(str(exc))
    yield sim
    sim.down(purge=request.session.testsfailed == failed_before)


@pytest.fixture
def fleet(fleet_cluster: SimCluster, monkeypatch: pytest.MonkeyPatch) -> SimCluster:
    """The fleet cluster, reset for this test, with its client environment set."""
    fleet_cluster.reset()
    for key, value in fleet_cluster.env().items():
        monkeypatch.setenv(key, value)
    return fleet_cluster
