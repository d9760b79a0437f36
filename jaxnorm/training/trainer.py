"""The training engine: mesh, jitted steps, evaluation, checkpoints, resume.

`train` runs one `TrainConfig` end to end:

1. validates the config (names, numbers, mesh) before anything is built;
2. locks ``out_dir`` (`checkpoints.RunLock`); ``resume=False`` moves an
   earlier run aside; a resume reads the config saved with the newest
   checkpoint and refuses one that differs (`config.drift`), unless the
   changed fields are named in ``allow_change``, all before compiling;
3. builds the mesh and the model under the logical axis rules, so every
   parameter is sharded as its logical names say;
4. restores the newest good checkpoint (state, data position, the partial
   log window) into the shardings the *current* mesh gives, so a run
   resumes on any mesh and any number of processes; a corrupt newest
   checkpoint falls back to the previous one, one that cannot be resumed
   for another reason stops the run (`checkpoints`);
5. runs jitted train steps, evaluating every ``eval_every`` steps and saving
   every ``checkpoint_every`` steps, at the end, and at a preemption;
6. writes metrics (JSON lines, optionally TensorBoard; process 0 writes
   the run's ``metrics.jsonl``, the others only with ``process_logs``), a
   loss plot, and returns the summary.

The train step differentiates the parameters and every `BackwardStat`
(state that a custom backward pass updates, e.g. PowerNorm's ``grad_ema``),
applies the optimizer to the parameters and the increments to that state,
and keeps the forward pass's other state (running statistics). A step with
a non-finite loss or gradient changes nothing but the step counter: the run
stops there (``nonfinite="stop"``: no checkpoint is written after it) or
goes on (``"skip"``, counted in ``skipped``). The step, the state
(`init_state`: optimizer moments sharded as their parameters) and the
optimizer are built by functions that compile-only planning (`plan`) calls
too, on an abstract model and a deviceless mesh.

Determinism: the data order comes from the seeded element stream of the
task, where each process reads its rows of every global batch
(`data.process_batches`) from the saved position (training examples
consumed, one number for every process count), dropout keys are
``fold_in(seed, step)``, and the per-step metrics of a partly filled log
window are saved with each checkpoint, so a resumed run logs the
uninterrupted run's numbers (timings aside).

Preemption: `CheckpointManager.reached_preemption` (JAX's multi-host sync
point: every process gets True at the same step) stops the run with a
checkpoint; in a single-process run a SIGTERM handler also triggers it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import nn as jaxnorm_nn
from jaxnorm import sharding
from jaxnorm.nn import decay as nn_decay
from jaxnorm.optim import complex as complex_opt
from jaxnorm.training import build, optimizers, relayout, tasks
from jaxnorm.training import checkpoints as checkpoints_lib
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib
from jaxnorm.training import faults as faults_lib
from jaxnorm.training import metrics as metrics_lib

# Record fields that report the window's last step instead of its mean.
_LAST_VALUE = ("lr", "skipped")


class _LocalStop:
  """Turns SIGTERM into a flag (single-process runs, main thread only).

  In a multi-process run JAX's distributed runtime owns SIGTERM and
  propagates the notice to every process (`reached_preemption`), so no
  handler is installed.
  """

  def __init__(self):
    self.requested = False
    self._previous = None
    self._enabled = (
      jax.process_count() == 1
      and threading.current_thread() is threading.main_thread()
    )

  def __enter__(self) -> _LocalStop:
    if self._enabled:

      def handler(signum, frame):
        del signum, frame
        self.requested = True

      self._previous = signal.signal(signal.SIGTERM, handler)
    return self

  def __exit__(self, *exc: Any) -> None:
    if self._enabled:
      signal.signal(signal.SIGTERM, self._previous)


def local_rows(layout: NamedSharding, batch_size: int) -> tuple[int, int]:
  """``(first, stop)``: the rows of a global batch this process's devices hold.

  Raises:
    ValueError: if they are not one contiguous range (a mesh whose batch
      axes interleave the processes' devices).
  """
  indices = layout.addressable_devices_indices_map((batch_size,)).values()
  held = {index[0].indices(batch_size)[:2] for index in indices}
  first, stop = min(a for a, _ in held), max(b for _, b in held)
  if sum(b - a for a, b in held) != stop - first:
    raise ValueError(
      f"train: this process's devices hold the batch rows {sorted(held)}, "
      f"not one contiguous range; order the devices so that each process's "
      f"are adjacent along the data and fsdp mesh axes"
    )
  return first, stop


def _place(batch: Any, layout: NamedSharding, batch_size: int) -> Any:
  """Makes global arrays of this process's rows of a batch.

  With one process this is a plain `jax.device_put` of the whole batch.
  """
  return jax.tree.map(
    lambda a: jax.make_array_from_process_local_data(
      layout, a, (batch_size, *a.shape[1:])
    ),
    batch,
  )


def _to_global(batch: Any, layout: NamedSharding, rows: tuple[int, int]) -> Any:
  """Places a whole host batch on the mesh, each process giving its rows."""
  size = jax.tree.leaves(batch)[0].shape[0]
  local = jax.tree.map(lambda a: a[rows[0] : rows[1]], batch)
  return _place(local, layout, size)


def _abstract(tree: Any) -> Any:
  return jax.tree.map(
    lambda x: (
      jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
      if isinstance(x, jax.Array)
      else x
    ),
    tree,
  )


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _check_drift(
  cfg: config_lib.TrainConfig, ckpts: checkpoints_lib.Checkpoints
) -> None:
  newest = ckpts.newest_info()
  if newest is None:
    return
  step, run = newest
  changes = config_lib.drift(run.get("config", {}), cfg)
  if changes:
    fields = ",".join(c.split()[0][2:] for c in changes)
    raise ValueError(
      f"train: {ckpts.manager.directory} holds a run (step {step}) saved "
      f"with another config: {'; '.join(changes)}; rerun with the saved "
      f"values, accept the change with --allow-change {fields}, or start "
      f"over with --no-resume (the old run is moved aside)"
    )


def _restore(
  cfg: config_lib.TrainConfig,
  ckpts: checkpoints_lib.Checkpoints,
  state: dict[str, Any],
  task: tasks.Task,
  layout: Any,
  built: bool,
) -> tuple[int, Any, dict, int] | None:
  """`Checkpoints.restore` into ``state``'s layout, converting the layers.

  A checkpoint saved with another ``scan_layers`` (of a model ``cfg``
  built, ``built``) is restored into the saved layout's target and moved
  to the current one (`relayout`), placed as ``layout`` says.
  """
  target = _abstract(state)
  newest = ckpts.newest_info()
  saved = None if newest is None else newest[1].get("config", {})
  scanned = bool((saved or {}).get("scan_layers", False))
  if saved is None or not built or scanned == cfg.scan_layers:
    return ckpts.restore(target)
  model_config = build.model_config(cfg, task.model_kwargs)
  step = newest[0]
  try:
    saved_target = relayout.convert(target, model_config, scanned=scanned)
  except ValueError as e:
    raise checkpoints_lib.CheckpointIncompatibleError(
      f"checkpoint {pathlib.Path(ckpts.manager.directory) / str(step)} cannot "
      f"be resumed "
      f"by this run: it was saved with scan_layers={scanned} and {e}; "
      f"nothing on disk was changed"
    ) from e
  restored = ckpts.restore(saved_target)
  if restored is None:
    return None
  step, restored_state, run, elements = restored
  moved = relayout.convert(
    restored_state, model_config, scanned=cfg.scan_layers
  )
  return step, jax.jit(lambda s: s, out_shardings=layout)(moved), run, elements


def _check_data(
  run: dict[str, Any],
  task: tasks.Task,
  where: pathlib.Path,
  cfg: config_lib.TrainConfig,
) -> None:
  """Refuses a resume whose training data no longer has the saved size.

  The data position counts examples of the element stream; over data with
  another number of examples per epoch it would pick other rows.
  """
  saved = run.get("train_size")
  if saved is not None and saved != task.train_size:
    raise checkpoints_lib.CheckpointIncompatibleError(
      f"checkpoint {where} cannot be resumed by this run: --data {cfg.data} "
      f"held {saved} training examples when it was saved and holds "
      f"{task.train_size} now, so its data position would pick other "
      f"examples; restore the data it was trained on; nothing on disk was "
      f"changed (start over with --no-resume, which moves the old run aside)"
    )


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Batch rows split over the ``data`` and ``fsdp`` mesh axes."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def lr_schedule(cfg: config_lib.TrainConfig) -> optax.Schedule:
  """The learning rate per optimizer update (``steps / grad_accum`` of them)."""
  return optimizers.make_schedule(
    cfg.schedule,
    cfg.learning_rate,
    cfg.warmup_steps,
    cfg.steps // cfg.grad_accum,
  )


def make_optimizer(
  cfg: config_lib.TrainConfig, model: nnx.Module, params: Any
) -> optax.GradientTransformation:
  """``cfg``'s optimizer with ``model``'s decay mask (model may be abstract).

  Complex parameters descend along ``conj(grad)``, which optax never does.
  """
  tx = optimizers.from_config(cfg, mask=nn_decay.decay_mask(model), model=model)
  if any(jnp.iscomplexobj(p) for p in jax.tree.leaves(params)):
    tx = optax.chain(complex_opt.conjugate_complex(), tx)
  return tx


def _opt_state_shardings(
  opt_state: Any, params: Any, replicated: NamedSharding
) -> Any:
  """Each optimizer-state leaf sharded as the parameter it tracks.

  A leaf whose path ends with a parameter's path and has its shape (Adam's
  moments, momentum buffers) takes that parameter's sharding, so FSDP
  shards the optimizer state as it shards the weights; any other leaf
  (counts, factored or projected statistics) is replicated.
  """
  by_path = dict(jax.tree_util.tree_leaves_with_path(params))

  def pick(path, leaf):
    for i in range(len(path)):
      param = by_path.get(path[i:])
      if param is not None and param.shape == leaf.shape:
        return param.sharding
    return replicated

  return jax.tree_util.tree_map_with_path(pick, opt_state)


def init_state(
  cfg: config_lib.TrainConfig,
  params: Any,
  backward: Any,
  rest: Any,
  tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
) -> dict[str, Any]:
  """The train state: counters, model state, optimizer state, EMA.

  Concrete for a run; abstract (`jax.ShapeDtypeStruct` leaves with
  shardings, nothing allocated) when ``params`` is, for compile-only
  planning. Either way the optimizer state is laid out as its parameters
  (`_opt_state_shardings`).

  Args:
    cfg: the run configuration (``ema_decay`` adds an ``ema`` copy).
    params: the model's `nnx.Param` state, placed on ``mesh``.
    backward: its `jaxnorm.nn.BackwardStat` state.
    rest: its other state (statistics, ...).
    tx: the optimizer.
    mesh: the mesh the state lives on.

  Returns:
    ``{"step", "skipped", "params", "backward", "rest", "opt_state"}`` and
    ``"ema"`` when ``cfg.ema_decay > 0``.
  """
  replicated = NamedSharding(mesh, P())
  opt_shapes = jax.eval_shape(tx.init, params)
  opt_shardings = _opt_state_shardings(opt_shapes, params, replicated)
  if any(isinstance(p, jax.ShapeDtypeStruct) for p in jax.tree.leaves(params)):
    counters = [jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)] * 2
    opt_state = jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      opt_shapes,
      opt_shardings,
    )
    ema = params
  else:
    counters = [
      jax.device_put(jnp.zeros((), jnp.int32), replicated) for _ in range(2)
    ]
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
    ema = jax.tree.map(
      lambda p: jax.device_put(p, p.sharding, may_alias=False), params
    )
  state = {
    "step": counters[0],
    "skipped": counters[1],
    "params": params,
    "backward": backward,
    "rest": rest,
    "opt_state": opt_state,
  }
  if cfg.ema_decay > 0:
    state["ema"] = ema
  return state


def make_train_step(
  cfg: config_lib.TrainConfig,
  graphdef: nnx.GraphDef,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  base_key: jax.Array,
  kind: str,
  layout: Any,
) -> Any:
  """The jitted train step of a run, as training and planning compile it.

  ``step(state, batch, loss_scale) -> (state, metrics)`` (see the module
  docstring): the state argument is donated and the new state keeps
  ``layout``, so every step, before or after a resume, runs the same
  executable. Trace it under the run's ``jax.set_mesh`` and
  ``nnx.logical_axis_rules``.

  Args:
    cfg: the run configuration (``grad_accum``, ``ema_decay``).
    graphdef: the model's graph definition (training mode).
    tx: the optimizer.
    schedule: the learning rate per update (logged).
    base_key: dropout keys are ``fold_in(base_key, step)``.
    kind: ``"lm"``, ``"classify"`` or ``"graph"`` (inputs and loss).
    layout: the shardings of the state (`init_state`'s tree).

  Returns:
    The `jax.jit`-wrapped step.
  """

  def train_step(state, batch, loss_scale):
    def loss_fn(params, backward):
      m = nnx.merge(graphdef, params, backward, state["rest"], copy=True)
      outputs = m(
        *tasks.inputs(kind, batch),
        rngs=jax.random.fold_in(base_key, state["step"]),
      )
      loss, metrics = tasks.loss_and_metrics(kind, outputs, batch)
      loss = loss * loss_scale
      metrics["loss"] = loss
      _, _, after, rest = nnx.split(m, nnx.Param, jaxnorm_nn.BackwardStat, ...)
      return loss, (metrics, after, rest)

    (grads, increments), (metrics, backward, rest) = jax.grad(
      loss_fn, argnums=(0, 1), has_aux=True
    )(state["params"], state["backward"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new = {
      "params": params,
      "backward": jax.tree.map(
        lambda v, d: v + d.astype(v.dtype), backward, increments
      ),
      "rest": rest,
      "opt_state": opt_state,
    }
    if "ema" in state:
      d = cfg.ema_decay
      new["ema"] = jax.tree.map(
        lambda e, p: (d * e + (1 - d) * p).astype(e.dtype), state["ema"], params
      )
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    new = jax.tree.map(
      lambda n, o: jnp.where(finite, n, o),
      new,
      {k: state[k] for k in new},
    )
    updates_done = (state["step"] - state["skipped"]) // cfg.grad_accum
    metrics.update(
      grad_norm=grad_norm,
      lr=schedule(updates_done),
      finite=finite,
      skipped=state["skipped"] + (~finite).astype(jnp.int32),
    )
    new["step"] = state["step"] + 1
    new["skipped"] = metrics["skipped"]
    return new, metrics

  return jax.jit(train_step, donate_argnums=0, out_shardings=(layout, None))


def _record(
  step: int, window: Sequence[dict[str, Any]], speed: float | None
) -> dict[str, Any]:
  """One log record: window means (finite values only) and last values."""
  record: dict[str, Any] = {"step": step}
  for key in window[-1]:
    if key in _LAST_VALUE:
      record[key] = window[-1][key]
      continue
    values = [m[key] for m in window if m[key] is not None]
    record[key] = float(np.mean(values)) if values else None
  record["tokens_per_sec"] = speed
  return record


def train(
  cfg: config_lib.TrainConfig, *, model: nnx.Module | None = None
) -> dict[str, Any]:
  """Trains one configuration; returns the run summary (see module doc).

  Args:
    cfg: the run configuration.
    model: train this module instead of building one from ``cfg`` (e.g. a
      pretrained or converted model, or one whose norms follow a training
      schedule such as `jaxnorm.nn.fakeln.FakeLayerNorm`); the model fields
      of ``cfg`` (width, depth, norm, ...) are then unused. On return it
      holds the trained parameters and state, in eval mode.

  Returns:
    The summary of `metrics.summarize`; ``stop_reason`` is ``preempted``
    (resume by running again) or ``nonfinite`` (the last checkpoint is from
    before the bad step) for an early stop.

  Raises:
    ValueError: for an invalid config, or a resume whose config differs
      from the saved one in fields not named in ``allow_change``.
    checkpoints.RunDirBusyError: if another runner holds ``out_dir``.
  """
  config_lib.validate(cfg, build.registries_for(cfg))
  cfg = config_lib.resolve(cfg)
  faults = faults_lib.from_env()
  out_dir = pathlib.Path(cfg.out_dir).absolute()
  primary = jax.process_index() == 0
  with checkpoints_lib.RunLock(out_dir, enabled=primary):
    if not cfg.resume and primary:
      checkpoints_lib.move_aside(out_dir)
    _sync("jaxnorm-move-aside")
    ckpts = checkpoints_lib.Checkpoints(
      out_dir / "checkpoints",
      keep=cfg.keep_checkpoints,
      corrupt_dir=out_dir / "corrupt",
      primary=primary,
    )
    try:
      if cfg.resume:
        _check_drift(cfg, ckpts)
      # optax mixes integer counts with floats; the run does not depend on
      # the caller's promotion mode.
      with jax.numpy_dtype_promotion("standard"):
        return _run(cfg, model, out_dir, primary, faults, ckpts)
    finally:
      ckpts.close()


def _run(
  cfg: config_lib.TrainConfig,
  model: nnx.Module | None,
  out_dir: pathlib.Path,
  primary: bool,
  faults: Sequence[faults_lib.Fault],
  ckpts: checkpoints_lib.Checkpoints,
) -> dict[str, Any]:
  task = tasks.make_task(cfg)
  mesh = sharding.make_mesh(cfg.mesh)
  rules = sharding.DEFAULT_RULES
  batch_layout = batch_sharding(mesh)
  rows = local_rows(batch_layout, cfg.batch_size)
  schedule = lr_schedule(cfg)

  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    given = model
    if model is None:
      model = build.build_model(cfg, task.model_kwargs, rngs=nnx.Rngs(cfg.seed))
    if primary and cfg.progress:
      print("\n".join(build.summary_lines(model)), file=sys.stderr)
    graphdef, params, backward, rest = nnx.split(
      model, nnx.Param, jaxnorm_nn.BackwardStat, ...
    )
    if given is not None:
      # Built outside the mesh: placed as the rules say, as a built model
      # is, so the first step's inputs have the steps' layout (one compile).
      params, backward, rest = (
        jax.device_put(t, nnx.get_named_sharding(t, mesh))
        for t in (params, backward, rest)
      )
    model.eval()
    eval_graphdef = nnx.graphdef(model)
    tx = make_optimizer(cfg, model, params)
    state = init_state(cfg, params, backward, rest, tx, mesh)
  num_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))

  def eval_step(state, batch):
    weights = state.get("ema", state["params"])
    m = nnx.merge(
      eval_graphdef, weights, state["backward"], state["rest"], copy=True
    )
    outputs = m(*tasks.inputs(task.kind, batch))
    return tasks.loss_and_metrics(task.kind, outputs, batch)[1]

  # The state keeps the layout it starts with (and a restore gives it).
  layout = jax.tree.map(lambda x: x.sharding, state)
  train_step = make_train_step(
    cfg,
    graphdef,
    tx,
    schedule,
    jax.random.key(cfg.seed),
    task.kind,
    layout,
  )
  eval_step = jax.jit(eval_step)

  start, window, elements = 0, [], 0
  if cfg.resume:
    restored = _restore(cfg, ckpts, state, task, layout, given is None)
    if restored is not None:
      start, state, run, elements = restored
      window = list(run.get("window", []))
      _check_data(run, task, out_dir / "checkpoints" / str(start), cfg)
  iterator = iter(
    data_lib.process_batches(
      task.train_elements,
      batch_size=cfg.batch_size,
      start=elements,
      rows=rows,
      workers=cfg.data_workers,
    )
  )
  if primary:
    log_path = out_dir / "metrics.jsonl"
  elif cfg.process_logs:
    log_path = out_dir / f"metrics.process{jax.process_index()}.jsonl"
  else:
    log_path = None
  log = metrics_lib.MetricsLog(
    log_path,
    truncate_after=start,
    sinks=(
      [metrics_lib.TensorBoardSink(out_dir / "tensorboard")]
      if cfg.tensorboard and primary
      else []
    ),
  )

  def save(step: int) -> None:
    ckpts.save(
      step,
      state,
      elements,
      {
        "config": config_lib.to_json(cfg),
        "window": window,
        "train_size": task.train_size,
      },
    )

  def evaluate(step: int) -> None:
    totals: dict[str, float] = {}
    for batch in task.eval_batches:
      out = eval_step(state, _to_global(batch, batch_layout, rows))
      for k, v in jax.device_get(out).items():
        totals[k] = totals.get(k, 0.0) + float(v)
    n = len(task.eval_batches)
    log.write({"step": step, **{f"val_{k}": v / n for k, v in totals.items()}})

  bar = metrics_lib.Progress(
    cfg.steps, initial=start, enabled=cfg.progress and primary
  )
  tokens, seconds = 0, 0.0
  stop_reason, last = None, start
  profiling = False
  with contextlib.ExitStack() as stack:
    stack.callback(iterator.close)  # Stops grain's workers and threads.
    local = stack.enter_context(_LocalStop())
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nnx.logical_axis_rules(rules))
    for step in range(start + 1, cfg.steps + 1):
      if cfg.profile_steps and step == cfg.profile_steps[0]:
        jax.profiler.start_trace(str(out_dir / "profile"))
        profiling = True
      began = time.perf_counter()
      batch = _place(next(iterator), batch_layout, cfg.batch_size)
      elements += cfg.batch_size
      state, metrics = train_step(
        state, batch, jnp.float32(faults_lib.loss_scale(faults, step))
      )
      metrics = {k: v.item() for k, v in jax.device_get(metrics).items()}
      if step > start + 1:  # The first step of a process compiles.
        tokens += task.tokens_per_batch
        seconds += time.perf_counter() - began
      if profiling and step == cfg.profile_steps[1]:
        jax.profiler.stop_trace()
        profiling = False
      finite = metrics.pop("finite")
      metrics = metrics_lib.finite_or_null(metrics)
      if not finite and cfg.nonfinite == "stop":
        log.write({"step": step, **metrics, "nonfinite": True})
        stop_reason = "nonfinite"
        break
      window.append(metrics)
      last = step
      if step % cfg.log_every == 0 or step == cfg.steps:
        record = _record(step, window, tokens / seconds if seconds else None)
        log.write(record)
        bar.update(
          step, loss=record["loss"], tokens_per_sec=record["tokens_per_sec"]
        )
        window, tokens, seconds = [], 0, 0.0
      if step % cfg.eval_every == 0 or step == cfg.steps:
        evaluate(step)
      if step % cfg.checkpoint_every == 0 or step == cfg.steps:
        save(step)
      faults_lib.after_step(faults, step)
      if ckpts.reached_preemption(step) or local.requested:
        save(step)
        stop_reason = "preempted"
        break
    if profiling:
      jax.profiler.stop_trace()
  bar.close()
  log.close()
  if given is not None:
    nnx.update(given, state["params"], state["backward"], state["rest"])
  summary = metrics_lib.summarize(
    log.records(),
    config=dataclasses.asdict(cfg),
    num_params=num_params,
    baseline=task.baseline,
    kind=task.kind,
    steps=last,
    stop_reason=stop_reason,
  )
  if primary:
    metrics_lib.plot_run(
      out_dir / "metrics.jsonl",
      out_dir / "loss.png",
      title=f"{cfg.model} on {cfg.data}",
      baseline=task.baseline,
      baseline_label=tasks.BASELINE_LABELS[task.kind],
    )
    metrics_lib.write_summary(out_dir / "summary.json", summary)
  return summary
