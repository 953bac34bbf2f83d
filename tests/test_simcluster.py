"""The simulated Slurm cluster itself (slurmgpu.sim.cluster, `slurmgpu sim cluster`).

Tests marked ``slurm`` share one session cluster (tests/slurmfixtures.py); each gets it
reset. They turn the hooks off (``plain``) so they test Slurm and the simulator wiring, not
slurmgpu's prolog.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmgpu.cli import cli
from slurmgpu.sim.cluster import (
    ClusterError,
    SimCluster,
    fit_scenario,
    render_cgroup_conf,
    render_gres_conf,
    render_hook,
    render_slurm_conf,
)
from slurmgpu.sim.scenario import load_scenario
from slurmgpu.sources.kmsg import pci_key, read_xids
from tests.agenthelpers import NEEDS_NOBODY
from tests.slurmfixtures import slurm_prefix

slurm = pytest.mark.slurm


def slurmgpu_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def pids(sim: SimCluster) -> dict[str, Any]:
    status = sim.status()
    return {"munged": status["munged"]["pid"], "slurmctld": status["slurmctld"]["pid"],
            **{n["name"]: n["slurmd_pid"] for n in status["nodes"]}}


@pytest.fixture
def plain(cluster: SimCluster) -> SimCluster:
    """The reset cluster with hooks that just exit 0 (reset() turns them back on)."""
    cluster.set_hooks_enabled(False)
    return cluster


# ------------------------------------------------------------- no Slurm needed


def test_fit_scenario_trims_and_extends_with_fresh_ids() -> None:
    base = load_scenario("h100-sxm-8")
    base["events"] = [{"gpu": 1, "type": 8, "data": 79}, {"gpu": 6, "type": 8, "data": 48}]
    four = fit_scenario(base, 4)
    assert [g["uuid"] for g in four["gpus"]] == [g["uuid"] for g in base["gpus"][:4]]
    assert four["events"] == [{"gpu": 1, "type": 8, "data": 79}]
    ten = fit_scenario(base, 10)
    assert len(ten["gpus"]) == 10
    for key in ("uuid", "serial"):
        assert len({g[key] for g in ten["gpus"]}) == 10
    assert len({pci_key(g["pci"]["bus_id"]) for g in ten["gpus"]}) == 10
    assert ten["gpus"][:8] == base["gpus"]
    assert len(base["gpus"]) == 8  # the input is not changed


def test_rendered_configs(tmp_path: Path) -> None:
    state = {"nodes": ["gpu-n1", "gpu-n2"], "gpus": 4, "ctld_port": 17100,
             "node_ports": [17101, 17102], "cpus": 4, "memory_mb": 16000,
             "slurm_version": "22.05.8"}
    conf = render_slurm_conf(tmp_path, state)
    assert "TLSType" not in conf  # 22.05 has no such key
    assert "TLSType=tls/none" in render_slurm_conf(tmp_path, {**state, "slurm_version": "25.11.7"})
    assert f"AuthInfo=socket={tmp_path}/munge/munge.socket.2,cred_expire=10" in conf
    assert ("NodeName=gpu-n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17102 CPUs=4 "
            "RealMemory=16000 Gres=gpu:4 State=UNKNOWN") in conf
    assert f"Prolog={tmp_path}/hooks/prolog" in conf and "PrologFlags=Alloc" in conf
    gres = render_gres_conf(tmp_path, state)
    assert f"NodeName=gpu-n1 Name=gpu File={tmp_path}/nodes/gpu-n1/dev/nvidia[0-3]" in gres
    assert "CgroupPlugin=disabled" in render_cgroup_conf(tmp_path, (24, 11, 5))
    assert "CgroupPlugin=cgroup/v1" in render_cgroup_conf(tmp_path, (22, 5, 8))
    assert render_hook("prolog", tmp_path, tmp_path / "lib.so", enabled=False).endswith("exit 0\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the hook as another user")
@NEEDS_NOBODY
def test_the_task_prolog_never_fails_a_job_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 10: the generated TaskProlog exec'd this interpreter, which a job's
    user may not run (exit 126: every task failed); the shipped wrapper tries the next."""
    import pwd
    import shutil
    import tempfile

    nobody = pwd.getpwnam("nobody")
    d = Path(tempfile.mkdtemp(prefix="sgd-tp-"))
    try:
        d.chmod(0o755)
        (d / "root-only").mkdir(mode=0o700)
        private = d / "root-only" / "python"
        private.symlink_to(sys.executable)
        monkeypatch.setattr(sys, "executable", str(private))
        hook = d / "taskprolog"
        hook.write_text(render_hook("taskprolog", d, d / "lib.so", enabled=True))
        hook.chmod(0o755)
        proc = subprocess.run([str(hook)], env={"SLURMD_NODENAME": "gpu-n1", "SLURM_JOB_ID": "5"},
                              capture_output=True, text=True, timeout=60, check=False, cwd="/",
                              user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
        assert proc.returncode == 0, proc.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("command", ["up", "down", "status", "env", "inject", "inject-xid"])
def test_cluster_commands_have_help(command: str) -> None:
    result = CliRunner().invoke(cli, ["sim", "cluster", command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and "--dir" in result.output


def test_status_of_a_missing_cluster(tmp_path: Path) -> None:
    proc = slurmgpu_cli("sim", "cluster", "status", "--json", "--dir", str(tmp_path / "none"))
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["up"] is False
    proc = slurmgpu_cli("sim", "cluster", "down", "--dir", str(tmp_path / "none"))
    assert proc.returncode == 0, proc.stderr  # down is idempotent
    assert proc.stdout == f"{tmp_path / 'none'}: nothing was running\n"


def test_env_without_a_cluster_says_so_in_one_line(tmp_path: Path) -> None:
    proc = slurmgpu_cli("sim", "cluster", "env", "--dir", str(tmp_path / "none"))
    assert (proc.returncode, proc.stdout) == (3, "")
    assert proc.stderr.startswith(f"slurmgpu: error: no simulated cluster in {tmp_path / 'none'}")
    env = {**os.environ, "SLURMGPU_CLUSTER_DIR": str(tmp_path / "none")}
    proc = slurmgpu_cli("sim", "cluster", "env", env=env)
    assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (3, "", 1)
    assert "slurmgpu sim cluster up" in proc.stderr


def test_env_without_dir_finds_the_demos_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import slurmgpu.sim.cluster.common as common
    import slurmgpu.sim.cluster.core as core

    demo = tmp_path / "demo"
    (demo / "etc").mkdir(parents=True)
    (demo / "cluster.json").write_text(json.dumps({"nodes": ["gpu-n1"], "gpus": 2}))
    monkeypatch.delenv("SLURMGPU_CLUSTER_DIR", raising=False)
    monkeypatch.setattr(common, "DEFAULT_DIR", tmp_path / "none")
    monkeypatch.setattr(core, "DEMO_DIR", demo)
    result = CliRunner().invoke(cli, ["sim", "cluster", "env"])
    assert result.exit_code == 0, result.output
    assert f"export SLURM_CONF={demo}/etc/slurm.conf" in result.output.splitlines()


def test_errors_are_one_line_exit_3(tmp_path: Path) -> None:
    proc = slurmgpu_cli("sim", "cluster", "inject", "gpu-n1", "h100-sxm-8", "--dir", str(tmp_path))
    assert proc.returncode == 3
    assert proc.stderr.startswith("slurmgpu: error: unknown node 'gpu-n1'")
    assert proc.stderr.count("\n") == 1
    (tmp_path / "precious").write_text("x")
    with pytest.raises(ClusterError, match="holds no simulated cluster"):
        SimCluster(tmp_path).down(purge=True)
    assert (tmp_path / "precious").exists()


def test_the_head_config_carries_the_nodes_pins(tmp_path: Path) -> None:
    """Issue 29 item 3: the fleet report judged pins from a head config without [pins]."""
    from slurmgpu.config.load import load_config

    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": ["gpu-n1"], "gpus": 8}))
    c = SimCluster(tmp_path)
    c.write_config(c.default_config())
    head = Path(c.shell_env()["SLURMGPU_CONFIG"])
    assert load_config(str(head)).settings_for("gpu-n1").pins.driver == ["550.90.07"]


def test_installed_hooks_that_are_not_there_start_nothing(tmp_path: Path) -> None:
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    (libexec / "slurmgpu-prolog").write_text("#!/bin/sh\nexit 0\n")
    (libexec / "slurmgpu-prolog").chmod(0o755)
    proc = slurmgpu_cli("sim", "cluster", "up", "--installed-hooks", str(libexec),
                        "--dir", str(tmp_path / "c"))
    assert proc.returncode == 3
    assert proc.stderr == (f"slurmgpu: error: --installed-hooks {libexec}: no executable "
                           "slurmgpu-epilog, slurmgpu-healthcheck, slurmgpu-taskprolog there "
                           "(is the slurmgpu package installed?)\n")
    assert not (tmp_path / "c").exists()


def test_a_slurm_prefix_without_slurm_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sbin").mkdir(parents=True)
    proc = slurmgpu_cli("sim", "cluster", "up", "--slurm-prefix", str(tmp_path / "empty"),
                        "--dir", str(tmp_path / "c"))
    assert proc.returncode == 3
    assert proc.stderr.startswith(f"slurmgpu: error: no Slurm in {tmp_path / 'empty'} "
                                  "(slurmctld, slurmd, scontrol, sbatch")
    assert proc.stderr.endswith(f"build it first: tools/build_slurm.sh {tmp_path / 'empty'}\n")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "c").exists()


def test_a_slurm_prefix_reaches_the_clients_and_the_hooks(tmp_path: Path) -> None:
    """Clients run the prefix's commands first; hooks tell slurmgpu's Slurm client where."""
    c = SimCluster(tmp_path)
    c._state = {"nodes": ["gpu-n1"], "slurm_prefix": "/opt/slurm-25.11"}
    assert c.env()["PATH"].split(os.pathsep)[:2] == ["/opt/slurm-25.11/bin", "/opt/slurm-25.11/sbin"]
    assert c.node_env("gpu-n1")["SLURMGPU_SLURM_BIN_DIR"] == "/opt/slurm-25.11/bin"
    hook = render_hook("prolog", tmp_path, tmp_path / "lib.so", enabled=True,
                       slurm_prefix=Path("/opt/slurm-25.11"))
    assert "export SLURMGPU_SLURM_BIN_DIR='/opt/slurm-25.11/bin'" in hook
    assert "SLURMGPU_SLURM_BIN_DIR" not in render_hook("prolog", tmp_path, tmp_path / "lib.so",
                                                       enabled=True)


# ---------------------------------------------------------------- the cluster


def fake_slurm_prefix(root: Path) -> Path:
    """A prefix whose bin/ and sbin/ hold a (useless) program of every name Slurm has."""
    from slurmgpu.sim.cluster.install import SLURM_PROGRAMS

    for sub in ("bin", "sbin"):
        (root / sub).mkdir(parents=True)
        for name in SLURM_PROGRAMS:
            (root / sub / name).write_text("#!/bin/sh\nexit 1\n")
            (root / sub / name).chmod(0o755)
    return root


@slurm
def test_up_is_idempotent(cluster: SimCluster, tmp_path: Path) -> None:
    before = pids(cluster)
    assert all(before.values())
    started = time.monotonic()
    cluster.up(nodes=4, gpus=8, hooks_enabled=True, slurm_prefix=slurm_prefix())
    prefix = ["--slurm-prefix", str(cluster.slurm_prefix)] if cluster.slurm_prefix else []
    proc = slurmgpu_cli("sim", "cluster", "up", "--json", "--dir", str(cluster.dir), *prefix)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 10
    assert pids(cluster) == before
    assert json.loads(proc.stdout)["up"] is True
    with pytest.raises(ClusterError, match="already up"):
        cluster.up(nodes=2, gpus=8, slurm_prefix=slurm_prefix())
    other = None if slurm_prefix() else fake_slurm_prefix(tmp_path)
    with pytest.raises(ClusterError, match="already up"):  # the same cluster, another Slurm
        cluster.up(nodes=4, gpus=8, slurm_prefix=other)


@slurm
def test_every_node_idle_with_eight_gpus(cluster: SimCluster) -> None:
    assert cluster.node_states() == {f"gpu-n{i}": "idle" for i in range(1, 5)}
    node = cluster.scontrol("show", "node", "gpu-n3")
    assert "Gres=gpu:8" in node and f"Port={cluster.status()['nodes'][2]['port']}" in node
    for name in cluster.nodes:
        devices = sorted(p.name for p in (cluster.node_dir(name) / "dev").iterdir())
        assert devices == [f"nvidia{i}" for i in range(8)]


@slurm
def test_jobs_get_disjoint_gpus(plain: SimCluster) -> None:
    # Both jobs hold their GPUs until both run (a fixed `sleep 1` let the second start after
    # the first ended, on the same GPUs, on a loaded machine).
    release = plain.dir / f"release-{os.getpid()}-{time.monotonic_ns()}"
    script = f"echo $CUDA_VISIBLE_DEVICES; while [ ! -e {release} ]; do sleep 0.2; done"
    jobs = [plain.sbatch(script, "--gres=gpu:2", "-w", "gpu-n2") for _ in range(2)]
    try:
        assert [plain.wait_job(job, states=("RUNNING",)) for job in jobs] == ["RUNNING", "RUNNING"]
    finally:
        release.touch()
    seen = []
    for job in jobs:
        assert plain.wait_job(job) == "COMPLETED"
        gpus = plain.job_output(job).strip().split(",")
        assert len(gpus) == 2
        seen += gpus
    assert len(set(seen)) == 4  # both ran at once, on different GPUs


@slurm
def test_wrap_job_gets_two_gpus(plain: SimCluster) -> None:
    job = plain.sbatch("", "--gres=gpu:2", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    assert plain.wait_job(job) == "COMPLETED"
    assert plain.job_output(job).strip() == "0,1"


@slurm
def test_hooks_export_the_node_environment(cluster: SimCluster, tmp_path: Path) -> None:
    text = cluster.hook("prolog").read_text()
    probe = tmp_path / "probe"
    lines = [ln for ln in text.splitlines() if not ln.startswith(("exec ", "[ -x"))]
    probe.write_text("\n".join([*lines, "exec /usr/bin/env"]) + "\n")
    probe.chmod(0o755)
    out = subprocess.run([str(probe)], env={"SLURMD_NODENAME": "gpu-n3"}, capture_output=True,
                         text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["SLURMGPU_SIM_SCENARIO"] == str(cluster.scenario_path("gpu-n3"))
    assert env["SLURMGPU_KMSG"] == str(cluster.kmsg_path("gpu-n3"))
    assert env["SLURMGPU_STATE_DIR"] == str(cluster.state_dir("gpu-n3"))
    assert env["SLURMGPU_DEVICE_PATTERN"] == str(cluster.node_dir("gpu-n3") / "dev/nvidia{index}")
    assert env["SLURM_CONF"] == str(cluster.conf)
    assert env["SLURMGPU_CONFIG"] == str(cluster.dir / "etc/slurmgpu.toml")
    assert Path(env["SLURMGPU_NVML_LIBRARY"]).is_file()
    assert env["SLURMGPU_BIN"].split()[0] and Path(env["SLURMGPU_BIN"].split()[0]).exists()
    cluster.set_hooks_enabled(False)
    assert cluster.run_hook("prolog", "gpu-n3", {"SLURM_JOB_ID": "1"}).returncode == 0


@slurm
def test_slurmd_runs_the_prolog_hook_with_the_node_environment(cluster: SimCluster) -> None:
    hook = cluster.hook("prolog")
    lines = [ln for ln in hook.read_text().splitlines() if not ln.startswith(("exec ", "[ -x"))]
    out = cluster.dir / "jobs" / "prolog-$SLURM_JOB_ID.env"
    hook.write_text("\n".join([*lines, f'/usr/bin/env > "{out}"', "exit 0"]) + "\n")
    job = cluster.sbatch("", "--gres=gpu:3", "-w", "gpu-n4", "--wrap", "true")
    assert cluster.wait_job(job) == "COMPLETED"
    text = (cluster.dir / "jobs" / f"prolog-{job}.env").read_text()
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert env["SLURMD_NODENAME"] == "gpu-n4" and env["SLURM_JOB_ID"] == job
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert env["SLURMGPU_SIM_SCENARIO"] == str(cluster.scenario_path("gpu-n4"))


def check_json(sim: SimCluster, node: str) -> dict[str, Any]:
    env = {**os.environ, **sim.node_env(node)}
    proc = slurmgpu_cli("check", "--json", "--node", node, env=env)
    assert proc.returncode in (0, 1, 2), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@slurm
def test_inject_swaps_a_node_scenario_atomically(cluster: SimCluster) -> None:
    path = cluster.scenario_path("gpu-n2")
    inode = path.stat().st_ino
    cluster.inject("gpu-n2", "fault-ecc-dbe")
    assert path.stat().st_ino != inode  # rename over the old file, never rewritten in place
    assert json.loads(path.read_text()) == load_scenario("fault-ecc-dbe")
    assert sorted(p.name for p in path.parent.iterdir()) == ["dev", "jobs", "kmsg", "scenario.json",
                                                              "state"]
    assert json.loads(cluster.scenario_path("gpu-n1").read_text()) == load_scenario("h100-sxm-8")
    bad = check_json(cluster, "gpu-n2")
    assert bad["verdict"] == "FAIL"
    assert [(f["check"], f["gpu"]) for f in bad["findings"] if f["severity"] == "FAIL"] == [
        ("ecc.uncorrected", 3)]
    assert check_json(cluster, "gpu-n1")["verdict"] == "OK"
    proc = slurmgpu_cli("sim", "cluster", "inject", "gpu-n4", "fault-gpu-lost",
                        "--dir", str(cluster.dir))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(cluster.scenario_path("gpu-n4").read_text())["gpus"][5]["lost"] is True


@slurm
def test_inject_xid_logs_kmsg_and_an_nvml_event(cluster: SimCluster) -> None:
    cluster.inject_xid("gpu-n3", 2, 79)
    proc = slurmgpu_cli("sim", "cluster", "inject-xid", "gpu-n3", "5", "48",
                        "--dir", str(cluster.dir))
    assert proc.returncode == 0, proc.stderr
    scenario = json.loads(cluster.scenario_path("gpu-n3").read_text())
    keys = [pci_key(g["pci"]["bus_id"]) for g in scenario["gpus"]]
    by_pci = {key: i for i, key in enumerate(keys) if key is not None}
    xids = read_xids(str(cluster.kmsg_path("gpu-n3")), by_pci)
    assert [(x.xid, x.gpu) for x in xids] == [(79, 2), (48, 5)]
    assert all(x.timestamp is not None and abs(x.timestamp - time.time()) < 60 for x in xids)
    events = scenario["events"]
    assert [{k: e[k] for k in ("gpu", "type", "data")} for e in events] == [
        {"gpu": 2, "type": 8, "data": 79}, {"gpu": 5, "type": 8, "data": 48}]
    assert events[0]["id"] < events[1]["id"]  # unique, increasing ids (never reused after a reset)
    assert cluster.kmsg_path("gpu-n1").read_text() == ""
    proc = slurmgpu_cli("sim", "cluster", "inject-xid", "gpu-n3", "8", "79",
                        "--dir", str(cluster.dir))
    assert proc.returncode == 3 and "has no GPU 8" in proc.stderr


@slurm
def test_status_and_env_cli(cluster: SimCluster) -> None:
    proc = slurmgpu_cli("sim", "cluster", "status", "--json", "--dir", str(cluster.dir))
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["up"] is True and status["slurmctld"]["responding"] is True
    assert [(n["name"], n["state"], n["slurmd_running"]) for n in status["nodes"]] == [
        (f"gpu-n{i}", "idle", True) for i in range(1, 5)]
    text = slurmgpu_cli("sim", "cluster", "status", "--dir", str(cluster.dir))
    assert text.returncode == 0 and "gpu-n4" in text.stdout and " up " in text.stdout
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "SLURMGPU_CLUSTER_DIR")}
    shell = (f'eval "$("{sys.executable}" -m slurmgpu sim cluster env --dir {cluster.dir})" && '
             'sinfo -h -N -p gpu -o %N && echo "$SLURMGPU_CLUSTER_DIR"')
    out = subprocess.run(["sh", "-c", shell], env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout.split()
    assert out == [*cluster.nodes, str(cluster.dir)]


@slurm
def test_reset_restores_a_clean_cluster(plain: SimCluster) -> None:
    cluster = plain
    job = cluster.sbatch("sleep 300", "--gres=gpu:1", "-w", "gpu-n1")
    cluster.wait_job(job, states=("RUNNING",))
    cluster.scontrol("update", "nodename=gpu-n2", "state=drain", "reason=test drain")
    cluster.inject("gpu-n3", "fault-gpu-lost")
    cluster.inject_xid("gpu-n4", 0, 79)
    (cluster.state_dir("gpu-n4") / "leftover").write_text("x")
    cluster.write_config("[gpu]\ncount = 7\n")
    killed = cluster.status()["nodes"][3]["slurmd_pid"]
    os.kill(killed, signal.SIGKILL)
    cluster.reset()
    assert cluster.status()["nodes"][3]["slurmd_running"]  # reset restarts a dead slurmd
    assert cluster.wait_job(job) == "CANCELLED"
    assert set(cluster.node_states().values()) == {"idle"}
    assert set(cluster.node_reasons().values()) == {"none"}  # 25.11 keeps it after a resume
    base = json.loads((cluster.dir / "scenario.base.json").read_text())
    assert json.loads(cluster.scenario_path("gpu-n3").read_text()) == base
    assert cluster.kmsg_path("gpu-n4").read_text() == ""
    assert list(cluster.state_dir("gpu-n4").iterdir()) == []
    assert (cluster.dir / "etc/slurmgpu.toml").read_text() == cluster.default_config()
    assert "exit 0" not in cluster.hook("prolog").read_text()  # hooks back as at up


@slurm
def test_down_stops_only_its_own_daemons(slurm_cluster: SimCluster) -> None:
    before = pids(slurm_cluster)
    mini = SimCluster(f"/tmp/slurmgpu-test-mini-{os.getpid()}")
    try:
        mini.up(nodes=1, gpus=2, hooks_enabled=False, slurm_prefix=slurm_prefix())
        mine = pids(mini)
        assert mini.status()["up"] and set(mine.values()).isdisjoint(before.values())
        said = slurmgpu_cli("sim", "cluster", "down", "--dir", str(mini.dir)).stdout
        assert f"slurmctld (pid {mine['slurmctld']})" in said and f"slurmd gpu-n1 (pid {mine['gpu-n1']})" in said
        assert not any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in mine.values())
        assert not list((mini.dir / "run").glob("*.pid"))
        assert mini.dir.is_dir()  # down keeps the directory
        mini.down()  # idempotent
        assert pids(slurm_cluster) == before and slurm_cluster.status()["up"]
    finally:
        mini.down(purge=True)
    assert not mini.dir.exists()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_install_writes_policy_rc_d_and_retries_after_update(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmgpu.sim.cluster import install

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    policy = tmp_path / "policy-rc.d"
    log = tmp_path / "apt.log"
    # The first install fails (stale package lists); `update` makes the retry succeed.
    (bin_dir / "apt-get").write_text(
        "#!/bin/sh\n"
        f'echo "$* policy=$(cat {policy} 2>/dev/null | tail -1)" >> {log}\n'
        f'[ "$1" = update ] && touch {tmp_path}/updated\n'
        f'[ "$1" = install ] && [ ! -e {tmp_path}/updated ] && exit 100\n'
        "exit 0\n"
    )
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(install, "POLICY_RC_D", policy)
    monkeypatch.setattr(install.os, "geteuid", lambda: 0)
    missing = iter([["slurmd"], []])
    monkeypatch.setattr(install, "missing_programs", lambda prefix=None: next(missing))
    install.ensure_slurm_installed()
    calls = log.read_text().splitlines()
    install = "install -y -q --no-install-recommends slurmctld slurmd slurm-client munge"
    assert calls == [f"{install} policy=exit 101", "update -q policy=exit 101",
                     f"{install} policy=exit 101"]
    assert not policy.exists()  # created for the install only
