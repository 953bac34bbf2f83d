"""Site checks as plugins (issue 14, move 6): real tiny distributions on PYTHONPATH with
``slurmgpu.checks`` entry points, run through `slurmgpu check --json` on the simulated
node. A plugin's check runs, obeys ``[checks] disabled`` and ``[[hosts]]`` like a built-in
one, crashes alone; a plugin that cannot load is one UNKNOWN ``plugin.<name>`` finding
and changes no built-in finding; an id clash is refused; ``plugins = false`` loads none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.checks.registry import CheckSpec, Origin, dist_namespace, ok, plugin_id_error
from slurmgpu.config.schema import Settings
from slurmgpu.engine import run_one
from slurmgpu.errors import ConfigError
from slurmgpu.result import Finding, Severity
from slurmgpu.testing import make_facts
from tests.simfixtures import ScenarioFactory, sim_env

REPO = Path(__file__).resolve().parent.parent
SIM_CONFIG = (REPO / "etc" / "sim-h100.toml").read_text()
SIM_DISABLED = 'disabled = ["ib.*", "pin.ib_firmware", "pin.nccl", "pin.ofed"]'
assert SIM_DISABLED in SIM_CONFIG

# site.power_cap: WARN for a GPU whose enforced power limit is below 700 W.
POWER_CHECK = '''
from slurmgpu.checks import Severity, check, ok, problem

@check("site.power_cap", severity=Severity.WARN, reads=("gpu.power_limit_w",),
       summary="every GPU's enforced power limit is at least 700 W")
def power_cap(ctx):
    for gpu in ctx.live_gpus():
        if gpu.power_limit_w is not None and gpu.power_limit_w < 700:
            yield problem(Severity.WARN, f"power limit {gpu.power_limit_w:.0f} W", gpu=gpu.index)
        else:
            yield ok(f"power limit {gpu.power_limit_w} W", gpu=gpu.index)
'''


def make_dist(site: Path, dist: str, entry_points: dict[str, str], files: dict[str, str],
              version: str = "0.1") -> Path:
    """A distribution as pip leaves it in site-packages: the package files and
    ``<name>-<version>.dist-info`` with METADATA and entry_points.txt."""
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[console_scripts]\nacme-tool = acme:main\n\n"
                                           f"[slurmgpu.checks]\n{lines}")
    return site


def power_plugin(site: Path, **extra_files: str) -> Path:
    return make_dist(site, "acme-gpu-checks", {"acme": "acme_gpu_checks.power"},
                     {"acme_gpu_checks/__init__.py": "", "acme_gpu_checks/power.py": POWER_CHECK,
                      **extra_files})


def config(tmp_path: Path, disabled: str = SIM_DISABLED, extra: str = "", name: str = "cfg.toml") -> str:
    path = tmp_path / name
    path.write_text(SIM_CONFIG.replace(SIM_DISABLED, disabled) + extra)
    return str(path)


def lower_gpu2_power(data: dict[str, Any]) -> None:
    data["gpus"][2]["enforced_power_limit_mw"] = 300_000


def slurmgpu(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def check_json(env: dict[str, str], cfg: str, node: str = "gpu-h100-001") -> tuple[int, dict[str, Any], str]:
    proc = slurmgpu(env, "check", "--json", "--config", cfg, "--node", node)
    assert proc.returncode in (0, 1, 2, 3) and proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode
    return proc.returncode, report, proc.stderr


def with_plugins(env: dict[str, str], *sites: Path) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join([*map(str, sites), env["PYTHONPATH"]])}


def by_check(report: dict[str, Any], prefix: str) -> list[tuple[str, str, int | None]]:
    return sorted((f["check"], f["severity"], f["gpu"]) for f in report["findings"]
                  if f["check"].startswith(prefix))


def built_in(report: dict[str, Any]) -> list[tuple[str, str, int | None, str]]:
    return sorted((f["check"], f["severity"], f["gpu"], f["message"]) for f in report["findings"]
                  if not f["check"].startswith(("site.", "plugin.", "acme_gpu_checks.")))


@pytest.fixture
def node(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> dict[str, str]:
    """The simulated 8x H100 node, GPU 2's power limit lowered to 300 W."""
    return sim_env(fake_nvml_lib, scenario_file("h100-sxm-8", lower_gpu2_power))


# --------------------------------------------------------------------------- a plugin's check


