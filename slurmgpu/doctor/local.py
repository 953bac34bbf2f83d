"""Doctor checks of this host's own installation: the config file, the CURVE keys, the
writable directories, NVML and the agent's local socket."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgpu.doctor.model import HEAD, STEP_TIMEOUT_S, Context, Finding, fail, ok, skip, warn

if TYPE_CHECKING:
    from slurmgpu.facts import NvmlFacts

NEEDS_CONFIG = "needs a valid config (see the config line)"
AGENT_UNIT = "slurmgpu-agent"


# --------------------------------------------------------------------------- config


def check_config(ctx: Context) -> Iterator[Finding]:
    """The config file is found, parses and validates (the loader every command uses)."""
    from slurmgpu.checks.registry import all_checks
    from slurmgpu.config.load import load_config
    from slurmgpu.errors import ConfigError

    try:
        loaded = load_config(ctx.config_file, environ=ctx.environ,
                             known_checks=[c.id for c in all_checks()])
    except ConfigError as exc:
        ctx.config_error = str(exc)
        where = exc.path or ctx.config_path
        key = f"`{exc.key}` in " if exc.key else ""
        yield fail("config", str(exc),
                   f"fix {key}{where}, then `slurmgpu config check {where}` must say OK")
        return
    ctx.loaded, ctx.settings = loaded, loaded.settings_for(ctx.node, ctx.environ)
    dropins = "".join(f", drop-in {d.path}" for d in loaded.dropins)
    if loaded.path is None:
        yield ok("config", f"{ctx.config_path} not present: the defaults apply{dropins}")
        return
    n = len(loaded.all_hosts)
    yield ok("config", f"{loaded.path} is valid ({n} [[hosts]] section{'' if n == 1 else 's'}"
                       f"{dropins})")


# --------------------------------------------------------------------------- keys


def expects_agent(ctx: Context) -> bool:
    """Whether this node is meant to run the agent: it has a node bundle, its config names
    a collector, or an agent socket exists. A node with none of these runs the Slurm hooks
    alone (the supported minimal install), and the agent/collector checks do not apply."""
    if (Path(ctx.keys_dir) / "node.key_secret").exists() or ctx.configured("collector.address"):
        return True
    return ctx.settings is not None and os.path.exists(agent_socket(ctx))


def check_keys(ctx: Context) -> Iterator[Finding]:
    """The node bundle (node) or the collector keypair and allow-list (head), loaded and
    permission-checked by ``slurmgpu.keys``, the code the daemons use."""
    if ctx.role == HEAD:
        yield _collector_keys(ctx)
    elif not expects_agent(ctx):
        yield skip("keys", f"no node bundle in {ctx.keys_dir} and no [collector] address: "
                           "this node runs the Slurm hooks without an agent")
    else:
        yield _node_keys(ctx)


def _node_keys(ctx: Context) -> Finding:
    from slurmgpu import keys

    secret = Path(ctx.keys_dir) / "node.key_secret"
    if not secret.exists():
        return fail("keys", f"no node bundle in {ctx.keys_dir} ({secret.name} missing)",
                    f"on the head node run `slurmgpu keys add-node {ctx.node}` and copy "
                    f"bundles/{ctx.node}/* to {ctx.keys_dir}")
    problem = _private_file_problem(secret)
    if problem is not None:
        return problem
    try:
        public, _secret, collector = keys.client_keys(ctx.keys_dir)
    except keys.KeyFileError as exc:
        return fail("keys", str(exc), f"copy the bundle again from the head node "
                                      f"(`slurmgpu keys add-node {ctx.node} --force` makes a new one)")
    return ok("keys", f"node key {keys.fingerprint(public)}, collector key "
                      f"{keys.fingerprint(collector)} ({ctx.keys_dir})")


def _collector_keys(ctx: Context) -> Finding:
    from slurmgpu import keys

    secret = Path(ctx.keys_dir) / "collector.key_secret"
    if not secret.exists():
        return fail("keys", f"no collector keypair in {ctx.keys_dir}",
                    f"run `slurmgpu keys init --dir {ctx.keys_dir}`")
    problem = _private_file_problem(secret)
    if problem is not None:
        return problem
    nodes_dir = Path(ctx.keys_dir) / keys.NODES_DIR
    try:
        public, _secret = keys.server_keys(ctx.keys_dir)
        allowed = keys.allowed_nodes(ctx.keys_dir)
    except keys.InsecureKeyError as exc:
        return fail("keys", str(exc), f"run: chmod 700 {nodes_dir}")
    except keys.KeyFileError as exc:
        return fail("keys", str(exc), "fix or remove the file named (see docs/keys.md)")
    if not allowed:
        return warn("keys", f"collector key {keys.fingerprint(public)}; no node is allow-listed "
                            f"in {nodes_dir}", "run `slurmgpu keys add-node NODE` for each GPU node")
    return ok("keys", f"collector key {keys.fingerprint(public)}, {len(allowed)} node"
                      f"{'' if len(allowed) == 1 else 's'} allow-listed ({nodes_dir})")


def _private_file_problem(path: Path) -> Finding | None:
    """``keys.check_private``'s verdict on a secret key file, with the command that fixes it."""
    from slurmgpu import keys

    try:
        keys.check_private(path)
    except keys.InsecureKeyError as exc:
        return fail("keys", str(exc), _private_fix(path))
    except keys.KeyFileError as exc:
        return fail("keys", str(exc), f"copy {path.name} again from the head node")
    return None


