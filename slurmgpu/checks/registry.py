"""The one registry of checks.

A check is a small pure function over ``CheckContext`` registered with
``@check(id, ...)``. It returns findings; the runner stamps the check id on
them, turns an exception into one UNKNOWN finding, and adds an OK finding
when a check had nothing to say. Check ids are stable: configs, policies and
history refer to them.

Site checks register with the same decorator from their own distribution, loaded
through the ``slurmgpu.checks`` entry points (``slurmgpu.checks.plugins``). Their ids
follow one naming rule (``plugin_id_error``): namespaced ``site.*`` or
``<distribution>.*``, never a built-in id nor a built-in namespace; a built-in check
always wins.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import field
from typing import Any

from slurmgpu.config.schema import Settings
from slurmgpu.facts import GpuFacts, NodeFacts
from slurmgpu.record import record
from slurmgpu.result import Finding, Severity
from slurmgpu.xid import XidPolicy


@record(frozen=True)
class CheckContext:
    """What a check reads: the facts, the settings, the XID policy."""

    facts: NodeFacts
    settings: Settings
    xid_policy: XidPolicy
    # NVML indices of the GPUs this run is about (a job's GPUs), or None for all.
    scope: frozenset[int] | None = None

    def gpus(self) -> list[GpuFacts]:
        """GPUs in scope, including lost ones."""
        return [g for g in self.facts.gpus if self.scope is None or g.index in self.scope]

    def live_gpus(self) -> list[GpuFacts]:
        """GPUs in scope that answered NVML; ``gpu.lost`` and ``gpu.responsive`` report the others."""
        return [g for g in self.gpus() if not g.lost and g.unresponsive is None]


CheckFunc = Callable[[CheckContext], Iterable[Finding]]


@record(frozen=True)
class Origin:
    """Where a plugin check comes from. ``entry_point`` is empty for a check registered
    by a module imported some other way (then ``value`` is that module's name)."""

    entry_point: str
    value: str  # "module" or "module:attr", as the entry point names it
    dist: str = ""
    version: str = ""

    def describe(self) -> str:
        if not self.entry_point:
            return f"module {self.value}"
        return f"plugin {self.entry_point} ({self.dist} {self.version})"

    def to_json(self) -> dict[str, str]:
        return {"name": self.entry_point, "value": self.value, "distribution": self.dist,
                "version": self.version}


@record(frozen=True)
class CheckSpec:
    """A registered check: its id, function, severity and the facts it reads."""

    id: str
    func: CheckFunc = field(compare=False)
    # The worst severity this check raises with default settings.
    severity: Severity
    # Which facts it reads, for `slurmgpu checks list`.
    reads: tuple[str, ...]
    summary: str
    # None: a built-in check; else the plugin that registered it.
    origin: Origin | None = field(default=None, compare=False)

    @property
    def source(self) -> str:
        return "built-in" if self.origin is None else self.origin.describe()


class CheckIdError(ValueError):
    """A plugin registered a check id the naming rule refuses."""


# Namespaces no plugin may use besides the built-in ones: the loader's own findings
# (plugin.<entry point>), the agent's (agent.spool, ...), and the project's name.
RESERVED_NAMESPACES = frozenset({"plugin", "agent", "slurmgpu"})
SITE_NAMESPACE = "site"
_ID_PART = r"[a-z][a-z0-9_]*"
_PLUGIN_ID = re.compile(rf"{_ID_PART}(?:\.{_ID_PART})+")

_REGISTRY: dict[str, CheckSpec] = {}


@record
class _Scope:
    """The checks one origin (built-in or a plugin) registered."""

    origin: Origin
    namespaces: tuple[str, ...]
    registered: list[str] = field(default_factory=list)


_scope: _Scope | None = None


def check(check_id: str, *, severity: Severity, reads: Iterable[str], summary: str
          ) -> Callable[[CheckFunc], CheckFunc]:
    def register(func: CheckFunc) -> CheckFunc:
        origin, namespaces = _registrant(func)
        if origin is not None:
            error = plugin_id_error(check_id, namespaces)
            if error:
                raise CheckIdError(error)
        elif check_id in _REGISTRY:
            raise RuntimeError(f"check {check_id!r} registered twice")
        _REGISTRY[check_id] = CheckSpec(check_id, func, severity, tuple(reads), summary, origin)
        if _scope is not None:
            _scope.registered.append(check_id)
        return func
    return register


def _registrant(func: CheckFunc) -> tuple[Origin | None, tuple[str, ...]]:
    """Who registers ``func``: the plugin being loaded, slurmgpu itself (None), or a
    module imported outside the loader (``site.*`` ids only)."""
    if _scope is not None:
        return _scope.origin, _scope.namespaces
    module = getattr(func, "__module__", None) or "?"
    if module.startswith("slurmgpu."):
        return None, ()
    return Origin("", module), (SITE_NAMESPACE,)


def reserved_namespaces() -> frozenset[str]:
    """Namespaces plugins may not use: every built-in check's, and RESERVED_NAMESPACES."""
    import slurmgpu.checks  # noqa: F401  (the built-in checks, registered)

    return RESERVED_NAMESPACES | {s.id.split(".", 1)[0] for s in _REGISTRY.values() if s.origin is None}


def dist_namespace(dist: str) -> str | None:
    """The namespace a distribution's plugin checks may use besides ``site``: its name
    normalized ("Acme-GPU.checks" -> "acme_gpu_checks"); None when that is no valid id
    part or a reserved namespace."""
    own = re.sub(r"[-_.]+", "_", dist).lower()
    if own == SITE_NAMESPACE or not re.fullmatch(_ID_PART, own) or own in reserved_namespaces():
        return None
    return own


def plugin_id_error(check_id: str, namespaces: Iterable[str]) -> str | None:
    """Why a plugin may not register ``check_id``, or None. ``namespaces``: the first
    id parts it may use (``site`` and its distribution's)."""
    allowed = tuple(namespaces)
    existing = _REGISTRY.get(check_id)
    if existing is not None and existing.origin is None:
        return (f"check id {check_id!r} is a built-in check: a plugin cannot replace it "
                "(the built-in check runs)")
    if not _PLUGIN_ID.fullmatch(check_id):
        return (f"check id {check_id!r} is not a dotted lowercase id such as "
                f"'{allowed[0]}.scratch_space'")
    if check_id.split(".", 1)[0] not in allowed:
        return (f"plugin check id {check_id!r} must start with "
                + " or ".join(f"'{ns}.'" for ns in allowed))
    if existing is not None:
        return f"check id {check_id!r} is already registered by {existing.source}"
    return None


@contextlib.contextmanager
def registering(origin: Origin) -> Iterator[list[str]]:
    """Checks registered inside the block are ``origin``'s, held to the naming rule. When
    the block raises, every one of them is removed again: a plugin loads whole or not
    at all. Yields the ids registered so far."""
    global _scope
    own = dist_namespace(origin.dist) if origin.dist else None
    namespaces = (SITE_NAMESPACE, own) if own else (SITE_NAMESPACE,)
    scope, previous = _Scope(origin, namespaces), _scope
    _scope = scope
    try:
        yield scope.registered
    except BaseException:
        for check_id in scope.registered:
            _REGISTRY.pop(check_id, None)
        raise
    finally:
        _scope = previous


def adopt(module: str, origin: Origin) -> list[str]:
    """Checks registered from ``module`` (or a submodule) before its entry point was
    loaded, e.g. by a test importing it: credited to ``origin`` now."""
    adopted = []
    for spec in list(_REGISTRY.values()):
        if spec.origin is not None and not spec.origin.entry_point and (
                spec.origin.value == module or spec.origin.value.startswith(module + ".")):
            _REGISTRY[spec.id] = CheckSpec(spec.id, spec.func, spec.severity, spec.reads,
                                           spec.summary, origin)
            adopted.append(spec.id)
    return adopted


def register_spec(spec: CheckSpec) -> bool:
    """Register a ready-made spec (the loader's ``plugin.<name>`` check for a plugin that
    failed to load); False, and nothing changed, when its id is taken."""
    if spec.id in _REGISTRY:
        return False
    _REGISTRY[spec.id] = spec
    return True


def is_registered(func: object) -> bool:
    return any(spec.func is func for spec in _REGISTRY.values())


def all_checks(*, plugins: bool = False) -> list[CheckSpec]:
    """The built-in checks; with ``plugins``, also the site plugins' (loaded on first use,
    see ``slurmgpu.checks.plugins``), a plugin that failed to load as one check
    ``plugin.<entry point>``."""
    import slurmgpu.checks  # noqa: F401  (imports every check module, filling the registry)

    if plugins:
        from slurmgpu.checks.plugins import load_plugins

        load_plugins()
    return sorted((s for s in _REGISTRY.values() if plugins or s.origin is None), key=lambda s: s.id)


def enabled_checks(disabled: Iterable[str], *, plugins: bool = False) -> list[CheckSpec]:
    """The checks ``[checks] disabled`` leaves on. A plugin whose ``plugin.<entry point>``
    id is disabled is not even imported."""
    import slurmgpu.checks  # noqa: F401

    patterns = list(disabled)

    def off(check_id: str) -> bool:
        return any(fnmatch.fnmatchcase(check_id, p) for p in patterns)

    if plugins:
        from slurmgpu.checks.plugins import load_plugins

        load_plugins(skip=off)
    return [s for s in sorted(_REGISTRY.values(), key=lambda s: s.id)
            if (plugins or s.origin is None) and not off(s.id)]


# Helpers that keep check bodies short. The runner fills in ``check``.

def ok(message: str, *, gpu: int | None = None, subject: str | None = None, **data: Any) -> Finding:
    return Finding("", Severity.OK, message, gpu=gpu, subject=subject, data=data)


def not_applicable(message: str, *, gpu: int | None = None, subject: str | None = None) -> Finding:
    return Finding("", Severity.OK, message, gpu=gpu, subject=subject, not_applicable=True)


def problem(severity: Severity | str, message: str, *, gpu: int | None = None,
            subject: str | None = None, **data: Any) -> Finding:
    if isinstance(severity, str):
        severity = Severity.parse(severity)
    return Finding("", severity, message, gpu=gpu, subject=subject, data=data)


def unknown(message: str, *, gpu: int | None = None, subject: str | None = None) -> Finding:
    return Finding("", Severity.UNKNOWN, message, gpu=gpu, subject=subject)