def test_a_plugin_check_runs_and_reports(node: dict[str, str], tmp_path: Path) -> None:
    env = with_plugins(node, power_plugin(tmp_path / "site"))
    code, report, _ = check_json(env, config(tmp_path))
    assert by_check(report, "site.") == sorted(("site.power_cap", "WARN" if i == 2 else "OK", i) for i in range(8))
    assert code == 1 and report["verdict"] == "WARN"
    assert [f for f in built_in(report) if f[1] != "OK"] == []
    # Without the plugin on the path: the same built-in findings, no site check.
    code, alone, _ = check_json(node, config(tmp_path))
    assert code == 0 and by_check(alone, "site.") == [] and built_in(alone) == built_in(report)


def test_checks_list_names_the_plugin_and_its_distribution(tmp_path: Path) -> None:
    env = with_plugins(sim_env(Path("/nonexistent"), None), power_plugin(tmp_path / "site"))
    rows = json.loads(slurmgpu(env, "checks", "list", "--json").stdout)
    row = next(r for r in rows if r["id"] == "site.power_cap")
    assert row["source"] == "plugin" and row["severity"] == "WARN" and row["reads"] == ["gpu.power_limit_w"]
    assert row["entry_point"] == {"name": "acme", "value": "acme_gpu_checks.power",
                                  "distribution": "acme-gpu-checks", "version": "0.1"}
    assert {r["source"] for r in rows if r["id"] != "site.power_cap"} == {"built-in"}
    table = slurmgpu(env, "checks", "list").stdout
    line = next(x for x in table.splitlines() if x.startswith("site.power_cap"))
    assert "plugin acme (acme-gpu-checks 0.1)" in line and "SOURCE" in table.splitlines()[0]
    assert "site.power_cap" not in slurmgpu(env, "checks", "list", "--no-plugins").stdout


def test_disabled_globs_turn_a_plugin_check_off(node: dict[str, str], tmp_path: Path) -> None:
    env = with_plugins(node, power_plugin(tmp_path / "site"))
    for pattern in ("site.*", "site.power_cap", "site.power_*", "plugin.acme", "plugin.*"):
        disabled = SIM_DISABLED.replace('["', f'["{pattern}", "')
        code, report, _ = check_json(env, config(tmp_path, disabled))
        assert by_check(report, "site.") == [] and code == 0, pattern


def test_a_hosts_section_targets_a_plugin_check(node: dict[str, str], tmp_path: Path) -> None:
    """Off everywhere, on for gpu-h100-00[1-4]: the usual [[hosts]] layering."""
    env = with_plugins(node, power_plugin(tmp_path / "site"))
    cfg = config(tmp_path, SIM_DISABLED.replace('["', '["site.*", "'),
                 f'\n[[hosts]]\nname = "power-capped"\nnodes = "gpu-h100-00[1-4]"\nchecks.{SIM_DISABLED}\n')
    code, report, _ = check_json(env, cfg, node="gpu-h100-003")
    assert code == 1 and ("site.power_cap", "WARN", 2) in by_check(report, "site.")
    code, report, _ = check_json(env, cfg, node="gpu-h100-009")
    assert code == 0 and by_check(report, "site.") == []


# --------------------------------------------------------------------------- safety


BOOM = '''
from slurmgpu.checks import Severity, check, ok

@check("site.boom", severity=Severity.FAIL, reads=("nothing",), summary="raises")
def boom(ctx):
    raise ZeroDivisionError("site bug")

@check("site.fine", severity=Severity.WARN, reads=("nothing",), summary="says ok")
def fine(ctx):
    yield ok("fine")

@check("site.not_a_finding", severity=Severity.WARN, reads=("nothing",), summary="yields a str")
def not_a_finding(ctx):
    yield "FAIL"
'''


@pytest.mark.parametrize(("scenario", "rc", "verdict"), [("h100-sxm-8", 3, "UNKNOWN"),
                                                         ("fault-gpu-lost", 2, "FAIL")])
