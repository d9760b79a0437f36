"""What a run trains on: its data, the model's inputs, loss and metrics.

`make_task` reads the data kind of the run's model (`ModelSpec.data`):
token windows of a text corpus or of ``--data PATH``
(`jaxnorm.training.corpora`; next-token loss), image batches
(classification), or generated node-classification graphs (the
class-balanced loss of the Graph Transformer paper). The `Task` carries
the training element stream (`data.process_batches` cuts each process's
rows of every global batch from it), the evaluation batches, what the data
decides about the model (`build.model_config`'s ``data``), and the loss of
a trivial predictor to compare against.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import grain
import jax
import jax.numpy as jnp
import optax

from jaxnorm import graph as graph_lib
from jaxnorm.nn import model_registry
from jaxnorm.training import config as config_lib
from jaxnorm.training import corpora, graph_data
from jaxnorm.training import data as data_lib

# The trivial predictor each task's loss is compared with.
BASELINE_LABELS = {
  "lm": "unigram entropy",
  "classify": "uniform guess",
  "graph": "uniform guess",
}


@dataclasses.dataclass
class Task:
  """Data and loss of one run: LM, image or graph-node classification.

  Attributes:
    kind: ``lm``, ``classify`` or ``graph``.
    train_elements: the training examples, forever (reshuffled each epoch):
      global batch ``b`` is elements ``b * batch_size`` on.
    train_size: training examples per epoch (a resume checks it is
      unchanged, so the saved position means the same examples).
    eval_batches: the evaluation batches (global).
    model_kwargs: what the data decides about the model.
    tokens_per_batch: tokens (or examples) of one global batch.
    baseline: the loss of the trivial predictor.
  """

  kind: str
  train_elements: grain.MapDataset
  train_size: int
  eval_batches: list[Any]
  model_kwargs: dict[str, Any]
  tokens_per_batch: int
  baseline: float | None


def _graph_task(cfg: config_lib.TrainConfig) -> Task:
  """PATTERN or CLUSTER, generated once and cached in ``out_dir/data``.

  Training examples are shuffled padded graphs (the elements of
  `graph_data.graph_batches`); evaluation takes the first ``eval_batches``
  batches of the validation split in order. ``pe_dim=0`` takes the
  official config's size.
  """
  sizes = cfg.graph_sizes or graph_data.SPLIT_SIZES[cfg.data]
  options = {}
  if cfg.graph_blocks:
    options.update(size_min=cfg.graph_blocks[0], size_max=cfg.graph_blocks[1])
  if cfg.data == "pattern":
    options["patterns"] = min(100, math.gcd(*sizes))
  pe_dim = cfg.pe_dim or graph_data.PE_DIM[cfg.data]
  train_src, val_src, _ = graph_data.load_sources(
    cfg.data,
    sizes,
    seed=cfg.seed,
    pe_dim=pe_dim,
    cache_dir=pathlib.Path(cfg.out_dir) / "data",
    **options,
  )
  if len(train_src) < cfg.batch_size:
    raise ValueError(
      f"train: the {cfg.data} training split has {len(train_src)} graphs, "
      f"fewer than --batch-size {cfg.batch_size}"
    )
  evals = graph_data.eval_batches(val_src, batch_size=cfg.batch_size)
  num_classes = graph_data.NUM_CLASSES[cfg.data]
  return Task(
    kind="graph",
    train_elements=grain.MapDataset.source(train_src)
    .shuffle(seed=cfg.seed)
    .repeat(None),
    train_size=len(train_src),
    eval_batches=evals[: cfg.eval_batches],
    model_kwargs={
      "num_classes": num_classes,
      "vocab_size": graph_data.VOCAB_SIZE[cfg.data],
      "pe_dim": pe_dim,
    },
    tokens_per_batch=cfg.batch_size,
    baseline=math.log(num_classes),
  )


def _text_task(cfg: config_lib.TrainConfig) -> Task:
  """A bundled corpus, or ``--data PATH`` (`corpora.load`), as windows."""
  if cfg.data in data_lib.TEXT_CORPORA:
    text = data_lib.load_text(cfg.data)
    corpus = corpora.TokenCorpus(
      train=data_lib.TokenWindows(
        data_lib.ArrayReader([text.train]), cfg.seq_len
      ),
      val=data_lib.TokenWindows(data_lib.ArrayReader([text.val]), cfg.seq_len),
      vocab_size=text.vocab_size,
      baseline=text.unigram_entropy(),
      path=cfg.data,
    )
    evals = data_lib.eval_windows(
      text.val,
      cfg.seq_len,
      batch_size=cfg.batch_size,
      max_batches=cfg.eval_batches,
    )
  else:
    corpus = corpora.load(
      cfg.data,
      seq_len=cfg.seq_len,
      batch_size=cfg.batch_size,
      vocab_size=cfg.vocab_size,
      dtype_name=cfg.token_dtype,
    )
    evals = data_lib.window_batches(
      corpus.val, batch_size=cfg.batch_size, max_batches=cfg.eval_batches
    )
  return Task(
    kind="lm",
    train_elements=data_lib.window_elements(corpus.train, seed=cfg.seed),
    train_size=len(corpus.train),
    eval_batches=evals,
    model_kwargs={"vocab_size": corpus.vocab_size, "max_len": cfg.seq_len},
    tokens_per_batch=cfg.batch_size * cfg.seq_len,
    baseline=corpus.baseline,
  )


def make_task(cfg: config_lib.TrainConfig) -> Task:
  """The task of ``cfg``'s model and data (loaded, or generated once)."""
  data = model_registry.spec(cfg.model).data
  if data == "graphs":
    return _graph_task(cfg)
  if data == "text":
    return _text_task(cfg)
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
  return Task(
    kind="classify",
    train_elements=data_lib.image_elements(
      images.train_x, images.train_y, seed=cfg.seed
    ),
    train_size=len(images.train_x),
    eval_batches=evals,
    model_kwargs={
      "num_classes": images.num_classes,
      "image_shape": images.train_x.shape[1:],
    },
    tokens_per_batch=cfg.batch_size,
    baseline=math.log(images.num_classes),
  )


def loss_and_metrics(
  kind: str, outputs: jax.Array, batch: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean cross-entropy and accuracy of a batch.

  Graphs: the class-balanced cross-entropy over the real nodes and the
  weighted (class-averaged) accuracy as a fraction, per batch (averaged
  over evaluation batches, as the official code).
  """
  logits = outputs.astype(jnp.float32)
  if kind == "graph":
    labels, mask = batch["labels"], batch["node_mask"]
    loss = graph_lib.class_balanced_cross_entropy(
      logits, labels, node_mask=mask
    )
    accuracy = graph_lib.weighted_class_accuracy(logits, labels, node_mask=mask)
    return loss, {"loss": loss, "accuracy": accuracy / 100.0}
  labels = batch[:, 1:] if kind == "lm" else batch["label"]
  loss = jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  )
  accuracy = jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))
  return loss, {"loss": loss, "accuracy": accuracy}


def inputs(kind: str, batch: Any) -> tuple[jax.Array | None, ...]:
  """The model's positional arguments for ``batch``."""
  if kind == "graph":
    keys = ("features", "adjacency", "node_mask", "pe")
    return tuple(batch[k] for k in keys)
  return (batch[:, :-1] if kind == "lm" else batch["image"],)
