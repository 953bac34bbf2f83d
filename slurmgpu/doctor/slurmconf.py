"""Doctor checks of the Slurm side: slurm.conf has the lines slurmgpu needs, the hook
programs it names can be run by slurmd, and slurmctld answers.

Prolog, Epilog and HealthCheckProgram are never run here: they drain nodes. They are
checked the way exec would fail on them (exists, executable, a ``#!`` interpreter that
exists). The TaskProlog only prints an ``export`` line, so it is run, as Slurm would,
as a job's user (``TASK_PROLOG_USER`` when doctor runs as root) with a job id and nothing
else in its environment, in a process group of its own that is killed on a timeout.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgpu.doctor.model import (
    HEAD,
    STEP_TIMEOUT_S,
    Context,
    Finding,
    Level,
    fail,
    ok,
    skip,
    warn,
)
from slurmgpu.slurm.conf import ENV_VAR, Setting, SlurmConf

if TYPE_CHECKING:
    from slurmgpu.slurm.cli import CliSlurmClient

# Where ``#!/usr/bin/env python3`` looks for python3 when slurmd gives a hook no PATH at
# all (Slurm 22.05 does): execvp's default search path.
NO_PATH_SEARCH = "/bin:/usr/bin"
FAKE_JOB_ID = "1"
# PrologFlags that run the Prolog at allocation time on every node (Contain and RunInJob
# set Alloc implicitly).
ALLOC_FLAGS = frozenset({"alloc", "contain", "runinjob"})
SHIPPED = "/usr/libexec/slurmgpu"
#: Slurm runs the TaskProlog as the job's user: doctor, as root, runs it as this one, so it
#: sees what a job's user cannot read or run (an interpreter in root's home directory).
TASK_PROLOG_USER = "nobody"
NO_CONF = "needs slurm.conf (see the slurm.conf line)"
#: The nhc.conf line that runs slurmgpu's health check from NHC (HealthCheckProgram=nhc).
NHC_LINE = f"`* || check_cmd_status -t 30 sh -c '{SHIPPED}/slurmgpu-healthcheck; exit 0'`"


def check_slurm_conf(ctx: Context) -> Iterator[Finding]:
    """slurm.conf is found (--slurm-conf, $SLURM_CONF, the default places) and readable,
    includes and all."""
    from slurmgpu.slurm.conf import SlurmConfError, find_slurm_conf, parse_slurm_conf

    path, looked = find_slurm_conf(ctx.slurm_conf_file, ctx.environ)
    path = os.path.abspath(path) if path is not None else None
    if path is None:
        yield fail("slurm.conf", f"no slurm.conf found (looked at {', '.join(looked)})",
                   f"pass --slurm-conf FILE or set {ENV_VAR}")
        return
    try:
        ctx.slurm_conf = parse_slurm_conf(path)
    except SlurmConfError as exc:
        yield fail("slurm.conf", str(exc), f"fix the path, or pass --slurm-conf FILE / set {ENV_VAR}")
        return
    included = len(ctx.slurm_conf.files) - 1
    more = f" (+{included} included file{'' if included == 1 else 's'})" if included else ""
    yield ok("slurm.conf", f"{path}{more}{configless_note(ctx.slurm_conf)}")


def configless_note(conf: SlurmConf) -> str:
    """What configless Slurm changes for an admin: where to edit, what must be on the nodes."""
    from slurmgpu.slurm.conf import CONFIGLESS_DIR

    if conf.path.startswith(CONFIGLESS_DIR + "/"):
        return ("; configless: slurmd's copy of the controller's slurm.conf, so edit slurm.conf "
                "on the controller, then `scontrol reconfigure`")
    params = conf.get("SlurmctldParameters")
    if params is not None and "enable_configless" in {p.lower() for p in params.items()}:
        return (f"; configless ({params.where}): the nodes read this file from slurmctld, so the "
                "hook programs it names must be installed on every node")
    return ""


# --------------------------------------------------------------------------- settings


def check_slurm_settings(ctx: Context) -> Iterator[Finding]:
    """PrologFlags includes Alloc, JobRequeue is not 0, failed prologs do not hold jobs."""
    conf = ctx.slurm_conf
    if conf is None:
        yield skip("slurm.prolog_flags", NO_CONF)
        return
    yield _prolog_flags(conf)
    yield _job_requeue(conf)
    yield _nohold(conf)


def _prolog_flags(conf: SlurmConf) -> Finding:
    flags = conf.get("PrologFlags")
    if flags is None:
        return fail("slurm.prolog_flags", f"{conf.path} sets no PrologFlags: without Alloc the "
                                          "Prolog runs only on a job's batch host, so most GPUs of a "
                                          "multi-node job are never gated",
                    f"add `PrologFlags=Alloc` to {conf.path}")
    if ALLOC_FLAGS & {f.lower() for f in flags.items()}:
        return ok("slurm.prolog_flags", f"PrologFlags={flags.value} ({flags.where})")
    return fail("slurm.prolog_flags", f"PrologFlags={flags.value} ({flags.where}) lacks Alloc: the "
                                      "Prolog runs only on a job's batch host",
                f"change it to `PrologFlags={flags.value},Alloc` at {flags.where}")


def _job_requeue(conf: SlurmConf) -> Finding:
    requeue = conf.get("JobRequeue")
    if requeue is None:
        return ok("slurm.job_requeue", "JobRequeue not set (default 1: jobs can be requeued)")
    if requeue.value.strip() == "0":
        return warn("slurm.job_requeue", f"JobRequeue=0 ({requeue.where}): batch jobs cannot be "
                                         "requeued, so a drain-now cannot move them to healthy nodes",
                    f"set `JobRequeue=1` at {requeue.where} (1 is the default)")
    return ok("slurm.job_requeue", f"JobRequeue={requeue.value} ({requeue.where})")


def _nohold(conf: SlurmConf) -> Finding:
    params = conf.get("SchedulerParameters")
    if params is not None and "nohold_on_prolog_fail" in {p.lower() for p in params.items()}:
        return ok("slurm.scheduler", f"SchedulerParameters has nohold_on_prolog_fail ({params.where})")
    where = params.where if params is not None else conf.path
    return warn("slurm.scheduler", "a job whose Prolog fails is held until an admin releases it, "
                                   "not requeued (SchedulerParameters lacks nohold_on_prolog_fail)",
                f"add nohold_on_prolog_fail to SchedulerParameters in {where}")


# --------------------------------------------------------------------------- hooks


def check_slurm_hooks(ctx: Context) -> Iterator[Finding]:
    """Prolog= and Epilog= are set and runnable; HealthCheckProgram= too when set."""
    conf = ctx.slurm_conf
    if conf is None:
        yield skip("slurm.prolog", NO_CONF)
        return
    for key, check_id, shipped in (("Prolog", "slurm.prolog", "slurmgpu-prolog"),
                                   ("Epilog", "slurm.epilog", "slurmgpu-epilog")):
        setting = conf.get(key)
        if setting is None:
            yield fail(check_id, f"{conf.path} sets no {key}: slurmgpu does not gate jobs",
                       f"add `{key}={SHIPPED}/{shipped}` to {conf.path}")
        else:
            yield _gating_hook(ctx, check_id, setting, shipped)
    health = conf.get("HealthCheckProgram")
    if health is None:
        yield skip("slurm.healthcheck", "HealthCheckProgram not set: nodes slurmgpu drained are "
                                        "not resumed when they recover")
    elif _foreign(ctx, health):
        yield skip("slurm.healthcheck", f"HealthCheckProgram={health.value} ({health.where}) is not "
                                        "slurmgpu's, so nodes slurmgpu drained are not resumed when "
                                        "they recover; Slurm runs one program there: run slurmgpu's "
                                        f"from it, ignoring its exit status (it drains and resumes by "
                                        f"itself). NHC: {NHC_LINE} in /etc/nhc/nhc.conf")
    else:
        yield _hook(ctx, "slurm.healthcheck", health)


def _gating_hook(ctx: Context, check_id: str, setting: Setting, shipped: str) -> Finding:
    """A runnable Prolog=/Epilog= that runs no slurmgpu program warns, saying how to add it."""
    finding = _hook(ctx, check_id, setting)
    if finding.level is not Level.OK or not _foreign(ctx, setting):
        return finding
    key = setting.key
    return warn(check_id, f"{key}={setting.value} ({setting.where}) runs no slurmgpu program: "
                          "slurmgpu does not gate jobs",
                f"keep yours and add slurmgpu's: `{key}={setting.value},{SHIPPED}/{shipped}` at "
                f"{setting.where} (Slurm runs each, in order; a job runs only when all exit 0), "
                "or call it from your script")


def _foreign(ctx: Context, setting: Setting) -> bool:
    """A hook setting whose programs (here, on a GPU node) are all someone else's."""
    return ctx.role != HEAD and not any(runs_slurmgpu(p) for p in hook_paths(setting))