def test_a_check_that_raises_is_unknown_alone(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                              tmp_path: Path, scenario: str, rc: int, verdict: str) -> None:
    node = sim_env(fake_nvml_lib, scenario_file(scenario))
    site = make_dist(tmp_path / "site", "acme-gpu-checks", {"boom": "acme_boom"}, {"acme_boom.py": BOOM})
    _, baseline, _ = check_json(node, config(tmp_path))
    code, report, _ = check_json(with_plugins(node, site), config(tmp_path))
    assert by_check(report, "site.") == [("site.boom", "UNKNOWN", None), ("site.fine", "OK", None),
                                         ("site.not_a_finding", "UNKNOWN", None)]
    messages = {f["check"]: f["message"] for f in report["findings"]}
    assert messages["site.boom"] == "check crashed: ZeroDivisionError: site bug"
    assert "yields Finding objects" in messages["site.not_a_finding"]
    assert built_in(report) == built_in(baseline)
    assert (code, report["verdict"]) == (rc, verdict)  # FAIL outranks UNKNOWN: the drain stands


BROKEN = {
    "import-error": "import acme_missing_dependency\n",
    "syntax-error": "def broken(:\n",
    "raises": "raise RuntimeError('no site config on this node')\n",
    "sys-exit": "import sys\nsys.exit(7)\n",
    "refused-id": POWER_CHECK.replace("site.power_cap", "gpu.count"),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_plugin_that_fails_to_load_is_one_unknown_finding(node: dict[str, str], tmp_path: Path,
                                                            kind: str) -> None:
    site = power_plugin(tmp_path / "site")
    make_dist(site, "acme-broken", {"broken": "acme_broken"}, {"acme_broken.py": BROKEN[kind]})
    _, baseline, _ = check_json(with_plugins(node, power_plugin(tmp_path / "alone")), config(tmp_path))
    code, report, stderr = check_json(with_plugins(node, site), config(tmp_path))
    plugin = [f for f in report["findings"] if f["check"].startswith("plugin.")]
    assert [(f["check"], f["severity"], f["subject"]) for f in plugin] == [
        ("plugin.broken", "UNKNOWN", "acme-broken")]
    assert plugin[0]["message"].startswith("plugin broken (acme-broken 0.1) failed to load")
    assert stderr.count("plugin_load_failed") == 1
    # The working plugin and every built-in check: as without the broken one.
    assert built_in(report) == built_in(baseline)
    assert by_check(report, "site.") == by_check(baseline, "site.")
    assert (code, report["verdict"]) == (3, "UNKNOWN")


def test_an_id_clash_with_a_built_in_is_refused(node: dict[str, str], tmp_path: Path) -> None:
    """The plugin registering gpu.count (and site.power_cap before it) loads not at all:
    the built-in gpu.count runs, site.power_cap is gone too, plugin.acme says why."""
    clash = POWER_CHECK + POWER_CHECK.replace("site.power_cap", "gpu.count").replace("power_cap(", "clash(")
    site = make_dist(tmp_path / "site", "acme-gpu-checks", {"acme": "acme_clash"}, {"acme_clash.py": clash})
    _, baseline, _ = check_json(node, config(tmp_path))
    code, report, _ = check_json(with_plugins(node, site), config(tmp_path))
    assert by_check(report, "site.") == []
    (finding,) = [f for f in report["findings"] if f["check"] == "plugin.acme"]
    assert "CheckIdError: check id 'gpu.count' is a built-in check: a plugin cannot replace it" in finding["message"]
    assert built_in(report) == built_in(baseline) and code == 3
    listed = json.loads(slurmgpu(with_plugins(node, site), "checks", "list", "--json").stdout)
    assert next(r for r in listed if r["id"] == "gpu.count")["source"] == "built-in"


def test_plugins_false_loads_nothing(node: dict[str, str], tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    site = power_plugin(tmp_path / "site")
    make_dist(site, "acme-broken", {"broken": "acme_broken"},
              {"acme_broken.py": f"open({str(marker)!r}, 'a').write('x')\nraise ImportError('x')\n"})
    cfg = config(tmp_path, extra="plugins = false\n")  # the last table of sim-h100.toml is [checks]
    code, report, stderr = check_json(with_plugins(node, site), cfg)
    assert code == 0 and not marker.exists() and "plugin_load_failed" not in stderr
    assert [f for f in report["findings"] if f["check"].startswith(("site.", "plugin."))] == []
    # ... also for one node group only.
    cfg = config(tmp_path, extra='\n[[hosts]]\nnodes = "gpu-h100-001"\nchecks.plugins = false\n')
    assert check_json(with_plugins(node, site), cfg)[0] == 0 and not marker.exists()
    assert check_json(with_plugins(node, site), cfg, node="gpu-h100-002")[0] == 3 and marker.exists()


def test_the_prolog_with_a_broken_plugin_follows_on_error(node: dict[str, str], tmp_path: Path) -> None:
    """UNKNOWN in the prolog is judged as today: on_error, fail-open by default (the job
    runs, no drain, one loud record naming the plugin)."""
    site = make_dist(tmp_path / "site", "acme-broken", {"broken": "acme_broken"},
                     {"acme_broken.py": "raise RuntimeError('site plugin bug')\n"})
    (tmp_path / "kmsg").write_text("")
    env = with_plugins({**node, "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_KMSG": str(tmp_path / "kmsg"),
                        "SLURMD_NODENAME": "gpu-h100-001", "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0,1"}, site)
    proc = slurmgpu(env, "prolog", "--config", config(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(x) for x in (tmp_path / "state" / "gate.jsonl").read_text().splitlines()]
    assert record["action"] == "fail-open" and "site plugin bug" in record["error"]


def test_a_failing_plugin_is_tried_and_logged_once_per_process(tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    site = make_dist(tmp_path / "site", "acme-broken", {"broken": "acme_broken"},
                     {"acme_broken.py": f"open({str(attempts)!r}, 'a').write('x')\nraise ImportError('gone')\n"})
    code = textwrap.dedent("""
        import json
        from slurmgpu.checks.registry import all_checks
        from slurmgpu.config.schema import Settings
        from slurmgpu.engine import evaluate
        from slurmgpu.testing import make_facts
        verdicts = [evaluate(make_facts(), Settings()) for _ in range(3)]
        all_checks(plugins=True)
        print(json.dumps([[f.message for f in v.findings if f.check == "plugin.broken"] for v in verdicts]))
    """)
    env = with_plugins({**os.environ, "PYTHONPATH": str(REPO)}, site)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    messages = json.loads(proc.stdout)
    assert len(messages) == 3 and all(len(m) == 1 and "ImportError: gone" in m[0] for m in messages)
    assert attempts.read_text() == "x" and proc.stderr.count("plugin_load_failed") == 1


def test_the_warm_prolog_client_loads_no_plugin(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    site = power_plugin(tmp_path / "site", **{"acme_gpu_checks/__init__.py": f"open({str(marker)!r}, 'w')\n"})
    env = with_plugins({**os.environ, "PYTHONPATH": str(REPO), "SLURMGPU_AGENT_SOCKET": str(tmp_path / "none.sock"),
                        "SLURMGPU_BIN": "true", "SLURMGPU_CONFIG": str(tmp_path / "absent.toml")}, site)
    code = "import json, sys\nimport slurmgpu.quickgate as q\nq.main(['prolog'])\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


# --------------------------------------------------------------------------- discovery


def test_the_scan_finds_what_importlib_metadata_finds(tmp_path: Path) -> None:
    """Two path entries; acme-gpu-checks in both (the first wins), an egg-info, a
    distribution with no slurmgpu.checks group."""
    first = power_plugin(tmp_path / "first")
    make_dist(first, "Other.Dist", {"other": "other_mod:register [extra]"}, {})
    second = power_plugin(tmp_path / "second")
    (second / "legacy-2.0-py3.11.egg-info").mkdir()
    (second / "legacy-2.0-py3.11.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: legacy\nVersion: 2.0\n")
    (second / "legacy-2.0-py3.11.egg-info" / "entry_points.txt").write_text("[slurmgpu.checks]\nold = legacy.checks\n")
    (second / "plain-1.0.dist-info").mkdir()
    (second / "plain-1.0.dist-info" / "entry_points.txt").write_text("[console_scripts]\nplain = plain:main\n")
    code = textwrap.dedent("""
        import json, sys
        from importlib.metadata import entry_points
        from slurmgpu.checks import plugins
        ours = [(e.name, e.value, e.dist, e.version) for e in plugins._scan_paths(sys.path)]
        theirs = [(e.name, e.value, e.dist.name, e.dist.version) for e in entry_points(group=plugins.GROUP)]
        print(json.dumps({"ours": ours, "theirs": theirs, "plain": plugins._plain_paths()}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(first), str(second), str(REPO)])}
    out = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    timeout=60, check=True).stdout)
    assert out["ours"] == out["theirs"]
    assert sorted(map(tuple, out["ours"])) == [
        ("acme", "acme_gpu_checks.power", "acme-gpu-checks", "0.1"),
        ("old", "legacy.checks", "legacy", "2.0"),
        ("other", "other_mod:register [extra]", "Other.Dist", "0.1")]
    assert out["plain"]  # this venv takes the fast path


def test_the_cold_check_finds_plugins_without_importlib_metadata(node: dict[str, str], tmp_path: Path) -> None:
    from tests.test_cold_imports import run_cold

    env = with_plugins(node, power_plugin(tmp_path / "site"))
    proc, seen = run_cold(["check", "--json", "--config", config(tmp_path), "--node", "gpu-h100-001"], env, tmp_path)
    assert proc.returncode == 1 and "site.power_cap" in proc.stdout
    assert "acme_gpu_checks.power" in seen["modules"] and "importlib.metadata" not in seen["modules"]


def test_an_entry_point_naming_a_callable_is_called_once(node: dict[str, str], tmp_path: Path) -> None:
    module = '''
    from slurmgpu.checks import Severity, check, ok

    def register():
        @check("acme_gpu_checks.hello", severity=Severity.WARN, reads=("nothing",), summary="hello")
        def hello(ctx):
            yield ok("hello")
    '''
    site = make_dist(tmp_path / "site", "acme-gpu-checks", {"acme": "acme_reg:register"}, {"acme_reg.py": module})
    code, report, _ = check_json(with_plugins(node, site), config(tmp_path))
    assert code == 0 and by_check(report, "acme_gpu_checks.") == [("acme_gpu_checks.hello", "OK", None)]


# --------------------------------------------------------------------------- rules, in process


@pytest.mark.parametrize(("check_id", "error"), [
    ("site.scratch", None),
    ("acme_gpu_checks.scratch", None),
    ("gpu.count", "is a built-in check: a plugin cannot replace it"),
    ("gpu.scratch", "must start with 'site.' or 'acme_gpu_checks.'"),
    ("plugin.scratch", "must start with"),
    ("other.scratch", "must start with"),
    ("scratch", "not a dotted lowercase id"),
    ("Site.Scratch", "not a dotted lowercase id"),
])
def test_the_naming_rule(check_id: str, error: str | None) -> None:
    found = plugin_id_error(check_id, ("site", "acme_gpu_checks"))
    assert found is None if error is None else error in (found or "")


def test_a_distribution_named_like_a_built_in_namespace_gets_site_only() -> None:
    assert dist_namespace("Acme-GPU.checks") == "acme_gpu_checks"
    assert dist_namespace("gpu") is None and dist_namespace("plugin") is None
    assert dist_namespace("site") is None and dist_namespace("2fast") is None


def test_findings_must_be_findings_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmgpu.checks.registry import CheckContext
    from slurmgpu.xid import XidPolicy

    ctx = CheckContext(make_facts(), Settings(), XidPolicy({}, "warn"))
    origin = Origin("acme", "acme", "acme", "0.1")

    def spec(body: Any) -> CheckSpec:
        return CheckSpec("site.x", body, Severity.WARN, ("x",), "x", origin)

    def leaves(c: CheckContext) -> list[Finding]:
        raise SystemExit(3)

    assert run_one(spec(lambda c: [ok("fine", n=1)]), ctx)[0].severity is Severity.OK
    for body in (lambda c: ["FAIL"], lambda c: [ok("x", obj=object())],
                 lambda c: [Finding("", "FAIL", "x")], leaves):
        (finding,) = run_one(spec(body), ctx)
        assert finding.severity is Severity.UNKNOWN and finding.check == "site.x"


def test_config_accepts_plugin_namespaces_in_disabled(tmp_path: Path) -> None:
    from slurmgpu.checks.registry import all_checks
    from slurmgpu.config.load import parse_config

    known = [c.id for c in all_checks()]
    cfg = parse_config('[checks]\nplugins = false\ndisabled = ["site.*", "plugin.acme", "ib.*"]\n',
                       known_checks=known)
    assert cfg.settings_for(None).checks.plugins is False
    for bad, why in (('"acme_gpu_checks.x"', "unknown check"), ('"gpu.cont"', "did you mean 'gpu.count'"),
                     ('"*.power"', "matches no check")):
        with pytest.raises(ConfigError, match=why):
            parse_config(f"[checks]\ndisabled = [{bad}]\n", known_checks=known)
