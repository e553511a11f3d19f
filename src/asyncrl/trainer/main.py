"""`asyncrl trainer`: read the run (the operator's `run.yaml`), build the backend, run the step loop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import stamina.instrumentation
import yaml

from asyncrl.api import AsyncTrainingRun, InvalidRunError, load_run
from asyncrl.api.types.spec import TrainerBackend
from asyncrl.api.types.verl_overrides import LEARNING_RATE_KEY, flatten_overrides
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import TrainerOutcome, TrainerReport
from asyncrl.gateway_api.tokens import KEY_ENV_VAR
from asyncrl.trainer.backends import TrainerBackend as Backend
from asyncrl.trainer.data import DataError, PromptSource, load_rows_file
from asyncrl.trainer.failures import EXIT_CODES, ClusterNotReady, RunFailed
from asyncrl.trainer.loop import LoopSettings, StepLoop
from asyncrl.trainer.metrics import (
    JsonLinesSink,
    MetricsSinks,
    PrometheusSink,
    TrackingMode,
    VerlTrackingSink,
    metrics_places,
)
from asyncrl.trainer.pause_holding import PauseHoldingClient
from asyncrl.trainer.preflight_cluster import DEFAULT_WAIT_SECONDS

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="the AsyncTrainingRun manifest (run.yaml)")
    parser.add_argument("--gateway-url", help="the gateway (the pod's sidecar); required unless --preflight")
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="only check what the run needs here (packages, CUDA and GPUs, CPUs for Ray, /dev/shm, the "
        "model, the checkpoint folder; with nodes > 1 the driver's own and, through Ray, every node's), one "
        "line per check; exit 1 when one fails (the trainer runs them first anyway)",
    )
    parser.add_argument(
        "--ray-cluster-wait-seconds",
        type=float,
        default=DEFAULT_WAIT_SECONDS,
        help="with nodes > 1: how long the preflight waits for the Ray head and every node to join "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--inference-port",
        type=int,
        default=0,
        help="port of the reference backend's model server (default 0: a free one); the trainer registers "
        "it with the gateway either way",
    )
    parser.add_argument(
        "--inference-url",
        default=None,
        help="the address the gateway reaches the reference backend's model server at, registered instead "
        "of the one it listens on (e.g. a proxy in front of --inference-port)",
    )
    parser.add_argument(
        "--reference-model-seed",
        type=int,
        default=0,
        help="Reference backend only: seed of the tiny model's initial weights (default %(default)s); runs "
        "compared across seeds (benchmarks/time_to_reward.py) vary it",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="checkpoints here; resume from them"
    )
    parser.add_argument("--data-file", type=Path, default=None, help="rows file (for data.configMapRef)")
    parser.add_argument(
        "--metrics-file",
        type=Path,
        default=None,
        help="one JSON object per step (default: metrics/metrics.jsonl under --checkpoint-dir, so the curves "
        "stay with the checkpoints; none without a checkpoint directory)",
    )
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)")
    parser.add_argument(
        "--wandb-dir",
        type=Path,
        default=None,
        help="where W&B writes its run (default: metrics/ under --checkpoint-dir, else ./wandb-runs)",
    )
    parser.add_argument(
        "--tensorboard-dir",
        type=Path,
        default=None,
        help="where TensorBoard's event files go (default: tensorboard/ under --wandb-dir)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def load_manifest(path: Path) -> AsyncTrainingRun:
    try:
        manifest = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SystemExit(f"asyncrl trainer: cannot read --config {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise SystemExit(f"asyncrl trainer: --config {path} is not valid YAML: {error}") from error
    try:
        return load_run(manifest)
    except InvalidRunError as error:
        raise SystemExit(f"asyncrl trainer: {path}: {error}") from error


def rows_of(run: AsyncTrainingRun, data_file: Path | None) -> list[Any]:
    data = run.spec.data
    if data.inline is not None:
        return list(data.inline)
    if data.path is None and data_file is None:
        raise SystemExit("asyncrl trainer: data.configMapRef needs --data-file (the operator mounts it)")
    path, field = (
        (Path(data.path), "spec.data.path")
        if data.path is not None
        else (data_file, "spec.data.configMapRef")
    )
    assert path is not None
    try:
        return load_rows_file(path)
    except DataError as error:  # the run's data is wrong: a configuration error, not cured by a restart
        raise SystemExit(f"asyncrl trainer: {field}: {error}") from error


def build_backend(
    run: AsyncTrainingRun,
    *,
    inference_port: int,
    checkpoint_dir: Path | None,
    prompt_count: int,
    inference_url: str | None = None,
    reference_model_seed: int = 0,
) -> Backend:
    if run.spec.trainer.backend is TrainerBackend.VERL:
        return build_verl_backend(run, checkpoint_dir=checkpoint_dir, prompt_count=prompt_count)
    return build_reference_backend(
        run, inference_port=inference_port, inference_url=inference_url, model_seed=reference_model_seed
    )


def build_verl_backend(run: AsyncTrainingRun, *, checkpoint_dir: Path | None, prompt_count: int) -> Backend:
    """verl's config for this run, checked before any GPU work starts: a bad setting fails in seconds."""
    try:
        from asyncrl.trainer.backends.verl.backend import VerlBackend
        from asyncrl.trainer.backends.verl.config import (
            VerlConfigError,
            compose_verl_config,
            schedule_horizon,
            verl_settings,
        )
    except ImportError as error:
        raise SystemExit(
            f"asyncrl trainer: trainer.backend verl needs verl and its GPU stack ({error}); use the trainer "
            "image (trainer_image/), or pip install 'asyncrl[trainer,gpu]'"
        ) from error
    try:
        settings = verl_settings(run, checkpoint_dir=checkpoint_dir, prompt_count=prompt_count)
        config = compose_verl_config(settings)
    except VerlConfigError as error:
        raise SystemExit(f"asyncrl trainer: {error}") from error
    horizon = config.actor_rollout_ref.actor.optim.total_training_steps
    source = (
        schedule_horizon(run, prompt_count=prompt_count)[1]
        if horizon == settings.schedule_steps
        else "spec.trainer.verlOverrides"
    )
    logger.info("learning-rate schedule horizon: %s updates (%s)", horizon, source)
    return VerlBackend(config)


