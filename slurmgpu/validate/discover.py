"""The node's GPUs as the tests see them: NVML index and model name (the fake library
under the simulator), scoped to ``--gpus``. No NVML: no GPU, and the GPU tests say not
applicable."""

from __future__ import annotations

from slurmgpu.config.schema import Settings
from slurmgpu.sources.nvml import PynvmlSource
from slurmgpu.validate.context import Gpu


def gpus_of(settings: Settings, scope: frozenset[int] | None) -> list[Gpu]:
    facts = PynvmlSource(settings.nvml.library, retry_delay_s=settings.nvml.retry_delay_s).collect(scope)
    return [Gpu(g.index, g.name) for g in sorted(facts.gpus, key=lambda g: g.index)
            if not g.lost and (scope is None or g.index in scope)]
