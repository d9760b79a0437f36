"""Models composed from named parts: decoder LM, ViT, ResNet-style CNN, SNN.

Every model is built from a small frozen config whose string fields name its
parts, so a variant is one flag away:

* ``norm``: a name of `jaxnorm.nn.NORMS` (via `make_norm`, which applies the
  spec's width-dependent defaults);
* ``attention``: a name of `jaxnorm.nn.attention.ATTENTIONS` (the core of
  `MultiHeadAttention`, with the spec's defaults for the head sizes and
  token count);
* ``residual``: a name of `jaxnorm.nn.residual.RESIDUALS` (via
  `make_residual`, which wraps the list of sublayers, attention and MLP
  alternating, into the network);
* ``activation``: any name of `ACTIVATIONS`.

This file reads the parts' specs, never their names: which parts a model
accepts follows from their capabilities (the model's ``layout`` and
``causal``, read by `jaxnorm.nn.model_registry.registries` and by the check
each model runs first, `jaxnorm.nn._common.check_parts`): the decoder LM needs
causal attention and norms that are causal in the tokens layout
(batch-statistics norms only with ``allow_batch_stats=True``), the ViT the
tokens layout, the CNN the images layout. A refusal is a ``ValueError``
raised before anything is built, naming the reason and the valid names.
Parts that later land in those registries plug in without touching this
file. Parameters carry logical axis names (``vocab``, ``embed``, ``mlp``,
``channels``) resolved by `jaxnorm.sharding`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import activations, sharding
from jaxnorm.nn import _common, _param, layers
from jaxnorm.nn import activations as nn_activations
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import quant as nn_quant
from jaxnorm.nn import residual as nn_residual

ACTIVATIONS = nn_activations.ACTIVATIONS


# ---------------------------------------------------------------------------
# Configs and models.


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """A decoder-only (GPT-style) language model.

  Attributes:
    vocab_size: vocabulary (256 for bytes).
    width: residual stream width ``d``.
    depth: number of (attention, MLP) layers.
    num_heads: attention heads.
    head_dim: per-head width; default ``width // num_heads``.
    mlp_ratio: MLP hidden size over ``width`` (when ``mlp_hidden`` is None).
    mlp_hidden: MLP hidden size; overrides ``mlp_ratio``.
    max_len: longest sequence (learned positions).
    norm: norm name; its spec must support the ``tokens`` layout and be
      causal there. ``norm_kwargs`` are passed to every norm (over the
      spec's defaults). `jaxnorm.nn.residual.NORM_FREE` (``"none"``)
      builds the stack without any norm and without a final norm (with
      ``prenorm``: ``x + f(x)``, the LayerNorm-free export of
      `jaxnorm.nn.convert.remove_fake_ln`); the residual registry says which
      schemes run without a norm.
    attention: attention name; its spec must have a causal form.
    residual: residual scheme.
    activation: MLP activation.
    positional: ``learned``, ``rope`` or ``none``.
    tie_embeddings: the head is the transposed embedding.
    use_bias: biases in attention, MLP and (untied) head projections.
    norm_kwargs: ``(name, value)`` pairs for `make_norm`, e.g.
      ``(("use_scale", False),)``.
    zero_mean_writers: center the embedding and every sublayer output over
      the stream axis, the training re-parameterization of Pre-RMSNorm
      (equivalent to using ``W - mean_out(W)`` for every writer).
    attention_kwargs: ``(name, value)`` options of the attention core, over
      its spec's defaults.
    allow_batch_stats: accept a norm whose training mode takes statistics
      over the batch and sequence (its spec's ``batch_stats``): in training
      mode position ``t`` then sees later tokens through the statistics.
      Refused unless set; a run that sets it should record it.
    quant: ``"none"``, or the int8 path of every MLP and untied-head
      projection (`jaxnorm.nn.quant.QUANT_MODES`: ``"mixed"`` LLM.int8(),
      ``"vector"``, ``"tensor"``); parameters are unchanged.
  """

  vocab_size: int = 256
  width: int = 128
  depth: int = 4
  num_heads: int = 4
  head_dim: int | None = None
  mlp_ratio: int = 4
  mlp_hidden: int | None = None
  max_len: int = 128
  norm: str = "rmsnorm"
  attention: str = "softmax"
  residual: str = "prenorm"
  activation: str = "gelu"
  positional: str = "learned"
  tie_embeddings: bool = True
  use_bias: bool = False
  norm_kwargs: tuple[tuple[str, Any], ...] = ()
  zero_mean_writers: bool = False
  attention_kwargs: tuple[tuple[str, Any], ...] = ()
  allow_batch_stats: bool = False
  quant: str = "none"


def _center(x: jax.Array) -> jax.Array:
  return x - jnp.mean(x, axis=-1, keepdims=True)


class ZeroMeanOutput(nnx.Module):
  """Wraps a sublayer so its output has zero mean over the last axis."""

  def __init__(self, sublayer: nnx.Module):
    self.sublayer = sublayer

  def __call__(self, x: jax.Array) -> jax.Array:
    """``f(x) - mean(f(x))`` over the stream axis."""
    return _center(self.sublayer(x))


class DecoderLM(nnx.Module):
  """Byte/token embedding, causal blocks, final norm, (tied) head.

  ``positional="learned"`` adds a learned table, ``"rope"`` rotates queries
  and keys inside attention, ``"none"`` relies on causality alone.
  """

  layout: ClassVar[str] = "tokens"
  causal: ClassVar[bool] = True

  def __init__(
    self, config: LMConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    _common.check_parts(
      "DecoderLM",
      layout=self.layout,
      causal=self.causal,
      norm=c.norm,
      attention=c.attention,
      allow_batch_stats=c.allow_batch_stats,
    )
    self.dtype = dtype
    d = c.width
    # Unit-norm rows: the tied head then starts with logits of std ~1.
    embed_init = nnx.initializers.normal(1.0 / math.sqrt(d))
    self.embed = _param.param(
      embed_init(rngs.params(), (c.vocab_size, d), jnp.float32),
      ("vocab", "embed"),
    )
    self.pos = (
      _param.param(
        nnx.initializers.normal(0.02)(
          rngs.params(), (c.max_len, d), jnp.float32
        ),
        (None, "embed"),
      )
      if c.positional == "learned"
      else None
    )
    head_dim = c.head_dim or d // c.num_heads
    spec = nn_attention.ATTENTIONS[c.attention]
    attention_kwargs = {
      **spec.defaults(c.num_heads, head_dim, None),
      **dict(c.attention_kwargs),
    }
    blocks = []
    for _ in range(c.depth):
      blocks.append(
        nn_attention.MultiHeadAttention(
          d,
          c.num_heads,
          head_dim=c.head_dim,
          attention=c.attention,
          attention_kwargs=attention_kwargs,
          is_causal=True,
          use_rope=c.positional == "rope",
          use_bias=c.use_bias,
          dtype=dtype,
          rngs=rngs,
        )
      )
      blocks.append(
        layers.MLP(
          d,
          c.mlp_hidden or c.mlp_ratio * d,
          activation=c.activation,
          use_bias=c.use_bias,
          dtype=dtype,
          rngs=rngs,
        )
      )
    if c.zero_mean_writers:
      blocks = [ZeroMeanOutput(b) for b in blocks]
    norm_free = c.norm == nn_residual.NORM_FREE
    # make_norm reads the layout: e.g. per-token groups on sequences.
    norm_kwargs = {} if norm_free else {"layout": "tokens"}
    norm_kwargs.update(c.norm_kwargs)
    self.net = _common.residual(
      c.residual,
      blocks,
      width=d,
      per_layer=2,
      norm=c.norm,
      norm_kwargs=norm_kwargs,
      rngs=rngs,
    )
    self.final_norm = (
      None
      if norm_free
      else nn_norms.make_norm(c.norm, d, rngs=rngs, **norm_kwargs)
    )
    self.head = (
      None
      if c.tie_embeddings
      else layers.Dense(
        d,
        c.vocab_size,
        names=("embed", "vocab"),
        use_bias=c.use_bias,
        dtype=dtype,
        rngs=rngs,
      )
    )
    if c.quant != "none":
      nn_quant.swap_dense(self, quant_mode=c.quant)

  def __call__(
    self,
    tokens: jax.Array,
    *,
    rngs: jax.Array | None = None,
    return_hidden: bool = False,
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Logits ``(batch, seq, vocab)`` (in ``dtype``) for int tokens.

    With ``return_hidden``, also the residual stream at every depth,
    ``(depth + 1, batch, seq, width)``: the embedding, then each layer's
    output (after its MLP sublayer, before the final norm), the ``hs`` of
    `jaxnorm.depth_metrics`. Multi-stream schemes give their read-out
    stream; Attention Residuals the aggregated state after each layer.
    """
    del rngs  # No dropout in the LM.
    if tokens.ndim != 2 or tokens.shape[1] > self.config.max_len:
      raise ValueError(
        f"DecoderLM: tokens must have shape (batch, seq) with seq <= "
        f"max_len={self.config.max_len}, got tokens.shape={tokens.shape}"
      )
    x = jnp.take(self.embed[...], tokens, axis=0)
    if self.pos is not None:
      x = x + self.pos[...][None, : tokens.shape[1]]
    if self.config.zero_mean_writers:
      x = _center(x)
    x = sharding.constrain(x.astype(self.dtype), ("batch", "seq", "embed"))
    if return_hidden:
      h, per_sublayer = self.net(x, return_hidden=True)
      hidden = jnp.concatenate([x[None], per_sublayer[1::2]])
    else:
      h = self.net(x)
    if self.final_norm is not None:
      h = self.final_norm(h)
    if self.head is None:
      logits = jnp.matmul(h, self.embed[...].astype(self.dtype).T)
    else:
      logits = self.head(h)
    return (logits, hidden) if return_hidden else logits


@dataclasses.dataclass(frozen=True)
class ViTConfig:
  """A Vision Transformer classifier on NHWC images.

  ``norm`` must support the ``tokens`` layout and ``attention`` act on it;
  ``norm_kwargs`` / ``attention_kwargs`` are ``(name, value)`` pairs over
  the specs' defaults (the attention spec sees the token count, CLS + patches).
  An attention whose spec ``needs_grid`` (SOFT, NaLaFormer) is built as the
  paper's layer on the patch map: the ViT passes it ``grid_shape=(H / p, W
  / p)`` and ``num_prefix=1`` (the [CLS]).
  """

  num_classes: int = 10
  image_shape: tuple[int, int, int] = (28, 28, 1)
  patch_size: int = 4
  width: int = 64
  depth: int = 4
  num_heads: int = 4
  mlp_ratio: int = 4
  norm: str = "layernorm"
  attention: str = "softmax"
  residual: str = "prenorm"
  activation: str = "gelu"
  norm_kwargs: tuple[tuple[str, Any], ...] = ()
  attention_kwargs: tuple[tuple[str, Any], ...] = ()


class ViT(nnx.Module):
  """Patch embedding, [CLS] token, learned positions, blocks, CLS head."""

  layout: ClassVar[str] = "tokens"

  def __init__(
    self, config: ViTConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    _common.check_parts(
      "ViT",
      layout=self.layout,
      causal=False,
      norm=c.norm,
      attention=c.attention,
    )
    h, w, ch = c.image_shape
    if h % c.patch_size or w % c.patch_size:
      raise ValueError(
        f"ViT: patch_size={c.patch_size} must divide the image size {h}x{w}"
      )
    self.dtype = dtype
    d = c.width
    num_patches = (h // c.patch_size) * (w // c.patch_size)
    self.patch = layers.Dense(
      c.patch_size * c.patch_size * ch,
      d,
      names=(None, "embed"),
      dtype=dtype,
      rngs=rngs,
    )
    self.cls = _param.param(jnp.zeros((d,), jnp.float32), ("embed",))
    self.pos = _param.param(
      nnx.initializers.normal(0.02)(
        rngs.params(), (num_patches + 1, d), jnp.float32
      ),
      (None, "embed"),
    )
    norm_kwargs = {"layout": "tokens", **dict(c.norm_kwargs)}
    spec = nn_attention.ATTENTIONS[c.attention]
    attention_kwargs = {
      **spec.defaults(c.num_heads, d // c.num_heads, num_patches + 1),
      **dict(c.attention_kwargs),
    }
    if spec.needs_grid:  # The patch map, row-major after the [CLS].
      grid = (h // c.patch_size, w // c.patch_size)
      attention_kwargs.update(grid_shape=grid, num_prefix=1)
    blocks = []
    for _ in range(c.depth):
      blocks.append(
        nn_attention.MultiHeadAttention(
          d,
          c.num_heads,
          attention=c.attention,
          attention_kwargs=attention_kwargs,
          dtype=dtype,
          rngs=rngs,
        )
      )
      blocks.append(
        layers.MLP(
          d, c.mlp_ratio * d, activation=c.activation, dtype=dtype, rngs=rngs
        )
      )
    self.net = _common.residual(
      c.residual,
      blocks,
      width=d,
      per_layer=2,
      norm=c.norm,
      norm_kwargs=norm_kwargs,
      rngs=rngs,
    )
    self.final_norm = nn_norms.make_norm(c.norm, d, rngs=rngs, **norm_kwargs)
    self.head = layers.Dense(
      d, c.num_classes, names=("embed", None), dtype=dtype, rngs=rngs
    )

  def __call__(
    self, images: jax.Array, *, rngs: jax.Array | None = None
  ) -> jax.Array:
    """Class logits ``(batch, num_classes)`` for NHWC images."""
    del rngs
    n, h, w, ch = images.shape
    p = self.config.patch_size
    patches = (
      images.reshape(n, h // p, p, w // p, p, ch)
      .transpose(0, 1, 3, 2, 4, 5)
      .reshape(n, (h // p) * (w // p), p * p * ch)
    )
    x = self.patch(patches)
    cls = jnp.broadcast_to(self.cls[...].astype(x.dtype), (n, 1, x.shape[-1]))
    x = jnp.concatenate([cls, x], axis=1) + self.pos[...][None].astype(x.dtype)
    h = self.final_norm(self.net(x))
    return self.head(h[:, 0])


@dataclasses.dataclass(frozen=True)
class CNNConfig:
  """A ResNet-style CNN: strided stem, residual conv blocks, pooled head.

  ``norm`` must support the ``images`` layout; ``norm_kwargs`` are
  ``(name, value)`` pairs over its spec's defaults.

  ``block_attention`` is ``"none"`` or an ``images`` attention of
  `jaxnorm.nn.attention.ATTENTIONS` (``IMAGE_ATTENTIONS``: ``"ela"``,
  ``"psa"``), built at ``width`` channels with its defaults by
  `make_image_attention`, one per `ConvBlock`, at the end of the block's
  residual branch (after the second conv, before the residual add). ELA
  (Xu & Wan, arXiv:2403.01123; no official code) is presented as a drop-in
  for Coordinate Attention in ResNet, and Coordinate Attention, as SE,
  gates the residual branch's output before the addition. Deviation: PSA's
  official ResNet-style block (DeLightCMU/PSA, ``network/hrnetv2.py``,
  ``BasicBlock``) puts PSA mid-branch, ``conv-bn-relu -> PSA -> conv-bn``,
  then the add; the papers differ and we follow ELA for every attention.
  The field is not named ``attention``: the runner copies its
  ``--attention`` (a token attention, default ``softmax``) into every model
  config field of that name.
  """

  num_classes: int = 10
  image_shape: tuple[int, int, int] = (28, 28, 1)
  width: int = 32
  depth: int = 4
  norm: str = "batchnorm"
  residual: str = "prenorm"
  activation: str = "relu"
  norm_kwargs: tuple[tuple[str, Any], ...] = ()
  block_attention: str = "none"


class ConvBlock(nnx.Module):
  """The residual branch ``attn(conv3x3(act(conv3x3(x))))`` at constant width.

  ``attn`` is the ``images`` attention ``attention`` (`make_image_attention`)
  at the end of the branch, before the residual add (placement: `CNNConfig`),
  or the identity for ``"none"``; it is built after the convs, so they keep
  their initialization whichever attention is chosen.
  """

  def __init__(
    self,
    width: int,
    *,
    activation: str,
    dtype: Any,
    rngs: nnx.Rngs,
    attention: str = "none",
  ):
    spec = nn_activations.ACTIVATIONS[activation]
    if not spec.elementwise:
      self.act = layers.MLP(
        width, width, activation=activation, dtype=dtype, rngs=rngs
      )
    else:
      self.act = spec.fn
    self.conv1 = layers.Conv(width, width, dtype=dtype, rngs=rngs)
    self.conv2 = layers.Conv(width, width, dtype=dtype, rngs=rngs)
    self.attn = (
      None
      if attention == "none"
      else nn_attention.make_image_attention(
        attention, width, dtype=dtype, rngs=rngs
      )
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the branch to NHWC ``x``."""
    y = self.conv2(self.act(self.conv1(x)))
    return y if self.attn is None else self.attn(y)


class CNN(nnx.Module):
  """ResNet-style classifier; norms normalize the channel (last) axis."""

  layout: ClassVar[str] = "images"

  def __init__(
    self, config: CNNConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    _common.check_parts(
      "CNN",
      layout=self.layout,
      causal=False,
      norm=c.norm,
      attention=None if c.block_attention == "none" else c.block_attention,
    )
    ch = c.image_shape[-1]
    stride = 2 if min(c.image_shape[:2]) >= 16 else 1
    self.stem = layers.Conv(ch, c.width, stride=stride, dtype=dtype, rngs=rngs)
    norm_kwargs = {"layout": "images", **dict(c.norm_kwargs)}
    blocks = [
      ConvBlock(
        c.width,
        activation=c.activation,
        dtype=dtype,
        rngs=rngs,
        attention=c.block_attention,
      )
      for _ in range(c.depth)
    ]
    self.net = _common.residual(
      c.residual,
      blocks,
      width=c.width,
      per_layer=1,
      norm=c.norm,
      norm_kwargs=norm_kwargs,
      rngs=rngs,
    )
    self.final_norm = nn_norms.make_norm(
      c.norm, c.width, rngs=rngs, **norm_kwargs
    )
    self.head = layers.Dense(
      c.width, c.num_classes, names=("channels", None), dtype=dtype, rngs=rngs
    )
    spec = nn_activations.ACTIVATIONS[c.activation]
    # Pre-activation ResNet head: norm -> activation -> global pooling. The
    # activation matters: per-channel spatial statistics (instance-like
    # norms) make the pooled normalized map exactly zero without it.
    self.final_act = spec.fn if spec.elementwise else jax.nn.relu

  def __call__(
    self, images: jax.Array, *, rngs: jax.Array | None = None
  ) -> jax.Array:
    """Class logits for NHWC images."""
    del rngs
    h = self.final_act(self.final_norm(self.net(self.stem(images))))
    return self.head(jnp.mean(h, axis=(1, 2)))


@dataclasses.dataclass(frozen=True)
class SNNConfig:
  """A self-normalizing MLP: SELU, LeCun-normal init, alpha dropout."""

  num_classes: int = 10
  image_shape: tuple[int, int, int] = (28, 28, 1)
  width: int = 256
  depth: int = 4
  activation: str = "selu"
  dropout: float = 0.05


class SNN(nnx.Module):
  """Self-normalizing MLP classifier (no norm layers).

  SELU with LeCun-normal weights keeps activations near mean 0 and variance
  1 (Klambauer et al., *Self-Normalizing Neural Networks*,
  arXiv:1706.02515, 2017).
  """

  def __init__(
    self, config: SNNConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    spec = nn_activations.ACTIVATIONS[c.activation]
    if not spec.elementwise:
      valid = sorted(n for n, s in ACTIVATIONS.items() if s.elementwise)
      raise ValueError(
        f"SNN: activation must be elementwise, got {c.activation!r}; "
        f"choose one of {', '.join(valid)}"
      )
    self.act = spec.fn
    init = activations.lecun_normal("normal")
    sizes = [math.prod(c.image_shape)] + [c.width] * c.depth
    self.layers = nnx.List(
      [
        layers.Dense(
          a, b, names=(None, "mlp"), kernel_init=init, dtype=dtype, rngs=rngs
        )
        for a, b in zip(sizes[:-1], sizes[1:])
      ]
    )
    self.dropout = nn_activations.AlphaDropout(c.dropout)
    self.head = layers.Dense(
      c.width,
      c.num_classes,
      names=("mlp", None),
      kernel_init=init,
      dtype=dtype,
      rngs=rngs,
    )

  def __call__(
    self, images: jax.Array, *, rngs: jax.Array | None = None
  ) -> jax.Array:
    """Class logits; alpha dropout is active when ``rngs`` is a key."""
    x = images.reshape(images.shape[0], -1)
    for i, layer in enumerate(self.layers):
      x = self.act(layer(x))
      if rngs is not None and self.config.dropout > 0:
        x = self.dropout(
          x, deterministic=False, key=jax.random.fold_in(rngs, i)
        )
    return self.head(x)