def build_reference_backend(
    run: AsyncTrainingRun, *, inference_port: int, inference_url: str | None = None, model_seed: int = 0
) -> Backend:
    from asyncrl.trainer.backends.reference import ReferenceBackend
    from asyncrl.trainer.backends.reference.config import (
        ModelConfig,
        ReferenceBackendConfig,
        ServerConfig,
        UpdateConfig,
    )

    spec = run.spec
    correction = spec.rollout_correction
    overrides = flatten_overrides(spec.trainer.verl_overrides or {})
    # verl's key means the same here, so one manifest tunes both backends alike.
    learning_rate = float(overrides.get(LEARNING_RATE_KEY, UpdateConfig().learning_rate))
    config = ReferenceBackendConfig(
        model=ModelConfig(seed=model_seed),
        update=UpdateConfig(
            rollout_is=correction.rollout_is,
            rollout_is_threshold=correction.threshold,
            learning_rate=learning_rate,
        ),
        server=ServerConfig(port=inference_port, served_model_name=spec.model.name, url=inference_url),
    )
    return ReferenceBackend(config)


def build_sinks(run: AsyncTrainingRun, args: argparse.Namespace) -> MetricsSinks:
    """The one tracking layer: JSON lines (--metrics-file), Prometheus (--metrics-port), W&B, TensorBoard."""
    where = metrics_places(
        checkpoint_dir=args.checkpoint_dir, metrics_file=args.metrics_file, wandb_dir=args.wandb_dir
    )
    logger.info(
        "per-step metrics: %s; W&B and TensorBoard files under %s",
        where.metrics_file or "no JSON lines file (no --metrics-file or --checkpoint-dir)",
        where.wandb_dir,
    )
    sinks: list[JsonLinesSink | PrometheusSink | VerlTrackingSink] = []
    if where.metrics_file is not None:
        sinks.append(JsonLinesSink(where.metrics_file))
    if args.metrics_port:
        from asyncrl.trainer.metrics_server import serve_metrics

        prometheus = PrometheusSink()
        try:
            # /metrics, and /history.jsonl (the per-step file) for `asyncrl runs plot`
            serve_metrics(args.metrics_port, prometheus.registry, where.metrics_file)
            sinks.append(prometheus)
        except OSError as error:  # a taken port costs the scrape endpoint, not the run
            logger.warning("Prometheus metrics are off: port %d: %s", args.metrics_port, error)
    wandb = run.spec.logging.wandb
    modes: dict[str, TrackingMode] = {"online": "online", "offline": "offline", "disabled": "disabled"}
    given = os.environ.get("WANDB_MODE", wandb.mode.wandb_mode)
    if given not in modes:
        raise SystemExit(f"asyncrl trainer: WANDB_MODE={given!r}; use online, offline or disabled")
    mode = modes[given]
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
        logger.warning("W&B mode is online but WANDB_API_KEY is not set; logging offline instead")
        mode = "offline"
    try:
        sinks.append(
            VerlTrackingSink(
                project=wandb.project or run.name or "asyncrl",
                name=run.name or "asyncrl-run",
                wandb_mode=mode,
                wandb_directory=where.wandb_dir,
                tensorboard_directory=args.tensorboard_dir or where.wandb_dir / "tensorboard",
                config=run.spec.to_wire(),
            )
        )
    except Exception as error:  # a metrics backend must never stop training
        logger.warning("W&B/TensorBoard tracking is off: %s: %s", type(error).__name__, error)
    return MetricsSinks(sinks)


