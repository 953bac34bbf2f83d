"""`slurmgpu doctor` on real sites: configless Slurm, a unit never enabled, a site's own
Prolog=/Epilog=/HealthCheckProgram=, and a second Slurm's scontrol first in the hooks' PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgpu.doctor import scontrol
from tests.test_doctor import REPO, Install, install, short_dir  # noqa: F401


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


# ----------------------------------------------------------------------------- configless


def test_a_configless_nodes_slurm_conf_says_where_to_edit(install: Install,  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cache = install.root / "run" / "slurm" / "conf"
    cache.mkdir(parents=True)
    monkeypatch.setattr("slurmgpu.slurm.conf.CONFIGLESS_DIR", str(cache))
    install.slurm_conf = cache / "slurm.conf"
    row = install.findings()[1]["slurm.conf"]
    assert row["severity"] == "OK" and "configless: slurmd's copy of the controller's slurm.conf" in row["message"]


def test_the_controllers_configless_slurm_conf_says_the_hooks_go_on_every_node(install: Install) -> None:  # noqa: F811
    install.slurm_lines["SlurmctldParameters"] = "enable_configless,idle_on_node_suspend"
    row = install.findings()[1]["slurm.conf"]
    assert "configless (" in row["message"] and "must be installed on every node" in row["message"]


def test_the_configless_cache_is_where_doctor_looks_last() -> None:
    from slurmgpu.slurm.conf import DEFAULT_PATHS

    assert DEFAULT_PATHS[-1] == "/run/slurm/conf/slurm.conf" and DEFAULT_PATHS[0] == "/etc/slurm/slurm.conf"


# ----------------------------------------------------------------------------- the agent unit


@pytest.mark.parametrize(("state", "fix"), [
    ("disabled", "systemctl enable --now slurmgpu-agent"),
    ("enabled", "systemctl restart slurmgpu-agent"),
])
def test_a_stopped_agents_fix_depends_on_whether_it_was_ever_enabled(
        install: Install, monkeypatch: pytest.MonkeyPatch, state: str, fix: str) -> None:  # noqa: F811
    bin_dir = install.root / "sysbin"
    script(bin_dir / "systemctl", f'[ "$1 $2" = "is-enabled slurmgpu-agent.service" ] && echo {state}\n'
                                  f'[ {state} = enabled ]')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    install.agent_node = True
    row = install.findings()[1]["agent"]
    assert row["severity"] == "FAIL" and row["fix"].startswith(fix), row


# ----------------------------------------------------------------------------- a site's hooks


def test_a_sites_own_prolog_gets_how_to_add_slurmgpus(install: Install) -> None:  # noqa: F811
    site = script(install.root / "site" / "prolog.sh", "exit 0")
    install.slurm_lines["Prolog"] = str(site)
    row = install.findings()[1]["slurm.prolog"]
    assert row["severity"] == "WARN" and "runs no slurmgpu program" in row["message"]
    assert f"`Prolog={site},/usr/libexec/slurmgpu/slurmgpu-prolog`" in row["fix"]


def test_a_list_with_slurmgpus_prolog_or_a_script_calling_it_is_fine(install: Install) -> None:  # noqa: F811
    site = script(install.root / "site" / "prolog.sh", "exit 0")
    install.slurm_lines["Prolog"] = f"{site},{REPO / 'prolog' / 'slurmgpu-prolog'}"
    assert install.findings()[1]["slurm.prolog"]["severity"] == "OK"
    calling = script(install.root / "site" / "prolog2.sh", "/usr/libexec/slurmgpu/slurmgpu-prolog")
    install.slurm_lines["Prolog"] = str(calling)
    assert install.findings()[1]["slurm.prolog"]["severity"] == "OK"


def test_another_healthcheck_program_says_how_to_run_both(install: Install) -> None:  # noqa: F811
    nhc = script(install.root / "sbin" / "nhc", "exit 0")
    install.slurm_lines["HealthCheckProgram"] = str(nhc)
    row = install.findings()[1]["slurm.healthcheck"]
    assert row["severity"] == "SKIP" and \
        "`* || check_cmd_status -t 30 sh -c '/usr/libexec/slurmgpu/slurmgpu-healthcheck; exit 0'`" in row["message"]


# ----------------------------------------------------------------------------- scontrol


def fake_daemon(proc_root: Path, pid: int, name: str, program: Path) -> None:
    entry = proc_root / str(pid)
    entry.mkdir(parents=True)
    (entry / "comm").write_text(name + "\n")
    (entry / "cmdline").write_bytes(f"{program}\0-D\0".encode())


@pytest.mark.parametrize(("hooks", "daemon", "severity"), [
    ("slurm-wlm 22.05.8", "slurm 23.11.4", "WARN"),
    ("slurm 23.11.6", "slurm 23.11.4", "OK"),
])
def test_the_hooks_scontrol_against_the_slurm_daemon_running_here(
        install: Install, monkeypatch: pytest.MonkeyPatch, hooks: str, daemon: str,  # noqa: F811
        severity: str) -> None:
    script(install.bin_dir / "scontrol", f'[ "$1" = --version ] && echo "{hooks}" && exit 0\n'
                                         '[ "$1" = ping ] && echo "Slurmctld(primary) at head is UP"')
    site_bin = install.root / "opt" / "slurm" / "sbin"
    slurmd = script(site_bin / "slurmd", f'[ "$1" = -V ] && echo "{daemon}"')
    proc = install.root / "proc"
    fake_daemon(proc, 4242, "slurmd", slurmd)
    fake_daemon(proc, 4243, "bash", Path("/bin/bash"))
    monkeypatch.setattr(scontrol, "PROC_ROOT", str(proc))
    row = install.findings()[1]["slurm.scontrol"]
    assert row["severity"] == severity, row
    if severity == "WARN":
        assert row["message"] == (f"the hooks run {install.bin_dir}/scontrol (Slurm 22.05.8), but slurmd "
                                  f"here is {slurmd} (Slurm 23.11.4)")
        assert row["fix"].startswith(f'set [slurm] bin_dir = "{site_bin}"')


def test_no_daemon_running_is_no_verdict(install: Install, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    (install.root / "proc").mkdir()
    monkeypatch.setattr(scontrol, "PROC_ROOT", str(install.root / "proc"))
    assert install.findings()[1]["slurm.scontrol"]["severity"] == "SKIP"
