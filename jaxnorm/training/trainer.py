"""The training engine: mesh, jitted steps, evaluation, checkpoints, resume.

`train` runs one `TrainConfig` end to end:

1. validates the config against the registries (no compilation yet);
2. builds the mesh and the model under the logical axis rules, so every
   parameter is sharded as its logical names say;
3. restores the latest checkpoint of ``out_dir`` (model, optimizer and the
   grain iterator) if one exists and ``resume`` is set;
4. runs jitted train steps on batches sharded over ``data``/``fsdp``,
   evaluating every ``eval_every`` steps and saving every
   ``checkpoint_every`` steps (and on SIGTERM, before exiting);
5. writes metrics (JSON lines), a loss plot and returns the summary.

Determinism: the data order comes from the seeded grain iterator (restored
exactly), dropout keys are ``fold_in(seed, step)``, so a resumed run
reproduces the uninterrupted run's losses step for step.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import signal
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import sharding
from jaxnorm.nn import models
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib
from jaxnorm.training import metrics as metrics_lib
from jaxnorm.training import optimizers


def registries(model: str = "lm") -> dict[str, tuple[str, ...]]:
  """Valid names for each named model part and the optimizer."""
  return {
    **models.registries(model),
    "optimizer": tuple(sorted(optimizers.OPTIMIZERS)),
  }


_BASELINE_LABELS = {"lm": "unigram entropy", "classify": "uniform guess"}


@dataclasses.dataclass
class _Task:
  """Data and loss of one run: LM next-byte prediction or classification."""

  kind: str
  train_ds: grain.MapDataset
  eval_batches: list[Any]
  model_kwargs: dict[str, Any]
  tokens_per_batch: int
  baseline: float | None


def _make_task(cfg: config_lib.TrainConfig) -> _Task:
  if cfg.model == "lm":
    text = data_lib.load_text(cfg.data)
    return _Task(
      kind="lm",
      train_ds=data_lib.text_windows(
        text.train, cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed
      ),
      eval_batches=data_lib.eval_windows(
        text.val,
        cfg.seq_len,
        batch_size=cfg.batch_size,
        max_batches=cfg.eval_batches,
      ),
      model_kwargs={"vocab_size": text.vocab_size, "max_len": cfg.seq_len},
      tokens_per_batch=cfg.batch_size * cfg.seq_len,
      baseline=text.unigram_entropy(),
    )
  images = data_lib.load_images(cfg.data)
  n = min(len(images.val_x), cfg.eval_batches * cfg.batch_size)
  n -= n % cfg.batch_size
  if n < cfg.batch_size:
    raise ValueError(
      f"train: the {cfg.data} validation split has fewer than "
      f"--batch-size {cfg.batch_size} images"
    )
  evals = [
    {
      "image": images.val_x[i : i + cfg.batch_size],
      "label": images.val_y[i : i + cfg.batch_size],
    }
    for i in range(0, n, cfg.batch_size)
  ]
  return _Task(
    kind="classify",
    train_ds=data_lib.image_batches(
      images.train_x, images.train_y, batch_size=cfg.batch_size, seed=cfg.seed
    ),
    eval_batches=evals,
    model_kwargs={
      "num_classes": images.num_classes,
      "image_shape": images.train_x.shape[1:],
    },
    tokens_per_batch=cfg.batch_size,
    baseline=math.log(images.num_classes),
  )


def _loss_and_metrics(
  kind: str, outputs: jax.Array, batch: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
  logits = outputs.astype(jnp.float32)
  if kind == "lm":
    labels = batch[:, 1:]
  else:
    labels = batch["label"]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  accuracy = jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))
  return jnp.mean(loss), {"loss": jnp.mean(loss), "accuracy": accuracy}


def _inputs(kind: str, batch: Any) -> jax.Array:
  return batch[:, :-1] if kind == "lm" else batch["image"]


class _Stop:
  """Turns SIGTERM into a flag the loop checks after each step."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    def handler(signum, frame):
      del signum, frame
      self.requested = True

    self._previous = signal.signal(signal.SIGTERM, handler)
    return self

  def __exit__(self, *exc):
    signal.signal(signal.SIGTERM, self._previous)


def _to_global(batch: Any, sharding: NamedSharding) -> Any:
  """Places a host batch on the mesh, each process contributing its rows.

  Every process iterates the same seeded pipeline (so iterator states, and
  checkpoints, agree) and keeps the contiguous slice of rows that its devices
  hold; with one process this is a plain `jax.device_put`.
  """
  count, index = jax.process_count(), jax.process_index()

  def place(a):
    rows = a.shape[0] // count
    local = a[index * rows : (index + 1) * rows]
    return jax.make_array_from_process_local_data(sharding, local, a.shape)

  return jax.tree.map(place, batch)