def runs_slurmgpu(path: str) -> bool:
    """Whether ``path`` is one of slurmgpu's hooks (by name, or a link to one) or a script
    that names slurmgpu (a site's own prolog that calls it)."""
    if any(os.path.basename(p).startswith("slurmgpu") for p in (path, os.path.realpath(path))):
        return True
    try:
        with open(path, "rb") as fh:
            return b"slurmgpu" in fh.read(64 * 1024)
    except OSError:
        return False


def _hook(ctx: Context, check_id: str, setting: Setting) -> Finding:
    """The first problem of any program a hook setting names (a comma list, globs allowed)."""
    if ctx.role == HEAD:
        return ok(check_id, f"{setting.key}={setting.value} ({setting.where}); the programs are "
                            "checked on the GPU nodes")
    paths = hook_paths(setting)
    if not paths:
        return fail(check_id, f"{setting.key}={setting.value} ({setting.where}) matches no file",
                    f"install slurmgpu's hooks ({SHIPPED}) or correct {setting.key}= at {setting.where}")
    for path in paths:
        problem = program_problem(check_id, setting, path)
        if problem is not None:
            return problem
    return ok(check_id, f"{setting.key}={setting.value} ({setting.where}): runnable")


def hook_paths(setting: Setting) -> list[str]:
    paths: list[str] = []
    for item in setting.items():
        paths.extend(sorted(glob.glob(item)) if glob.has_magic(item) else [item])
    return paths


