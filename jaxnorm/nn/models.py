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

Every config has ``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`: ``"none"``,
``"full"``, ``"dots"``, ``"dots_no_batch"``), the `jax.checkpoint` policy
each layer runs under. The LM and the ViT have ``scan_layers``: their layers
are stacked on a leading ``layers`` axis and run by ``nnx.scan``
(`jaxnorm.nn._common.ScannedStack`), so compile time is flat in depth;
`stack_layers` and `unstack_layers` convert a state between the two
layouts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
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
_PER_LAYER = 2  # Transformer layers: attention, then MLP.


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
    embed_scale: multiply the token embedding by a learnable scalar
      initialized to ``sqrt(width)`` (the ``shared_scale`` of DyT's LLaMA
      code, ``jiachenzhu/DyT``, ``other_tasks/LLaMA/fms_fsdp/models/
      llama.py``): the stream's entries start at unit scale, where
      ``tanh`` is not linear. The tied head reads the unscaled table.
    quant: ``"none"``, or the int8 path of every MLP and untied-head
      projection (`jaxnorm.nn.quant.QUANT_MODES`: ``"mixed"`` LLM.int8(),
      ``"vector"``, ``"tensor"``); parameters are unchanged.
    scan_layers: stack the layers on a leading ``layers`` axis and run them
      with ``nnx.scan`` (`jaxnorm.nn._common.ScannedStack`): the same
      network (`stack_layers` converts the parameters), compiled once per
      layer instead of once per depth. A residual scheme whose spec has a
      ``scan_refusal`` (AttnRes, KEEL) is refused.
    remat: the `jax.checkpoint` policy of every layer
      (`jaxnorm.nn.layers.REMAT_CHOICES`): ``"none"``, ``"full"`` (save
      nothing), ``"dots"``, ``"dots_no_batch"``. Scanned, the scan body
      runs under it; unrolled, every sublayer. The parameters are the same
      for every ``remat``.
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
  embed_scale: bool = False
  quant: str = "none"
  scan_layers: bool = False
  remat: str = "none"


def _check_stack(who: str, c: LMConfig | ViTConfig) -> None:
  """Refuses a bad ``remat`` and a residual scheme that cannot be scanned."""
  layers.check_remat(who, c.remat)
  if c.scan_layers:
    _common.check_scannable(who, c.residual)


def _stack(
  c: LMConfig | ViTConfig,
  make_blocks: Callable[[nnx.Rngs], list[nnx.Module]],
  norm_kwargs: dict[str, Any],
  finish: Callable[[_common.ScanLayer], Any] | None,
  rngs: nnx.Rngs,
) -> nnx.Module:
  """The residual network of ``depth`` layers of ``make_blocks(rngs)``.

  Scanned (`_common.ScannedStack`, ``finish`` applied to each layer) or
  unrolled (`_common.residual` over the blocks of every layer, in order).
  """
  kwargs = dict(
    width=c.width,
    per_layer=_PER_LAYER,
    norm=c.norm,
    norm_kwargs=norm_kwargs,
    rngs=rngs,
    remat=c.remat,
  )
  if c.scan_layers:
    return _common.ScannedStack(
      c.residual, make_blocks, depth=c.depth, finish=finish, **kwargs
    )
  blocks = [b for _ in range(c.depth) for b in make_blocks(rngs)]
  return _common.residual(c.residual, blocks, **kwargs)


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
    _check_stack("DecoderLM", c)
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
    self.embed_scale = (
      _param.param(jnp.asarray(math.sqrt(d), jnp.float32), ())
      if c.embed_scale
      else None
    )
    head_dim = c.head_dim or d // c.num_heads
    spec = nn_attention.ATTENTIONS[c.attention]
    attention_kwargs = {
      **spec.defaults(c.num_heads, head_dim, None),
      **dict(c.attention_kwargs),
    }

    def make_blocks(rngs: nnx.Rngs) -> list[nnx.Module]:
      blocks = [
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
        ),
        layers.MLP(
          d,
          c.mlp_hidden or c.mlp_ratio * d,
          activation=c.activation,
          use_bias=c.use_bias,
          dtype=dtype,
          rngs=rngs,
        ),
      ]
      if c.zero_mean_writers:
        blocks = [ZeroMeanOutput(b) for b in blocks]
      return blocks

    norm_free = c.norm == nn_residual.NORM_FREE
    # make_norm reads the layout: e.g. per-token groups on sequences.
    norm_kwargs = {} if norm_free else {"layout": "tokens"}
    norm_kwargs.update(c.norm_kwargs)
    finish = (
      None
      if c.quant == "none"
      else lambda layer: nn_quant.swap_dense(layer, quant_mode=c.quant)
    )
    self.net = _stack(c, make_blocks, norm_kwargs, finish, rngs)
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
    stream; Attention Residuals the aggregated state after each layer. A
    scanned stack outputs them from the scan, one per layer.
    """
    del rngs  # No dropout in the LM.
    if tokens.ndim != 2 or tokens.shape[1] > self.config.max_len:
      raise ValueError(
        f"DecoderLM: tokens must have shape (batch, seq) with seq <= "
        f"max_len={self.config.max_len}, got tokens.shape={tokens.shape}"
      )
    x = jnp.take(self.embed[...], tokens, axis=0)
    if self.embed_scale is not None:
      x = x * self.embed_scale[...]
    if self.pos is not None:
      x = x + self.pos[...][None, : tokens.shape[1]]
    if self.config.zero_mean_writers:
      x = _center(x)
    x = sharding.constrain(x.astype(self.dtype), ("batch", "seq", "embed"))
    if return_hidden:
      h, states = self.net(x, return_hidden=True)
      per_layer = states if self.config.scan_layers else states[1::2]
      hidden = jnp.concatenate([x[None], per_layer])
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
  / p)`` and ``num_prefix=1`` (the [CLS]). ``scan_layers`` and ``remat``
  are the LM's (`LMConfig`).
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
  scan_layers: bool = False
  remat: str = "none"


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
    _check_stack("ViT", c)
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

    def make_blocks(rngs: nnx.Rngs) -> list[nnx.Module]:
      return [
        nn_attention.MultiHeadAttention(
          d,
          c.num_heads,
          attention=c.attention,
          attention_kwargs=attention_kwargs,
          dtype=dtype,
          rngs=rngs,
        ),
        layers.MLP(
          d, c.mlp_ratio * d, activation=c.activation, dtype=dtype, rngs=rngs
        ),
      ]

    self.net = _stack(c, make_blocks, norm_kwargs, None, rngs)
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

  ``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`) runs every `ConvBlock`
  under that `jax.checkpoint` policy (the parameters are the same for
  every ``remat``).
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
  remat: str = "none"


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
    layers.check_remat("CNN", c.remat)
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
      remat=c.remat,
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
  """A self-normalizing MLP: SELU, LeCun-normal init, alpha dropout.

  ``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`) runs each hidden layer's
  ``act(dense(x))`` under that `jax.checkpoint` policy.
  """

  num_classes: int = 10
  image_shape: tuple[int, int, int] = (28, 28, 1)
  width: int = 256
  depth: int = 4
  activation: str = "selu"
  dropout: float = 0.05
  remat: str = "none"


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
    layers.check_remat("SNN", c.remat)
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
    act = self.act
    hidden = layers.rematerialize(
      lambda layer, x: act(layer(x)), self.config.remat
    )
    for i, layer in enumerate(self.layers):
      x = hidden(layer, x)
      if rngs is not None and self.config.dropout > 0:
        x = self.dropout(
          x, deterministic=False, key=jax.random.fold_in(rngs, i)
        )
    return self.head(x)


