"""`slurmgpu ckpt ack|status`, run as the job runs it: a subprocess with the job's
environment, against real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgpu import jobfiles

REPO = Path(__file__).resolve().parent.parent


def ckpt(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMGPU_"))}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "slurmgpu", "ckpt", *args], env=full,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    (tmp_path / "jobs" / "300").mkdir(parents=True)
    return tmp_path / "jobs"


def request(jobs: Path, job_id: str = "300", **extra: object) -> Path:
    path = jobs / job_id / "checkpoint"
    now = time.time()
    jobfiles.write_atomic(path, {"job_id": job_id, "state": "requested", "action": "drain-now",
                                 "reason": "xid.recent GPU 1: XID 79", "deadline": now + 240,
                                 "requested_at": now, "node": "n2", "trigger_node": "n1", **extra})
    return path


def test_status_without_request_exits_1(jobs: Path) -> None:
    proc = ckpt("status", SLURM_JOB_ID="300", SLURMGPU_JOBS_DIR=str(jobs))
    assert proc.returncode == 1, proc.stderr
    assert "no checkpoint requested" in proc.stdout
    proc = ckpt("status", "--json", SLURM_JOB_ID="300", SLURMGPU_JOBS_DIR=str(jobs))
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"job_id": "300", "state": "absent",
                                       "file": str(jobs / "300" / "checkpoint")}


def test_status_of_a_request_then_ack_then_status(jobs: Path) -> None:
    path = request(jobs)
    env = {"SLURM_JOB_ID": "300", "SLURMGPU_JOBS_DIR": str(jobs)}
    proc = ckpt("status", **env)
    assert proc.returncode == 0, proc.stderr
    assert "drain-now requested by n1: xid.recent GPU 1: XID 79" in proc.stdout
    assert "s left" in proc.stdout
    data = json.loads(ckpt("status", "--json", **env).stdout)
    assert data["state"] == "requested" and data["action"] == "drain-now"

    before = time.time()
    proc = ckpt("ack", "--note", "step 42 saved", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "acked" and out["note"] == "step 42 saved" and out["job_id"] == "300"
    assert before <= out["acked_at"] <= time.time()
    written = json.loads(path.read_text())
    assert {k: written[k] for k in ("job_id", "state", "acked_at", "note")} == {
        "job_id": "300", "state": "acked", "acked_at": out["acked_at"], "note": "step 42 saved"}
    assert (written["action"], written["reason"]) == ("drain-now", "xid.recent GPU 1: XID 79")  # what was asked
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint"]  # no temporary file left

    proc = ckpt("status", **env)
    assert proc.returncode == 0 and "checkpoint acked at" in proc.stdout and "step 42" in proc.stdout
    status = json.loads(ckpt("status", "--json", **env).stdout)
    assert status["state"] == "acked" and status["acked_at"] == out["acked_at"]


HELD = ("slurmgpu: xid.recent GPU 0 XID 79: GPU has fallen off the bus (needs a reboot) "
        "(drain held by the circuit breaker; the job is requeued when an admin releases it)")


def test_status_says_the_breaker_holds_the_drain_before_and_after_the_ack(jobs: Path) -> None:
    """Issue 29 item 2: the job saw no sign that its drain was held."""
    request(jobs, reason=HELD)
    env = {"SLURM_JOB_ID": "300", "SLURMGPU_JOBS_DIR": str(jobs)}
    held = "job 300: drain held by the circuit breaker; the job is requeued when an admin releases it\n"
    assert ckpt("status", **env).stdout.endswith(held)
    assert ckpt("ack", "--note", "step 10", **env).returncode == 0
    proc = ckpt("status", **env)
    assert proc.returncode == 0 and "checkpoint acked at" in proc.stdout and proc.stdout.endswith(held)


def test_the_example_keeps_saving_after_its_ack_and_prints_the_reason(jobs: Path, tmp_path: Path) -> None:
    """Issue 29 item 2: acked, the drain held by the breaker, the example stopped saving:
    everything it trained until the release was lost."""
    path = request(jobs, reason=HELD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMGPU_"))}
    env.update(SLURM_JOB_ID="300", SLURMGPU_CHECKPOINT_FILE=str(path), PATH="/usr/bin:/bin")  # acks by the file
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "train_with_checkpoint.py"), "--ckpt",
                           str(tmp_path / "ckpt.json"), "--steps", "45", "--step-time", "0"],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = proc.stdout.splitlines()
    assert f"checkpoint requested: {HELD}" in lines
    assert "checkpoint saved at step 10 (loss" in proc.stdout
    assert [line.split()[2] for line in lines if line.startswith("saved step")] == ["20", "30", "40"]
    assert (json.loads(path.read_text())["state"], json.loads(path.read_text())["reason"]) == ("acked", HELD)


def test_plain_done_counts_as_acked(jobs: Path) -> None:
    path = request(jobs)
    path.write_text("done\n")
    status = ckpt("status", "--json", SLURM_JOB_ID="300", SLURMGPU_JOBS_DIR=str(jobs))
    assert status.returncode == 0
    data = json.loads(status.stdout)
    assert data["state"] == "acked" and data["acked_at"] == pytest.approx(path.stat().st_mtime)


def test_checkpoint_file_variable_wins(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "301"
    elsewhere.mkdir(parents=True)
    path = elsewhere / "checkpoint"
    proc = ckpt("ack", SLURM_JOB_ID="301", SLURMGPU_CHECKPOINT_FILE=str(path),
                SLURMGPU_JOBS_DIR=str(tmp_path / "nowhere"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(path.read_text())["job_id"] == "301"
    # --job names another job: its file comes from jobs_dir instead
    proc = ckpt("status", "--job", "302", SLURM_JOB_ID="301", SLURMGPU_CHECKPOINT_FILE=str(path),
                SLURMGPU_JOBS_DIR=str(tmp_path / "nowhere"))
    assert proc.returncode == 3 and "302" in proc.stderr


def test_jobs_dir_from_the_config_file(tmp_path: Path, jobs: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[agent]\njobs_dir = "{jobs}"\n')
    request(jobs)
    assert ckpt("status", "--job", "300", SLURMGPU_CONFIG=str(config)).returncode == 0
    other = tmp_path / "other.toml"
    other.write_text('[agent]\njobs_dir = "/nonexistent/jobs"\n')
    assert ckpt("status", "--job", "300", "--config", str(config),
                SLURMGPU_CONFIG=str(other)).returncode == 0


@pytest.mark.parametrize(("args", "env", "message"), [
    (("ack",), {}, "no job id"),
    (("status",), {}, "no job id"),
    (("ack", "--job", "../300"), {}, "bad job id"),
    (("ack", "--job", "999"), {}, "no directory"),
    (("status",), {"SLURM_JOB_ID": "998"}, "no directory"),
])
def test_bad_usage_exits_3_with_one_line(jobs: Path, args: tuple[str, ...], env: dict[str, str],
                                         message: str) -> None:
    proc = ckpt(*args, SLURMGPU_JOBS_DIR=str(jobs), **env)
    assert proc.returncode == 3
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (jobs / "999").exists()


def test_status_of_garbage_is_an_error(jobs: Path) -> None:
    (jobs / "300" / "checkpoint").write_text("working on it")
    proc = ckpt("status", "--job", "300", SLURMGPU_JOBS_DIR=str(jobs))
    assert proc.returncode == 3 and "neither" in proc.stderr


def test_ckpt_module_imports_no_zmq_nor_nvml() -> None:
    code = ("import sys\nimport slurmgpu.cli.ckpt_cmd\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('zmq', 'pynvml')"
            " or m.startswith('slurmgpu.')))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # slurmgpu.cli registers every command group; import the module alone, as a file
    code = code.replace("import slurmgpu.cli.ckpt_cmd",
                        "import importlib.util as u\n"
                        f"spec = u.spec_from_file_location('ckpt_cmd', {str(REPO / 'slurmgpu/cli/ckpt_cmd.py')!r})\n"
                        "m = u.module_from_spec(spec); spec.loader.exec_module(m)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    # The CLI's root and its shared options (click, the variable table), no config loader.
    assert proc.stdout.strip() == str(["slurmgpu.cli", "slurmgpu.cli.common", "slurmgpu.cli.loading", "slurmgpu.config",
                                       "slurmgpu.config.env", "slurmgpu.errors", "slurmgpu.jobfiles",
                                       "slurmgpu.record"])