def _private_fix(path: Path) -> str:
    st = os.stat(path)
    if stat.S_IMODE(st.st_mode) & 0o077:
        return f"run: chmod 600 {path}"
    if os.geteuid() == 0:
        return f"run: chown root:root {path} (the daemons run as root)"
    return "run `slurmgpu doctor` as root, the user the daemons run as"


# --------------------------------------------------------------------------- directories


def check_dirs(ctx: Context) -> Iterator[Finding]:
    """Each directory slurmgpu writes takes a new file (made and removed again)."""
    settings = ctx.settings
    if settings is None:
        yield skip("dirs", NEEDS_CONFIG)
        return
    dirs = [("dir.state", settings.paths.state_dir, "[paths] state_dir")]
    if ctx.role == HEAD and "://" not in settings.collector.db:  # (a URL: PostgreSQL, no directory)
        dirs.append(("dir.db", os.path.dirname(os.path.abspath(settings.collector.db)), "[collector] db"))
    elif expects_agent(ctx):
        dirs.append(("dir.spool", settings.agent.spool_dir, "[agent] spool_dir"))
    for check_id, path, key in dirs:
        yield _writable(check_id, path, key)


def _writable(check_id: str, path: str, key: str) -> Finding:
    directory = Path(path)
    if not directory.exists():
        return _creatable(check_id, directory, key)
    if not directory.is_dir():
        return fail(check_id, f"{directory} ({key}) is not a directory",
                    f"remove {directory} or point {key} at a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".slurmgpu-doctor-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return fail(check_id, f"cannot create a file in {directory} ({key}): {exc.strerror or exc}",
                    _write_fix(directory, exc))
    return ok(check_id, f"{directory} is writable")


def _creatable(check_id: str, directory: Path, key: str) -> Finding:
    """A missing directory is made on first use (the gate and the spool mkdir it), if the
    nearest existing parent lets it."""
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return fail(check_id, f"{directory} ({key}) cannot be created: {parent} is not a directory",
                    f"remove {parent} or point {key} elsewhere")
    if not os.access(parent, os.W_OK | os.X_OK):
        return fail(check_id, f"{directory} ({key}) does not exist and {parent} is not writable",
                    f"run: mkdir -p -m 0750 {directory}")
    return ok(check_id, f"{directory} does not exist yet; it is created on first use")


def _write_fix(directory: Path, exc: OSError) -> str:
    import errno

    if exc.errno == errno.ENOSPC:
        return f"free space on the filesystem holding {directory} (df -h {directory})"
    if exc.errno == errno.EROFS:
        return f"the filesystem holding {directory} is read-only: remount it read-write"
    return f"run: chown root:root {directory} && chmod 0750 {directory}"


# --------------------------------------------------------------------------- NVML


def check_nvml(ctx: Context) -> Iterator[Finding]:
    """libnvidia-ml.so.1 loads through the NVML source the gate uses, and the engine's own
    ``gpu.count`` check agrees with ``[gpu] count``."""
    settings = ctx.settings
    if settings is None:
        yield skip("nvml", NEEDS_CONFIG)
        return
    if ctx.role == HEAD:
        yield skip("nvml", "head node: no GPUs expected")
        return
    if settings.gpu.count == 0:
        yield skip("nvml", "[gpu] count = 0: no GPUs expected on this node")
        return
    from slurmgpu.sources.deadline import DeadlineNvmlSource
    from slurmgpu.sources.nvml import PynvmlSource

    # frozenset(): the system queries and the device count only, no per-GPU reads; a hung
    # driver answers within [nvml] query_deadline_s.
    source = PynvmlSource(settings.nvml.library, retry_delay_s=0)
    nvml = DeadlineNvmlSource(source, settings.nvml.query_deadline_s).collect(frozenset())
    yield _gpu_count_finding(ctx, nvml)


def _gpu_count_finding(ctx: Context, nvml: NvmlFacts) -> Finding:
    """The engine's ``gpu.count`` check on these facts, with a fix for its finding."""
    from slurmgpu.checks.registry import all_checks
    from slurmgpu.engine import assemble, evaluate
    from slurmgpu.result import Severity

    assert ctx.settings is not None
    facts = assemble(ctx.node, nvml, collected_at=time.time())
    spec = [c for c in all_checks() if c.id == "gpu.count"]
    problems = evaluate(facts, ctx.settings, checks=spec).problems()
    driver_fix = ("load the NVIDIA driver (`nvidia-smi` must work) or set [nvml] library; "
                  "on a node without GPUs set [gpu] count = 0")
    if not nvml.available and not problems:  # the gate's reading: no count, no GPUs expected
        return warn("nvml", f"{nvml.error}; [gpu] count is not set, so the gate treats this node "
                            "as having no GPUs", driver_fix)
    if not problems:
        unpinned = " ([gpu] count not set: not checked)" if ctx.settings.gpu.count is None else ""
        return ok("nvml", f"NVML loaded, driver {nvml.driver_version}: {nvml.device_count} GPUs{unpinned}")
    message = "; ".join(p.message for p in problems)
    if not nvml.available:
        return fail("nvml", message, driver_fix)
    level = fail if any(p.severity is Severity.FAIL for p in problems) else warn
    return level("nvml", message, f"`nvidia-smi -L` and the kernel log (XIDs) show which GPU is "
                                  f"missing; if the node has {nvml.device_count}, set [gpu] count = "
                                  f"{nvml.device_count} in {ctx.config_path}")


# --------------------------------------------------------------------------- agent socket


def agent_socket(ctx: Context) -> str:
    """Where the hooks look for the agent (``slurmgpu.localproto``, as the hooks do)."""
    from slurmgpu.localproto import socket_path

    assert ctx.settings is not None
    return socket_path(ctx.environ, ctx.settings.agent.socket)


def check_agent(ctx: Context) -> Iterator[Finding]:
    """The agent answers a ``status`` request on its socket, through the hooks' protocol."""
    settings = ctx.settings
    if settings is None:
        yield skip("agent", NEEDS_CONFIG)
        return
    if ctx.role == HEAD:
        yield skip("agent", "head node: the agent runs on the GPU nodes")
        return
    path = agent_socket(ctx)
    if not expects_agent(ctx):
        yield skip("agent", f"no agent set up here (no socket at {path}, no node bundle): "
                            "the hooks take the direct path")
        return
    from slurmgpu.localproto import AgentUnavailable, ask

    started = time.monotonic()
    try:
        reply = ask(path, {"op": "status"}, STEP_TIMEOUT_S)
    except AgentUnavailable as exc:
        yield fail("agent", f"no answer on {path}: {exc}", agent_down_fix(ctx.environ))
        return
    took = time.monotonic() - started
    yield _agent_status(ctx, path, reply, took)


def agent_down_fix(environ: Mapping[str, str]) -> str:
    """``enable --now`` for a unit that was never enabled (the packages enable nothing),
    else ``restart``; what ``systemctl is-enabled`` says decides (no systemctl: restart)."""
    import shutil
    import subprocess

    systemctl = shutil.which("systemctl", path=environ.get("PATH"))
    state = ""
    if systemctl is not None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            state = subprocess.run([systemctl, "is-enabled", f"{AGENT_UNIT}.service"], text=True,
                                   capture_output=True, timeout=STEP_TIMEOUT_S).stdout.strip()
    if state == "disabled":
        return (f"systemctl enable --now {AGENT_UNIT} (installed, never enabled: the packages "
                "enable nothing)")
    return f"systemctl restart {AGENT_UNIT}; `journalctl -u {AGENT_UNIT}` says why it is down"


def _agent_status(ctx: Context, path: str, reply: dict[str, Any], took: float) -> Finding:
    assert ctx.settings is not None
    agent = ctx.settings.agent
    if reply.get("ok") is not True:
        return fail("agent", f"{path} refused the request: {reply.get('error')}",
                    f"run `slurmgpu doctor` as root or as [agent] slurm_user ({agent.slurm_user})")
    if reply.get("node") != ctx.node:
        return warn("agent", f"the agent on {path} serves {reply.get('node')}, not {ctx.node}",
                    f"start the agent with --node {ctx.node} (or fix SLURMD_NODENAME/the hostname)")
    if took > agent.query_timeout_s:
        return warn("agent", f"the agent took {took:.2f} s to answer; the hooks wait "
                             f"{agent.query_timeout_s:g} s, then take the slow direct path",
                    f"`journalctl -u {AGENT_UNIT}` for what keeps it busy; or raise [agent] query_timeout_s")
    age = reply.get("age_s")
    if isinstance(age, int | float) and age > 3 * agent.interval_s:
        return warn("agent", f"the agent's facts are {age:.0f} s old (polls every {agent.interval_s:g} s)",
                    f"its poll loop is stuck: systemctl restart {AGENT_UNIT}")
    verdict = reply.get("verdict") or "no poll yet"
    return ok("agent", f"answers on {path} in {took * 1000:.0f} ms: {ctx.node} {verdict}")
