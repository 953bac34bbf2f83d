"""The README's commands and example output match what the code does (issue 13 item 4:
a set-up line that failed on an image with empty package lists, a stale example output,
a help example running a program the simulated nodes lack, a demo that lost its lemons)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def blocks(lang: str = "sh") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_the_set_up_command_refreshes_the_package_lists_first() -> None:
    setup = blocks()[0].strip()
    assert setup.startswith("apt-get update && apt-get install -y ")


def test_the_fault_gpu_lost_example_is_what_check_prints() -> None:
    example = re.search(r"```\n\$ (slurmgpu sim run --scenario fault-gpu-lost -- .*?)\n(.*?)```", README, re.S)
    assert example, "the fault-gpu-lost example is gone from the README"
    command, shown = example.group(1), example.group(2)
    argv = shlex.split(command)
    slurmgpu = str(Path(sys.executable).parent / "slurmgpu")
    argv = [slurmgpu if a == "slurmgpu" else a for a in argv]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 2, proc.stderr

    def normal(text: str) -> list[str]:  # timings differ run to run
        return [re.sub(r" in \d+ ms$", " in N ms", line.rstrip()) for line in text.strip().splitlines()]

    assert normal(proc.stdout) == normal(shown)


def test_help_examples_run_only_what_a_simulated_node_has() -> None:
    out = subprocess.run([sys.executable, "-m", "slurmgpu", "sim", "cluster", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "nvidia-smi" not in out and "sbatch --gres=gpu:2" in out


def test_the_report_demo_seeds_where_its_config_reads() -> None:
    demo = next(b for b in blocks() if "report-seed" in b)
    seed = shlex.split(next(line for line in demo.splitlines() if "report-seed" in line))
    report = shlex.split(next(line for line in demo.splitlines() if line.startswith("slurmgpu report")))
    config = tomllib.loads((REPO / report[report.index("--config") + 1]).read_text())
    assert seed[seed.index("--db") + 1] == config["collector"]["db"]  # (lemons included: the database)


def test_the_path_is_set_before_the_first_bare_slurmgpu_command() -> None:
    sh = blocks()
    first_bare = next(i for i, b in enumerate(sh) if re.search(r"^slurmgpu ", b, re.M))
    exports = [i for i, b in enumerate(sh) if 'export PATH="$PWD/.venv/bin:$PATH"' in b]
    assert exports and exports[0] < first_bare


def test_the_test_command_says_how_long_the_suite_takes() -> None:
    test_line = next(line for b in blocks() for line in b.splitlines() if "-m pytest" in line)
    assert re.search(r"# about \d+ minutes on 2 cores", test_line), test_line


def test_the_guides_quote_what_the_code_says() -> None:
    """Issue 29: the user guide's hold note and squeue reason, the admin guide's sinfo
    format, as the code writes them and Slurm shows them (tests/test_checkpoint_e2e.py)."""
    from slurmgpu.collector.checkpoint import held_request_note
    from slurmgpu.decision import Action
    from slurmgpu.doctor.slurmconf import READ_REASONS

    user = (REPO / "docs" / "user-guide.md").read_text()
    assert f"`({held_request_note(Action.DRAIN_NOW)})`" in " ".join(user.split())
    assert "launch failed requeued" not in user and "`BeginTime`" in user
    admin = (REPO / "docs" / "admin-guide.md").read_text()
    assert 'sinfo -R -o "%60E %19H %N"' in admin and 'sinfo -R -o "%60E %19H %N"' in READ_REASONS
