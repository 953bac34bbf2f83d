"""GPU presence, modes and the driver's word: gpu.count, gpu.model, gpu.lost, gpu.responsive,
gpu.persistence, gpu.mig, gpu.nvml_errors, gpu.recovery_action."""

from __future__ import annotations

import re
from collections.abc import Iterator
from fnmatch import fnmatchcase

from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem
from slurmgpu.facts import (
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_RESET_REQUIRED,
    RECOVERY_ACTION_NAMES,
    GpuFacts,
    HungProcess,
)
from slurmgpu.result import Finding, Severity


@check("gpu.count", severity=Severity.FAIL, reads=("nvml.device_count", "nvml.available"),
       summary="NVML works and the node has the expected number of GPUs (and every GPU a job asked for)")
def gpu_count(ctx: CheckContext) -> Iterator[Finding]:
    nvml, expected = ctx.facts.nvml, ctx.settings.gpu.count
    if not nvml.available:
        if expected or ctx.scope:
            yield problem(Severity.FAIL, f"{nvml.error}; expected {expected or len(ctx.scope or ())} GPUs")
        else:
            yield not_applicable(f"no GPUs expected here ({nvml.error})")
        return
    if expected is not None and nvml.device_count != expected:
        yield problem(Severity.FAIL, f"{nvml.device_count} GPUs present, {expected} expected",
                      present=nvml.device_count, expected=expected)
    missing = sorted(i for i in ctx.scope or () if i >= nvml.device_count)
    if missing:
        yield problem(Severity.FAIL, f"requested GPU(s) {missing} not present (node has {nvml.device_count})",
                      missing=missing)
    if (expected is None or nvml.device_count == expected) and not missing:
        yield ok(f"{nvml.device_count} GPUs present", present=nvml.device_count)


@check("gpu.model", severity=Severity.FAIL, reads=("gpu.name",),
       summary="every GPU is a model [gpu] model names (NVML's name; globs allowed)")
def gpu_model(ctx: CheckContext) -> Iterator[Finding]:
    models = ctx.settings.gpu.model
    if not models:
        yield not_applicable("GPU model not pinned")
        return
    for gpu in ctx.live_gpus():
        if gpu.name is None or not any(fnmatchcase(gpu.name, m) for m in models):
            yield problem(Severity.FAIL, f"GPU is {gpu.name or 'of an unknown model'}, expected "
                          f"{' or '.join(models)}", gpu=gpu.index, actual=gpu.name, expected=models)


@check("gpu.lost", severity=Severity.FAIL, reads=("gpu.lost",),
       summary="no GPU answers NVML with GpuIsLost (fell off the bus)")
def gpu_lost(ctx: CheckContext) -> Iterator[Finding]:
    for gpu in ctx.gpus():
        if gpu.lost:
            yield problem(Severity.FAIL, "GPU is lost (fell off the bus); node needs a reboot", gpu=gpu.index)
        elif "handle" in gpu.errors:
            yield problem(Severity.FAIL, f"cannot get a handle: {gpu.errors['handle']}", gpu=gpu.index)


@check("gpu.responsive", severity=Severity.FAIL,
       reads=("gpu.unresponsive", "nvml.unresponsive", "host.hung_processes"),
       summary="every NVML query answers within [nvml] query_deadline_s (else FAIL: GPU not responding); "
               "processes in D state holding /dev/nvidia* warn")
def gpu_responsive(ctx: CheckContext) -> Iterator[Finding]:
    nvml = ctx.facts.nvml
    if nvml.unresponsive:
        yield problem(Severity.FAIL, f"NVML not responding: {nvml.unresponsive}", query=nvml.unresponsive)
    for gpu in ctx.gpus():
        if gpu.unresponsive is None:
            continue
        if gpu.unresponsive.startswith("not asked"):
            yield problem(Severity.WARN, gpu.unresponsive, gpu=gpu.index)
        else:
            yield problem(Severity.FAIL, f"GPU not responding: {gpu.unresponsive}", gpu=gpu.index,
                          query=gpu.unresponsive)
    for proc in ctx.facts.host.hung_processes:
        yield from _hung(ctx, proc)


_GPU_DEVICE = re.compile(r"/dev/nvidia(\d+)$")


def _hung(ctx: CheckContext, proc: HungProcess) -> Iterator[Finding]:
    gpus = sorted({int(m.group(1)) for d in proc.devices if (m := _GPU_DEVICE.match(d))})
    if ctx.scope is not None and gpus and not set(gpus) & ctx.scope:
        return
    where = gpus[0] if len(gpus) == 1 else None
    yield problem(Severity.WARN, f"process {proc.pid} ({proc.command}) in D state (uninterruptible) "
                  f"holding {', '.join(proc.devices)}", gpu=where, pid=proc.pid, devices=proc.devices)


@check("gpu.persistence", severity=Severity.WARN, reads=("gpu.persistence_mode",),
       summary="persistence mode is on (when [gpu] persistence = true)")
def gpu_persistence(ctx: CheckContext) -> Iterator[Finding]:
    if not ctx.settings.gpu.persistence:
        yield not_applicable("persistence mode not required")
        return
    for gpu in ctx.live_gpus():
        if gpu.persistence_mode is False:
            yield problem(Severity.WARN, "persistence mode is off", gpu=gpu.index)


@check("gpu.mig", severity=Severity.FAIL, reads=("gpu.mig_current", "gpu.mig_pending"),
       summary="MIG mode matches [gpu] mig and no MIG change is pending")