# ---------------------------------------------------------------------------
# Layout conversion: unrolled <-> scanned stacks.

_Path = tuple[Any, ...]
_SCANNED = ("net", "layers")


def _model_class(who: str, config: Any) -> type[nnx.Module]:
  models = {LMConfig: DecoderLM, ViTConfig: ViT}
  if type(config) not in models:
    raise ValueError(
      f"{who}: config must be an LMConfig or a ViTConfig (the models with "
      f"scan_layers), got {type(config).__name__}"
    )
  return models[type(config)]


def _scanned_template(who: str, config: LMConfig | ViTConfig) -> dict:
  """The scanned model's flat state, abstract: path -> variable."""
  cls = _model_class(who, config)
  scanned = dataclasses.replace(config, scan_layers=True)
  model = nnx.eval_shape(lambda: cls(scanned, rngs=nnx.Rngs(0)))
  return {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}


def _to_scanned(path: _Path) -> tuple[_Path, int | None]:
  """An unrolled path's scanned path and layer (None: not in a layer)."""
  if len(path) < 3 or path[0] != "net" or path[1] not in ("blocks", "steps"):
    return path, None
  k, rest = path[2], path[3:]
  layer, j = divmod(k, _PER_LAYER)
  if path[1] == "steps":
    return (*_SCANNED, "res", "steps", j, *rest), layer
  return (*_SCANNED, "blocks", j, *rest), layer