def preflight(run: AsyncTrainingRun, args: argparse.Namespace) -> list[Any]:
    """This container's checks; with nodes > 1 (this is the Ray driver) the Ray cluster's after them."""
    from asyncrl.trainer.preflight import run_checks, storage_units_from

    storage_units = storage_units_from(run)
    checks = run_checks(run, checkpoint_dir=args.checkpoint_dir, storage_units=storage_units)
    trainer = run.spec.trainer
    if trainer.nodes > 1:
        from asyncrl.trainer import preflight_ray
        from asyncrl.trainer.backends.verl.cluster import ray_connection
        from asyncrl.trainer.preflight_cluster import ClusterAccess, ClusterNeeds, check_ray_cluster

        needs = ClusterNeeds(
            nodes=trainer.nodes,
            gpus_per_node=trainer.node_gpus,
            storage_units=storage_units,
            model_path=run.spec.model.path,
            checkpoint_dir=args.checkpoint_dir,
        )
        address = ray_connection(nnodes=trainer.nodes, env=os.environ).address
        assert address is not None  # nodes > 1 always joins a cluster
        access = ClusterAccess(join=preflight_ray.join, wait_seconds=args.ray_cluster_wait_seconds)
        checks += check_ray_cluster(needs, address=address, access=access)
    return checks


def stop_on_failures(checks: list[Any]) -> None:
    """A failed check stops the trainer: as a configuration error (the run fails), or, when every failure
    is transient (the Ray cluster not all there yet), as ClusterNotReady (restarted, it waits again)."""
    from asyncrl.trainer.preflight import failures, report

    problems = failures(checks)
    if any(not check.transient for check in problems):
        raise SystemExit(f"asyncrl trainer: preflight failed:\n{report(problems)}")
    if problems:
        raise ClusterNotReady(f"preflight failed:\n{report(problems)}")