def program_problem(check_id: str, setting: Setting, path: str) -> Finding | None:
    """Why slurmd (root) could not, or should not, exec ``path``; None when it can."""
    where = f"{setting.key}={path} ({setting.where})"
    if not os.path.exists(path):
        return fail(check_id, f"{where}: no such file",
                    f"install slurmgpu's hooks ({SHIPPED}) or correct {setting.key}= at {setting.where}")
    st = os.stat(path)
    if not os.path.isfile(path):
        return fail(check_id, f"{where} is not a file", f"correct {setting.key}= at {setting.where}")
    if not st.st_mode & 0o111:
        return fail(check_id, f"{where} is not executable", f"run: chmod 755 {path}")
    if st.st_mode & 0o022:
        # slurmd runs it as root: whoever can write it runs code as root on every job.
        return fail(check_id, f"{where} is writable by group/others (mode {st.st_mode & 0o7777:04o})",
                    f"run: chmod go-w {path}")
    why = interpreter_problem(path)
    if why is not None:
        return fail(check_id, f"{where}: {why}", f"install the interpreter or fix the first line of {path}")
    return None


def interpreter_problem(path: str) -> str | None:
    """Why exec of ``path`` would fail for want of an interpreter; None for a binary or a
    script whose ``#!`` interpreter (and ``env``'s command) exists."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head.startswith(b"\x7fELF"):
        return None
    if not head.startswith(b"#!"):
        return "starts with no #! line and is not a binary program (exec format error)"
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return "has an empty #! line"
    interpreter = words[0]
    if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        return f"its interpreter {interpreter} does not exist"
    command = env_command(words[1:]) if os.path.basename(interpreter) == "env" else None
    if command and shutil.which(command, path=NO_PATH_SEARCH) is None:
        return (f"`{interpreter} {command}`: {command} is not in {NO_PATH_SEARCH}, where env looks "
                "when slurmd gives the hook no PATH")
    return None


def env_command(args: list[str]) -> str | None:
    """The program ``/usr/bin/env [-S] [-i] [-u NAME] [VAR=value...] program ...`` runs."""
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg in ("-u", "--unset", "-C", "--chdir"):
            skip_next = True
        elif not arg.startswith("-") and "=" not in arg:
            return arg
    return None


# --------------------------------------------------------------------------- TaskProlog


def check_task_prolog(ctx: Context) -> Iterator[Finding]:
    """TaskProlog= is set, and the program runs: exit 0 and an export of
    SLURMGPU_CHECKPOINT_FILE, given only SLURM_JOB_ID."""
    conf = ctx.slurm_conf
    if conf is None:
        yield skip("slurm.task_prolog", NO_CONF)
        return
    setting = conf.get("TaskProlog")
    if setting is None:
        yield warn("slurm.task_prolog", f"{conf.path} sets no TaskProlog: jobs never learn "
                                        "$SLURMGPU_CHECKPOINT_FILE, so they cannot ack checkpoints",
                   f"add `TaskProlog={SHIPPED}/slurmgpu-taskprolog` to {conf.path}")
        return
    if ctx.role == HEAD:
        yield ok("slurm.task_prolog", f"TaskProlog={setting.value} ({setting.where}); the program "
                                      "is checked on the GPU nodes")
        return
    problem = program_problem("slurm.task_prolog", setting, setting.value)
    yield problem if problem is not None else run_task_prolog(setting)


def run_task_prolog(setting: Setting) -> Finding:
    from slurmgpu.jobfiles import CHECKPOINT_FILE_ENV

    path = setting.value
    drop = job_user()
    as_user = f"runuser -u {TASK_PROLOG_USER} -- " if drop else ""
    by_hand = f"{as_user}env -i SLURM_JOB_ID={FAKE_JOB_ID} {path}"
    who = f" as {TASK_PROLOG_USER}" if drop else ""
    started = time.monotonic()
    try:
        code, out, err = run_bounded([path], {"SLURM_JOB_ID": FAKE_JOB_ID}, drop)
    except subprocess.TimeoutExpired:
        return fail("slurm.task_prolog", f"{path} did not finish within {STEP_TIMEOUT_S:g} s{who} "
                                         "(it runs before every task)", f"run `{by_hand}` to see where it hangs")
    except OSError as exc:
        return fail("slurm.task_prolog", f"{path} cannot be run{who}: {exc.strerror or exc}",
                    f"run `{by_hand}` to see why")
    took = (time.monotonic() - started) * 1000
    if code != 0:
        last = (err.strip().splitlines() or [""])[-1]
        return fail("slurm.task_prolog", f"{path} exited {code}{who} given only SLURM_JOB_ID: {last}",
                    f"run `{by_hand}` to see why")
    if f"export {CHECKPOINT_FILE_ENV}=" not in out:
        return warn("slurm.task_prolog", f"{path} runs{who} but exports no {CHECKPOINT_FILE_ENV}: jobs "
                                         "cannot find their checkpoint requests",
                    f"run `{by_hand}`: the interpreter it finds must be one a job's user can run; "
                    f"point TaskProlog= at {SHIPPED}/slurmgpu-taskprolog, or run it from yours")
    return ok("slurm.task_prolog", f"TaskProlog={path} runs{who} ({took:.0f} ms) and exports "
                                   f"{CHECKPOINT_FILE_ENV}")


def job_user() -> dict[str, Any]:
    """How to run a program as TASK_PROLOG_USER (subprocess arguments): only when this is
    root and the user exists; else as this user ({})."""
    import pwd

    if os.geteuid() != 0:
        return {}
    try:
        user = pwd.getpwnam(TASK_PROLOG_USER)
    except KeyError:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def run_bounded(argv: list[str], env: Mapping[str, str], drop: Mapping[str, Any]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a program in a process group of its own, in "/";
    past STEP_TIMEOUT_S the whole group is killed (nothing it started is left behind) and
    TimeoutExpired raised."""
    proc = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", cwd="/",
                            start_new_session=True, **drop)
    try:
        out, err = proc.communicate(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):  # (already gone)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


