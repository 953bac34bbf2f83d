import pytest

from tests.pgfixtures import *  # noqa: F403  (a real PostgreSQL server, store_url)
from tests.simfixtures import *  # noqa: F403  (fake NVML library + scenario fixtures)
from tests.slurmfixtures import *  # noqa: F403  (the real Slurm mini-cluster)


@pytest.fixture(autouse=True)
def _private_jobs_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hooks run by tests make per-job directories, agents save the XIDs they remember:
    keep them out of /run/slurmgpu/jobs and /var/lib/slurmgpu; the host's kernel log is
    no test's."""
    monkeypatch.setenv("SLURMGPU_JOBS_DIR", str(tmp_path_factory.mktemp("jobs")))
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("SLURMGPU_STATE_DIR", str(state))
    monkeypatch.setenv("SLURMGPU_KMSG", str(state / "no-kmsg"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the PostgreSQL server carry the ``postgresql`` mark (``store_url``'s
    PostgreSQL case has it from its parameter)."""
    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgresql)