def run_preflight(args: argparse.Namespace) -> int:
    from asyncrl.trainer.preflight import failures, report

    checks = preflight(load_manifest(args.config), args)
    print(report(checks))
    return 1 if failures(checks) else 0


async def train(args: argparse.Namespace) -> int:
    run = load_manifest(args.config)
    spec = run.spec
    if not args.gateway_url:
        raise SystemExit("asyncrl trainer: --gateway-url is required (unless --preflight)")
    key = os.environ.get(KEY_ENV_VAR, "").strip()
    if not key:
        raise SystemExit(f"asyncrl trainer: set {KEY_ENV_VAR} to the gateway key")
    settings = LoopSettings.of_run(spec, checkpoint_dir=args.checkpoint_dir)
    rows = rows_of(run, args.data_file)
    prompts = PromptSource(rows, shuffle=spec.data.shuffle, seed=spec.data.seed)
    backend = build_backend(
        run,
        inference_port=args.inference_port,
        inference_url=args.inference_url,
        checkpoint_dir=args.checkpoint_dir,
        prompt_count=len(rows),
        reference_model_seed=args.reference_model_seed,
    )
    # After the config check (a bad verl key is named first), before any model or GPU work.
    from asyncrl.trainer.preflight import report

    checks = preflight(run, args)
    logger.info("preflight:\n%s", report(checks))
    stop_on_failures(checks)
    sinks = build_sinks(run, args)
    await backend.start()
    logger.info("model servers %s; gateway %s", ", ".join(backend.serve_urls), args.gateway_url)
    try:
        async with PauseHoldingClient(args.gateway_url, key, report=sinks.report_holding_pause) as gateway:
            loop = StepLoop(settings=settings, gateway=gateway, backend=backend, prompts=prompts, sinks=sinks)
            result = await loop.run()
        logger.info("finished: %s", result.describe())
    finally:
        sinks.close()
        await backend.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Our retry sites log their own line with the reason; stamina's default hooks would add a WARNING without
    # context per retry and a Prometheus counter labelled by attempt number (unbounded for endless retries).
    stamina.instrumentation.set_on_retry_hooks(())
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.preflight:
        try:
            return run_preflight(args)
        except SystemExit as error:
            print(error.code, file=sys.stderr)
            return 2
    try:
        return asyncio.run(train(args))
    except SystemExit as error:
        if not isinstance(error.code, str):
            raise
        # Every SystemExit with a message above states a configuration problem for the user.
        print(error.code, file=sys.stderr)
        return _exit_with(args, TrainerOutcome.CONFIG_ERROR, error.code)
    except RunFailed as error:
        logger.error("the run failed: %s", error)
        return _exit_with(args, TrainerOutcome.RUN_FAILED, str(error))
    except ClusterNotReady as error:
        logger.error("the Ray cluster is not ready: %s", error)
        return _exit_with(args, TrainerOutcome.FAILED, str(error))
    except Exception as error:
        logger.exception("the trainer failed")
        return _exit_with(args, TrainerOutcome.FAILED, f"{type(error).__name__}: {error}")


def _exit_with(args: argparse.Namespace, outcome: TrainerOutcome, message: str) -> int:
    """Leave the report with the gateway (best effort: it may be what failed), then the exit code."""
    one_line = " ".join(message.split())[:4000]
    key = os.environ.get(KEY_ENV_VAR, "").strip()
    if key:
        report = TrainerReport(outcome=outcome, message=one_line)
        try:
            asyncio.run(_report(args.gateway_url, key, report))
        except (httpx.HTTPError, GatewayError) as error:
            logger.warning("could not report the failure to the gateway: %s", error)
    return EXIT_CODES[outcome]


async def _report(gateway_url: str, key: str, report: TrainerReport) -> None:
    async with GatewayClient(gateway_url, key, timeout_seconds=5.0) as gateway:
        await gateway.report_trainer(report)