# --------------------------------------------------------------------------- slurmctld


def check_slurmctld(ctx: Context) -> Iterator[Finding]:
    """``scontrol ping`` through the Slurm client the hooks use, once, within the step
    timeout, with SLURM_CONF pointing at the slurm.conf checked above."""
    from slurmgpu.slurm import SlurmError
    from slurmgpu.slurm.cli import CliSlurmClient

    conf_env = {ENV_VAR: ctx.slurm_conf.path} if ctx.slurm_conf is not None else {}
    bin_dir = ctx.settings.slurm.bin_dir if ctx.settings is not None else None
    client = CliSlurmClient(bin_dir=bin_dir, env={**ctx.environ, **conf_env}, retries=1,
                            command_timeout_s=STEP_TIMEOUT_S)
    try:
        proc = client.run("scontrol", "ping")
    except SlurmError as exc:
        # (one try: "unreachable after 1 tries" says nothing the line does not)
        detail = re.sub(r"^slurmctld unreachable after \d+ tries: ", "", str(exc))
        yield fail("slurmctld", f"slurmctld does not answer: {detail}", _ping_fix(ctx))
        return
    answer = "; ".join(line.strip() for line in proc.stdout.splitlines() if line.strip())
    yield ok("slurmctld", answer or "scontrol ping: exit 0")
    yield slurm_version_report(client)
    yield from _slurmgpu_drains(client)


