"""`asyncrl validate`'s estimate of one GPU's memory when vLLM wakes (`memory_budget`), before any GPU is
asked for.

It needs the model's config.json, so it runs only where `spec.model.path` is a directory readable here (a
Hub name, or a path inside the trainer pod, is skipped with a note: the trainer's preflight estimates it
against the real GPU). The GPU's memory is the one `spec.trainer.podTemplate.nodeSelector` asks for with
`nvidia.com/gpu.memory` (MiB, as GPU feature discovery labels nodes), else DEFAULT_GPU_BYTES (an 80 GiB H100);
the note says which. A run that cannot fit is a problem; a fitting or tight one a note with the figures.
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.api import AsyncTrainingRun
from asyncrl.api.types import TrainerBackend
from asyncrl.manifest.verl_check import Findings
from asyncrl.trainer.backends.verl import memory_budget
from asyncrl.trainer.backends.verl.config import context_length_error, context_length_fix
from asyncrl.trainer.recovery import sharded_world_size

FIELD = "spec.trainer"


def memory_findings(run: AsyncTrainingRun) -> Findings:
    world_size = sharded_world_size(run.spec)
    if run.spec.trainer.backend is not TrainerBackend.VERL or world_size is None:
        return Findings()
    config_file = Path(run.spec.model.path).expanduser() / "config.json"
    try:
        model_config = json.loads(config_file.read_text())
    except OSError:
        return Findings(
            notes=[
                f"{FIELD}: GPU memory not estimated: {config_file} is not readable here (a Hub name or a "
                "path in the trainer pod); the trainer's preflight estimates it against its GPU"
            ]
        )
    except ValueError as error:
        return Findings(notes=[f"{FIELD}: GPU memory not estimated: {config_file}: {error}"])
    context_error = context_length_error(model_config, run)
    found = Findings(
        problems=[f"spec.data: {context_error}: {context_length_fix(model_config)}"] if context_error else []
    )
    try:
        shape = memory_budget.model_shape(model_config)
    except (ValueError, memory_budget.UnsupportedModel) as error:
        return Findings(
            problems=found.problems, notes=[f"{FIELD}: GPU memory not estimated: {config_file}: {error}"]
        )
    pod = run.spec.trainer.pod_template
    selected = memory_budget.gpu_bytes_from_node_selector(pod.node_selector if pod is not None else None)
    gpu_bytes = selected or memory_budget.DEFAULT_GPU_BYTES
    source = (
        f"nodeSelector {memory_budget.GPU_MEMORY_LABEL}"
        if selected
        else "assumed: an 80 GiB H100; a nodeSelector on nvidia.com/gpu.memory (MiB) sets it"
    )
    verdict, text = memory_budget.judgement(
        shape, memory_budget.memory_settings(run), gpu_bytes=gpu_bytes, world_size=world_size
    )
    line = f"{FIELD}: GPU memory ({gpu_bytes / memory_budget.GIB:.1f} GiB per GPU, {source}): {text}"
    if verdict is memory_budget.Verdict.REFUSE:
        return Findings(problems=[*found.problems, line])
    return Findings(problems=found.problems, notes=[line])