def _to_unrolled(path: _Path, layer: int) -> _Path:
  """The unrolled path of layer ``layer`` of a scanned path."""
  if path[2] == "res":  # net/layers/res/steps/j/...
    j, rest = path[4], path[5:]
    return ("net", "steps", layer * _PER_LAYER + j, *rest)
  j, rest = path[3], path[4:]  # net/layers/blocks/j/...
  return ("net", "blocks", layer * _PER_LAYER + j, *rest)


def _copied(leaf: Any) -> Any:
  """A new variable holding the same value (no variable object is shared)."""
  return leaf.copy() if isinstance(leaf, nnx.Variable) else leaf


def _value(leaf: Any) -> Any:
  return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def _resharded(sharding: Any, stack: bool) -> Any:
  """A `NamedSharding` with the leading layer axis added or dropped."""
  if not isinstance(sharding, jax.sharding.NamedSharding):
    return sharding
  spec = tuple(sharding.spec)
  spec = (None, *spec) if stack else spec[1:]
  return jax.sharding.NamedSharding(
    sharding.mesh, jax.sharding.PartitionSpec(*spec)
  )


def _with_value(leaf: Any, value: Any, stack: bool) -> Any:
  """``leaf`` (a variable or a bare value) holding ``value``.

  A variable's ``out_sharding`` names gain (``stack``) or lose their
  leading entry, the layer axis, as `_common.ScannedStack` names it.
  """
  if not isinstance(leaf, nnx.Variable):
    return value
  new = leaf.copy(value)
  names = new.get_metadata().get("out_sharding")
  if names is not None:
    names = tuple(names)
    names = (_common.layer_axis_name(), *names) if stack else names[1:]
    new.set_metadata(out_sharding=names)
  return new


