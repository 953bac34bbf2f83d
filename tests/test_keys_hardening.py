"""Issue 12: key files and the allow-list are checked as docs/keys.md says: a secret open
to others, or owned by another user, is refused and the daemon does not start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmgpu import keys
from slurmgpu.agent import Agent
from slurmgpu.config.schema import Settings
from slurmgpu.keys import InsecureKeyError


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    head = tmp_path / "keys"
    keys.init(head)
    return Path(keys.add_node(head, "n1"))


def test_a_loose_secret_stops_the_agent_instead_of_running_unconnected(bundle: Path, tmp_path: Path) -> None:
    (bundle / "node.key_secret").chmod(0o644)
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    agent = Agent(settings, "n1", keys_dir=str(bundle))
    with pytest.raises(InsecureKeyError, match="chmod 600"):
        agent.start_link()


def test_a_secret_owned_by_another_user_is_refused(bundle: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    secret = bundle / "node.key_secret"
    os.chown(secret, 65534, 65534)
    with pytest.raises(InsecureKeyError, match="owned by uid 65534"):
        keys.client_keys(bundle)


def test_a_writable_allow_list_directory_is_refused(tmp_path: Path) -> None:
    head = tmp_path / "keys"
    keys.init(head)
    keys.add_node(head, "n1")
    assert keys.allowed_nodes(head)
    (head / "nodes").chmod(0o777)
    with pytest.raises(InsecureKeyError, match="chmod 700"):
        keys.allowed_nodes(head)