def gpu_mig(ctx: CheckContext) -> Iterator[Finding]:
    want = ctx.settings.gpu.mig
    for gpu in ctx.live_gpus():
        if gpu.mig_current is None:
            continue
        if gpu.mig_pending is not None and gpu.mig_pending != gpu.mig_current:
            yield problem(Severity.FAIL, "MIG mode change pending: GPU reset needed", gpu=gpu.index)
        elif want != "any" and gpu.mig_current != (want == "enabled"):
            state = "enabled" if gpu.mig_current else "disabled"
            yield problem(Severity.FAIL, f"MIG is {state}, expected {want}", gpu=gpu.index)


# NVML answers that say the question was wrong (slurmgpu's own trouble, an API the driver
# lacks, no permission): never evidence about the GPU, so never FAIL.
_NOT_HEALTH_CODES = frozenset({
    1,   # UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    6,   # NOT_FOUND
    NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    21,  # NO_DATA
    22,  # VGPU_ECC_NOT_SUPPORTED
    24,  # FREQ_NOT_SUPPORTED
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    26,  # DEPRECATED
})


# The queries a hung or broken GPU fails first, and a healthy GPU on any driver answers:
# a persistent error on one of these fails the GPU. A persistent error on another query
# alone (throttle counters, SRAM status, field values, thresholds, identity strings) is
# more likely a driver quirk than a fault: UNKNOWN, never a drain.
CORE_FACTS = frozenset({"ecc_mode", "remapped_rows", "temperature", "sm_clock", "clocks_event_reasons",
                        "pcie", "power", "power_limit"})


def _core(fact: str) -> bool:
    return fact in CORE_FACTS or fact.startswith("ecc.")


def _previous_errors(ctx: CheckContext, index: int) -> dict[str, str]:
    prev = ctx.facts.previous.gpu(index) if ctx.facts.previous is not None else None
    return prev.errors if prev is not None else {}


def _error_severity(gpu: GpuFacts, fact: str, before: dict[str, str]) -> Severity:
    code = gpu.error_codes.get(fact)
    if code == NVML_ERROR_RESET_REQUIRED:
        return Severity.FAIL
    if code in _NOT_HEALTH_CODES or not _core(fact):
        return Severity.UNKNOWN
    if gpu.retried or fact in before:
        return Severity.FAIL
    return Severity.UNKNOWN


@check("gpu.nvml_errors", severity=Severity.FAIL, reads=("gpu.errors", "gpu.error_codes"),
       summary="GPU queries answer without NVML errors: GPU_REQUIRES_RESET, or an error on a "
               "core query (ECC, remap, temperature, clocks, PCIe, power) that persists (in-run "
               "retry or across polls), fails; others are UNKNOWN; one that answered on the retry warns")
def gpu_nvml_errors(ctx: CheckContext) -> Iterator[Finding]:
    """Rule: RESET_REQUIRED on any query fails at once. Another error on a core query
    (``CORE_FACTS``) fails when the same query on the same GPU failed again (the source's
    retry after [nvml] retry_delay_s, or the agent's previous poll); an unconfirmed one is
    UNKNOWN. Errors on other queries alone, and codes that say the question was wrong (no
    permission, invalid argument, function not found, ...), are UNKNOWN at most: they are
    a driver quirk or slurmgpu's trouble, not evidence against the GPU."""
    for gpu in ctx.live_gpus():
        before = _previous_errors(ctx, gpu.index)
        by_severity: dict[Severity, list[str]] = {}
        for fact in sorted(set(gpu.errors) - {"handle"}):  # gpu.lost reports handle errors
            by_severity.setdefault(_error_severity(gpu, fact, before), []).append(fact)
        for severity, facts in sorted(by_severity.items(), key=lambda kv: -kv[0].rank):
            yield problem(severity, _errors_text(gpu, facts, severity), gpu=gpu.index,
                          facts=facts, errors={f: gpu.errors[f] for f in facts})
        if gpu.transient_errors:
            facts = sorted(gpu.transient_errors)
            yield problem(Severity.WARN, f"NVML errors on {', '.join(facts)} answered on the retry "
                          f"({gpu.transient_errors[facts[0]]})", gpu=gpu.index, facts=facts)


def _errors_text(gpu: GpuFacts, facts: list[str], severity: Severity) -> str:
    first = gpu.errors[facts[0]]
    if any(gpu.error_codes.get(f) == NVML_ERROR_RESET_REQUIRED for f in facts):
        return f"GPU requires a reset: NVML answers '{first}' to {', '.join(facts)}"
    why = "persistent" if severity is Severity.FAIL else "not confirmed"
    return f"NVML error '{first}' on {', '.join(facts)} ({why})"


# What slurmgpu does about each driver recovery action (policy: reset and drain are
# drains, reboot is a reboot where [automation] reboot_allowed).
RECOVERY_POLICY = {1: "reset", 2: "reboot", 3: "drain", 4: "drain"}


@check("gpu.recovery_action", severity=Severity.FAIL, reads=("gpu.recovery_action",),
       summary="the driver's own verdict (NVML field 230, R570+; 226/227, R560) is NONE; GPU_RESET, "
               "NODE_REBOOT, DRAIN_P2P or DRAIN_AND_RESET fail, naming the action")
def gpu_recovery_action(ctx: CheckContext) -> Iterator[Finding]:
    seen = False
    for gpu in ctx.live_gpus():
        value = gpu.recovery_action
        if value is None:
            continue
        seen = True
        if value != 0:
            name = RECOVERY_ACTION_NAMES.get(value, f"UNKNOWN({value})")
            action = RECOVERY_POLICY.get(value, "drain")
            yield problem(Severity.FAIL, f"driver recovery action {name}: {action} needed",
                          gpu=gpu.index, recovery_action=name, action=action)
    if not seen:
        yield not_applicable("the driver reports no recovery action (before R560)")