def _abstract(tree: Any) -> Any:
  return jax.tree.map(
    lambda x: (
      jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
      if isinstance(x, jax.Array)
      else x
    ),
    tree,
  )


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
  """
  config_lib.validate(cfg, registries(cfg.model))
  out_dir = pathlib.Path(cfg.out_dir).absolute()
  out_dir.mkdir(parents=True, exist_ok=True)
  task = _make_task(cfg)
  mesh = sharding.make_mesh(cfg.mesh)
  rules = sharding.DEFAULT_RULES
  batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
  dtype = jnp.dtype(cfg.dtype)

  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    given = model
    if model is None:
      model = models.build_model(
        cfg, rngs=nnx.Rngs(cfg.seed), dtype=dtype, **task.model_kwargs
      )
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    model.eval()
    eval_graphdef = nnx.graphdef(model)
    tx = optimizers.build_optimizer(
      cfg.optimizer,
      learning_rate=cfg.learning_rate,
      weight_decay=cfg.weight_decay,
      warmup_steps=cfg.warmup_steps,
      total_steps=cfg.steps,
    )
    opt_state = jax.jit(tx.init)(params)
  num_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  state = {
    "step": jnp.zeros((), jnp.int32),
    "params": params,
    "rest": rest,
    "opt_state": opt_state,
  }
  base_key = jax.random.key(cfg.seed)

  def train_step(state, batch):
    def loss_fn(params):
      m = nnx.merge(graphdef, params, state["rest"], copy=True)
      outputs = m(
        _inputs(task.kind, batch),
        rngs=jax.random.fold_in(base_key, state["step"]),
      )
      loss, metrics = _loss_and_metrics(task.kind, outputs, batch)
      return loss, (metrics, nnx.state(m, nnx.Not(nnx.Param)))

    grads, (metrics, rest) = jax.grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return {
      "step": state["step"] + 1,
      "params": params,
      "rest": rest,
      "opt_state": opt_state,
    }, metrics

  def eval_step(state, batch):
    m = nnx.merge(eval_graphdef, state["params"], state["rest"], copy=True)
    return _loss_and_metrics(task.kind, m(_inputs(task.kind, batch)), batch)[1]

  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    train_step = jax.jit(train_step, donate_argnums=0)
    eval_step = jax.jit(eval_step)

  iterator = iter(task.train_ds.to_iter_dataset())
  manager = ocp.CheckpointManager(
    out_dir / "checkpoints",
    options=ocp.CheckpointManagerOptions(
      max_to_keep=cfg.keep_checkpoints, create=True
    ),
  )
  start = 0
  if cfg.resume and manager.latest_step() is not None:
    restored = manager.restore(
      manager.latest_step(),
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(state)),
        data=grain.checkpoint.CheckpointRestore(iterator),
      ),
    )
    state = restored["state"]
    start = int(state["step"])
  primary = jax.process_index() == 0
  # Every process computes the same metrics; process 0 owns the run files.
  log = metrics_lib.MetricsLog(
    out_dir
    / (
      "metrics.jsonl"
      if primary
      else f"metrics.process{jax.process_index()}.jsonl"
    ),
    truncate_after=start,
  )

  def save(step: int) -> None:
    if manager.latest_step() != step:
      manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=grain.checkpoint.CheckpointSave(iterator),
        ),
      )

  def evaluate(step: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for batch in task.eval_batches:
      out = eval_step(state, _to_global(batch, batch_sharding))
      for k, v in out.items():
        totals[k] = totals.get(k, 0.0) + float(v)
    record = {f"val_{k}": v / len(task.eval_batches) for k, v in totals.items()}
    log.write({"step": step, **record})
    return record

  bar = metrics_lib.Progress(
    cfg.steps, initial=start, enabled=cfg.progress and primary
  )
  window: list[dict[str, jax.Array]] = []
  tokens_since, time_since = 0, time.perf_counter()
  stopped_early = False
  with _Stop() as stop, jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    for step in range(start + 1, cfg.steps + 1):
      batch = _to_global(next(iterator), batch_sharding)
      state, metrics = train_step(state, batch)
      window.append(metrics)
      tokens_since += task.tokens_per_batch
      if step % cfg.log_every == 0 or step == cfg.steps:
        means = {
          k: float(np.mean([float(m[k]) for m in window])) for k in window[0]
        }
        elapsed = time.perf_counter() - time_since
        record = {
          "step": step,
          **means,
          "tokens_per_sec": tokens_since / elapsed,
        }
        log.write(record)
        bar.update(
          step, loss=means["loss"], tokens_per_sec=record["tokens_per_sec"]
        )
        window, tokens_since, time_since = [], 0, time.perf_counter()
      if step % cfg.eval_every == 0 or step == cfg.steps:
        evaluate(step)
      if step % cfg.checkpoint_every == 0 or step == cfg.steps:
        save(step)
      if stop.requested:
        save(step)
        stopped_early = True
        break
  bar.close()
  manager.wait_until_finished()
  manager.close()
  if given is not None:
    nnx.update(given, state["params"], state["rest"])
  summary = metrics_lib.summarize(
    log.path,
    config=dataclasses.asdict(cfg),
    num_params=num_params,
    baseline=task.baseline,
    kind=task.kind,
    stopped_early=stopped_early,
  )
  if primary:
    metrics_lib.plot_run(
      log.path,
      out_dir / "loss.png",
      title=f"{cfg.model} on {cfg.data}",
      baseline=task.baseline,
      baseline_label=_BASELINE_LABELS[task.kind],
    )
    metrics_lib.write_summary(out_dir / "summary.json", summary)
  return summary
