"""Site checks as plugins: the ``slurmgpu.checks`` entry-point group.

A distribution installed next to slurmgpu declares, in its pyproject.toml::

    [project.entry-points."slurmgpu.checks"]
    acme = "acme_gpu_checks.power"          # a module: importing it registers its checks
    # acme = "acme_gpu_checks:register"     # or a callable, called once with no arguments

and its module registers checks with the public decorator (``slurmgpu.checks.check``),
into the same registry as the built-in checks, so the runner, ``[checks] disabled``
globs and ``[[hosts]]`` sections treat them alike. Rules (docs/adding-a-check.md):

Design notes: docs/design-notes.md (``slurmgpu/checks/plugins.py``).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable
from typing import NamedTuple

from slurmgpu.checks import registry
from slurmgpu.checks.registry import CheckContext, CheckSpec, Origin, unknown
from slurmgpu.result import Finding, Severity

GROUP = "slurmgpu.checks"
# Entry-point values: "module.path", "module.path:attr.path", optional "[extras]".
_VALUE = r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$"


class EntryPoint(NamedTuple):  # not a dataclass: ~1 ms less of import on the prolog's path
    name: str
    value: str
    dist: str  # the distribution's Name (its METADATA)
    version: str

    @property
    def origin(self) -> Origin:
        return Origin(self.name, self.value, self.dist, self.version)


_discovered: list[EntryPoint] | None = None
_attempted: set[tuple[str, str]] = set()  # (dist, entry point name)
# The agent evaluates from more than one thread: one of them loads, the others wait.
_lock = threading.RLock()


def discover() -> list[EntryPoint]:
    """The ``slurmgpu.checks`` entry points installed, in ``sys.path`` order (what
    ``importlib.metadata.entry_points(group=GROUP)`` returns). Scanned once per process."""
    global _discovered
    if _discovered is None:
        _discovered = _scan_paths(sys.path) if _plain_paths() else _scan_importlib()
    return _discovered


def installed_namespaces() -> set[str]:
    """The ``<distribution>`` namespaces the installed plugins' ids may use (besides ``site``)."""
    return {ns for ns in (registry.dist_namespace(ep.dist) for ep in discover()) if ns}


def _plain_paths() -> bool:
    """True when every distribution importlib.metadata would find is a ``*.dist-info`` or
    ``*.egg-info`` directory in a plain directory on sys.path."""
    from importlib.machinery import PathFinder

    if any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path):
        return False
    return not any(p.lower().endswith(".egg") or os.path.isfile(p) for p in sys.path)


def _scan_importlib() -> list[EntryPoint]:
    from importlib.metadata import entry_points

    return [EntryPoint(ep.name, ep.value, ep.dist.name if ep.dist else "?",
                       ep.dist.version if ep.dist else "?")
            for ep in entry_points(group=GROUP)]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _scan_paths(paths: list[str]) -> list[EntryPoint]:
    """importlib.metadata's discovery, for plain directories: the first distribution of
    each (normalized) name on the path wins; within a directory, listing order."""
    seen: set[str] = set()
    found: list[EntryPoint] = []
    for path in paths:
        try:
            children = os.listdir(path or ".")
        except OSError:
            continue
        infos: dict[str, list[str]] = {}
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                infos.setdefault(_normalize(low.rpartition(".")[0].partition("-")[0]), []).append(child)
        for name, dirs in infos.items():
            if name not in seen:
                seen.add(name)
                found.extend(_entry_points(os.path.join(path or ".", dirs[0])))
    return found


def _entry_points(info_dir: str) -> list[EntryPoint]:
    try:
        with open(os.path.join(info_dir, "entry_points.txt"), encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return []
    if GROUP not in text:
        return []
    pairs = []
    section = None
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
        elif section == GROUP and "=" in line:
            name, value = line.split("=", 1)
            pairs.append((name.strip(), value.strip()))
    if not pairs:
        return []
    dist, version = _name_version(info_dir)
    return [EntryPoint(name, value, dist, version) for name, value in pairs]


def _name_version(info_dir: str) -> tuple[str, str]:
    """Name and Version from METADATA (PKG-INFO for an egg-info), else the directory's."""
    stem = os.path.basename(info_dir).rpartition(".")[0]
    name, _, version = stem.partition("-")
    for file in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info_dir, file), encoding="utf-8") as fh:
                headers = fh.read(65536).split("\n\n", 1)[0]
        except (OSError, UnicodeDecodeError):
            continue
        fields = dict(line.split(": ", 1) for line in headers.splitlines() if ": " in line)
        return fields.get("Name", name), fields.get("Version", version.partition("-")[0])
    return name, version.partition("-")[0]


def load_plugins(skip: Callable[[str], bool] = lambda check_id: False) -> None:
    """Import every entry point not yet tried whose ``plugin.<name>`` id ``skip`` does not
    name (``[checks] disabled``). Never raises: a plugin that fails registers nothing
    and leaves one UNKNOWN check in its place."""
    import slurmgpu.checks  # noqa: F401  (built-ins first: a plugin importing them must not own them)

    with _lock:
        for ep in discover():
            key = (ep.dist, ep.name)
            if key in _attempted or skip(f"plugin.{ep.name}"):
                continue
            _attempted.add(key)
            error = _load(ep)
            if error is not None:
                _failed(ep, error)


def _load(ep: EntryPoint) -> str | None:
    """Import the entry point (and call it, when it names a callable that is not itself a
    check); the error text when that failed."""
    import contextlib
    import importlib

    match = re.match(_VALUE, ep.value)
    if match is None:
        return f"entry point value {ep.value!r} is not 'module' or 'module:attr'"
    try:
        # A plugin printing while it loads must not corrupt `check --json`.
        with registry.registering(ep.origin) as registered, contextlib.redirect_stdout(sys.stderr):
            target: object = importlib.import_module(match["module"])
            for attr in filter(None, (match["attr"] or "").split(".")):
                target = getattr(target, attr)
            if match["attr"] and callable(target) and not registry.is_registered(target):
                target()
            if not registered:
                registry.adopt(match["module"], ep.origin)
    except (Exception, SystemExit) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _failed(ep: EntryPoint, error: str) -> None:
    message = f"plugin {ep.name} ({ep.dist} {ep.version}) failed to load, its checks do not run: {error}"

    def report(ctx: CheckContext) -> list[Finding]:
        return [unknown(message, subject=ep.dist)]

    summary = f"{ep.value} from {ep.dist} {ep.version}: {error}"
    for check_id in (f"plugin.{ep.name}", f"plugin.{ep.name}.{_normalize(ep.dist)}"):
        # The second id only for two distributions' entry points of one name, both broken.
        if registry.register_spec(CheckSpec(check_id, report, Severity.UNKNOWN,
                                            (f"entry point {ep.value}",), summary, ep.origin)):
            break
    try:
        from slurmgpu import log

        log.get_logger().error("plugin_load_failed", entry_point=ep.name, value=ep.value,
                               distribution=ep.dist, version=ep.version, error=error)
    except Exception:  # pragma: no cover - the finding says it anyway
        pass