def _stack_values(values: list[Any]) -> Any:
  first = values[0]
  if isinstance(first, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(
      (len(values), *first.shape),
      first.dtype,
      sharding=_resharded(first.sharding, True),
    )
  return jnp.stack(values)


def _layer_value(value: Any, layer: int) -> Any:
  if isinstance(value, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(
      value.shape[1:], value.dtype, sharding=_resharded(value.sharding, False)
    )
  return value[layer]


def _check_shape(who: str, path: _Path, shape: tuple, want: tuple) -> None:
  if tuple(shape) != tuple(want):
    raise ValueError(
      f"{who}: {'/'.join(map(str, path))} has shape {tuple(shape)}, but "
      f"the config's model has {tuple(want)}; pass the config the state "
      "was built with"
    )


def _unknown(who: str, path: _Path, layout: str) -> ValueError:
  return ValueError(
    f"{who}: {'/'.join(map(str, path))} is not a variable of the {layout} "
    "layout of this config (its depth, residual and parts); pass "
    "the config the state was built with"
  )


def stack_layers(
  unrolled_state: nnx.State,
  config: LMConfig | ViTConfig,
  *,
  constants: bool = False,
) -> nnx.State:
  """The state of the scanned model (``scan_layers=True``) from an unrolled.

  Layer ``l``'s sublayer ``j`` (``net/blocks/<2 l + j>``) and residual step
  (``net/steps/<2 l + j>``) become slice ``l`` of ``net/layers/blocks/<j>``
  and ``net/layers/res/steps/<j>``; every other variable is kept. Works on
  any part of a model's state (``nnx.state(model, nnx.Param)``, an
  optimizer's moments, the abstract target of a checkpoint restore): array
  leaves are stacked in their dtype, `jax.ShapeDtypeStruct` leaves get the
  stacked shape and a `NamedSharding` with a replicated leading axis, and
  variables' ``out_sharding`` gain the leading ``layers`` name.

  Args:
    unrolled_state: an `nnx.State` of the unrolled model of ``config``.
    config: the model's config: its depth and parts decide the layout;
      ``scan_layers`` and ``remat`` are ignored.
    constants: also add the scanned model's constant layer indices
      (`jaxnorm.nn.LayerIndex`: LNS's layer ``l``), which no unrolled state
      holds. Set it for the part that holds the model's non-parameter
      variables (the whole ``nnx.state(model)``, or the ``...`` part of
      ``nnx.split(model, nnx.Param, ...)``), so the result merges with the
      scanned graph; or `nnx.update` a scanned model with the result, which
      keeps the model's own.

  Returns:
    The `nnx.State` of the scanned layout.

  Raises:
    ValueError: for a config other than `LMConfig` / `ViTConfig`, a
      residual that cannot be scanned, a variable the config's unrolled
      model does not have, a wrong shape or a missing layer.
  """
  who = "stack_layers"
  template = _scanned_template(who, config)
  out: dict[_Path, Any] = {}
  layered: dict[_Path, list[Any]] = {}
  for path, leaf in nnx.to_flat_state(unrolled_state):
    target, layer = _to_scanned(tuple(path))
    want = template.get(target)
    scanned = layer is None and target[: len(_SCANNED)] == _SCANNED
    if want is None or scanned or (layer is not None and layer >= config.depth):
      raise _unknown(who, tuple(path), "unrolled")
    shape = want.shape if layer is None else want.shape[1:]
    _check_shape(who, tuple(path), _value(leaf).shape, shape)
    if layer is None:
      out[target] = _copied(leaf)
    else:
      layered.setdefault(target, [None] * config.depth)[layer] = leaf
  for target, leaves in layered.items():
    missing = [i for i, leaf in enumerate(leaves) if leaf is None]
    if missing:
      path = _to_unrolled(target, missing[0])
      raise ValueError(
        f"{who}: {'/'.join(map(str, path))} is missing (layer "
        f"{missing[0]} of {'/'.join(map(str, target))})"
      )
    value = _stack_values([_value(leaf) for leaf in leaves])
    out[target] = _with_value(leaves[0], value, True)
  if constants:
    for path, var in template.items():
      if isinstance(var, nn_residual.LayerIndex):
        out[path] = var.copy(jnp.arange(config.depth, dtype=var.dtype))
  return nnx.from_flat_state(sorted(out.items(), key=lambda kv: _order(kv[0])))


def unstack_layers(
  scanned_state: nnx.State, config: LMConfig | ViTConfig
) -> nnx.State:
  """The state of the unrolled model (``scan_layers=False``) from a scanned.

  The inverse of `stack_layers`: slice ``l`` of ``net/layers/blocks/<j>``
  and ``net/layers/res/steps/<j>`` becomes ``net/blocks/<2 l + j>`` and
  ``net/steps/<2 l + j>``; the constant layer indices
  (`jaxnorm.nn.LayerIndex`) are dropped (the unrolled steps hold theirs as
  Python integers). Array leaves are sliced, `jax.ShapeDtypeStruct` leaves
  (a restore target) lose the leading axis of their shape and sharding.

  Args:
    scanned_state: an `nnx.State` (or a part of one) of the scanned model of
      ``config``.
    config: the model's config: its depth and parts decide the layout;
      ``scan_layers`` and ``remat`` are ignored.

  Returns:
    The `nnx.State` of the unrolled layout.

  Raises:
    ValueError: for a config other than `LMConfig` / `ViTConfig`, a
      residual that cannot be scanned, a variable the config's scanned
      model does not have, or a wrong shape.
  """
  who = "unstack_layers"
  template = _scanned_template(who, config)
  out: dict[_Path, Any] = {}
  for path, leaf in nnx.to_flat_state(scanned_state):
    path = tuple(path)
    want = template.get(path)
    if want is None:
      raise _unknown(who, path, "scanned")
    value = _value(leaf)
    _check_shape(who, path, value.shape, want.shape)
    if path[: len(_SCANNED)] != _SCANNED:
      out[path] = _copied(leaf)
    elif not isinstance(leaf, nn_residual.LayerIndex):
      for layer in range(config.depth):
        out[_to_unrolled(path, layer)] = _with_value(
          leaf, _layer_value(value, layer), False
        )
  return nnx.from_flat_state(sorted(out.items(), key=lambda kv: _order(kv[0])))


def _order(path: _Path) -> tuple:
  """Sort key of a state path: integers (list indices) before strings."""
  return tuple((isinstance(k, str), k) for k in path)