#: Where an admin reads a whole drain reason (`sinfo -R` cuts it at 20 characters).
READ_REASONS = '`slurmgpu nodes` or `sinfo -R -o "%60E %19H %N"`'


def _slurmgpu_drains(client: CliSlurmClient) -> Iterator[Finding]:
    """The nodes slurmgpu drained now, and where their whole reasons are read (nothing
    when there are none or Slurm does not list its nodes)."""
    from slurmgpu.decision import REASON_PREFIX
    from slurmgpu.slurm import SlurmError

    try:
        nodes = client.nodes()
    except SlurmError:
        return
    drained = sorted(n.name for n in nodes if n.drained and (n.reason or "").startswith(REASON_PREFIX))
    if drained:
        yield ok("slurm.drains", f"{len(drained)} node(s) drained by slurmgpu ({', '.join(drained)}): "
                                 f"read the whole reasons with {READ_REASONS} (plain `sinfo -R` shows "
                                 "20 characters)")


def slurm_version_report(client: CliSlurmClient) -> Finding:
    """The Slurm release slurmctld runs (``scontrol show config``), and whether CI tests it."""
    from slurmgpu.slurm import SlurmError
    from slurmgpu.slurm.versions import TESTED, version_text

    tested = ", ".join(version_text(v) for v in TESTED)
    try:
        version = client.controller_version()
    except SlurmError as exc:
        return warn("slurm.version", f"cannot tell slurmctld's Slurm version: {exc}",
                    "`scontrol show config` must print SLURM_VERSION")
    if version is None:
        return warn("slurm.version", "`scontrol show config` printed no SLURM_VERSION",
                    "check that scontrol and slurmctld are the same Slurm")
    note = "tested in CI" if version in TESTED else f"CI tests {tested} only"
    return ok("slurm.version", f"slurmctld runs Slurm {version_text(version)} ({note})")


def _ping_fix(ctx: Context) -> str:
    if ctx.slurm_conf is None:
        return f"set {ENV_VAR} to the cluster's slurm.conf (none was found), then retry"
    used = Path(ctx.slurm_conf.path)
    return (f"start slurmctld (scontrol read {ENV_VAR}={used}); if that is not the cluster's "
            f"slurm.conf, set {ENV_VAR} or pass --slurm-conf")
