"""Models composed from named parts: decoder LM, ViT, ResNet-style CNN, SNN.

Every model is built from a small frozen config whose string fields name its
parts, so a variant is one flag away:

* ``norm``: any name of `jaxnorm.nn.NORMS` (via `make_norm`);
* ``attention``: any name of the attention registry (via `make_attention`);
* ``residual``: any name of `jaxnorm.nn.residual.RESIDUALS` (via
  `make_residual`, which wraps the list of sublayers, attention and MLP
  alternating, into the network);
* ``activation``: any name of `ACTIVATIONS`.

Parts that later land in those registries plug in without touching this
file. Parameters carry logical axis names (``vocab``, ``embed``, ``mlp``,
``channels``) resolved by `jaxnorm.sharding`.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import activations, sharding
from jaxnorm.nn import _param
from jaxnorm.nn import activations as nn_activations
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import residual as nn_residual

# ---------------------------------------------------------------------------
# Building blocks.


# Variants whose pure function has no causal mask are bidirectional only
# (SOFT, NaLaFormer and LINA come from vision); they build into the ViT.
CAUSAL_ATTENTIONS: tuple[str, ...] = tuple(
  n for n in nn_attention.ATTENTION_NAMES if n not in ("soft", "nala", "lina")
)


class Dense(nnx.Module):
  """``y = x @ kernel (+ bias)`` with a ``(in, out)`` kernel and axis names."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    names: tuple[str | None, str | None],
    use_bias: bool = True,
    kernel_init: Callable[..., jax.Array] | None = None,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    init = kernel_init or nnx.initializers.lecun_normal()
    self.kernel = _param.param(
      init(rngs.params(), (in_features, out_features), param_dtype), names
    )
    self.bias = (
      _param.param(jnp.zeros((out_features,), param_dtype), names[1:])
      if use_bias
      else None
    )
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the map to the last axis of ``x``."""
    y = jnp.matmul(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
    if self.bias is not None:
      b = self.bias[...].astype(self.dtype)
      y = y + b.reshape((1,) * (y.ndim - 1) + b.shape)
    return y


class Conv(nnx.Module):
  """NHWC convolution with a ``(kh, kw, in, out)`` kernel, SAME padding."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    kernel_size: int = 3,
    stride: int = 1,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    init = nnx.initializers.he_normal(in_axis=(0, 1, 2), out_axis=3)
    shape = (kernel_size, kernel_size, in_features, out_features)
    self.kernel = _param.param(
      init(rngs.params(), shape, param_dtype), (None, None, None, "channels")
    )
    self.stride, self.dtype = stride, dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """Convolves ``x`` of shape ``(n, h, w, in)``."""
    return jax.lax.conv_general_dilated(
      x.astype(self.dtype),
      self.kernel[...].astype(self.dtype),
      (self.stride, self.stride),
      "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


def _gelu(x):
  return jax.nn.gelu(x, approximate=False)


# name -> (elementwise function or module class, gated)
ACTIVATIONS: Mapping[str, tuple[Any, bool]] = types.MappingProxyType(
  {
    "gelu": (_gelu, False),
    "relu": (jax.nn.relu, False),
    "silu": (jax.nn.silu, False),
    "elu": (activations.elu, False),
    "selu": (activations.selu, False),
    "swiglu": (jax.nn.silu, True),
    "geglu": (_gelu, True),
    "salu": (nn_activations.SALU, False),
    "swalu": (nn_activations.SWALU, False),
    "galu": (nn_activations.GALU, False),
  }
)


class MLP(nnx.Module):
  """Position-wise MLP ``down(act(up(x)))``; gated names use ``a(x) * b``."""

  def __init__(
    self,
    width: int,
    hidden: int,
    *,
    activation: str,
    dtype: Any,
    use_bias: bool = True,
    rngs: nnx.Rngs,
  ):
    fn, gated = ACTIVATIONS[activation]
    self.gated = gated
    self.up = Dense(
      width,
      hidden * (2 if gated else 1),
      names=("embed", "mlp"),
      use_bias=use_bias,
      dtype=dtype,
      rngs=rngs,
    )
    if isinstance(fn, type):
      kwargs = {"experimental": True} if fn is not nn_activations.SALU else {}
      self.act = fn(hidden, rngs=rngs, **kwargs)
    else:
      self.act = fn
    self.down = Dense(
      hidden,
      width,
      names=("mlp", "embed"),
      use_bias=use_bias,
      dtype=dtype,
      rngs=rngs,
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the MLP over the last axis."""
    h = self.up(x)
    if self.gated:
      a, b = jnp.split(h, 2, axis=-1)
      h = self.act(a) * b
    else:
      h = self.act(h)
    return self.down(h)


def _residual_kwargs(
  name: str, norm: str, norm_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
  if name in ("skipinit", "rezero"):  # The papers' branches have no norm.
    return {}
  kwargs: dict[str, Any] = {"norm": norm, "norm_kwargs": dict(norm_kwargs)}
  if name == "lns":
    kwargs["sublayers_per_layer"] = 2
  if name in ("hc", "mhc", "ohc", "ihc"):
    kwargs["readout"] = "mean"
  if name == "block_attnres":
    kwargs["num_blocks"] = 2
  return kwargs


# Grouped norms keep their paper's group count when it divides the width,
# else the largest divisor of the width below it.
_GROUP_DEFAULTS = types.MappingProxyType(
  {"groupnorm": 32, "evonorms0": 32, "timestepdecaynorm": 64}
)

# Norms whose statistics need an image (NHWC) or a sequence layout.
IMAGE_ONLY_NORMS: tuple[str, ...] = ("regionnorml",)
SEQUENCE_ONLY_NORMS: tuple[str, ...] = ("timestepdecaynorm",)


def _norm_kwargs(norm: str, width: int) -> dict[str, Any]:
  if norm in _GROUP_DEFAULTS:
    groups = math.gcd(width, _GROUP_DEFAULTS[norm])
    if norm == "timestepdecaynorm" and groups == width:  # needs G < D.
      groups = max(width // 2, 1)
    return {"num_groups": groups}
  return {}


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
    norm: norm name; ``norm_kwargs`` are passed to every norm. ``"none"``
      builds a norm-free pre-norm stack ``x + f(x)`` without a final norm
      (the LayerNorm-free export of `jaxnorm.convert.remove_fake_ln`).
    attention: attention variant (causal ones only).
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

  def __init__(
    self, config: LMConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    if c.attention not in CAUSAL_ATTENTIONS:
      raise ValueError(
        f"DecoderLM: attention {c.attention!r} has no causal form, so a "
        f"decoder would see future tokens; choose one of "
        f"{', '.join(CAUSAL_ATTENTIONS)}"
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
    norm_kwargs = {**_norm_kwargs(c.norm, d), **dict(c.norm_kwargs)}
    blocks = []
    for _ in range(c.depth):
      blocks.append(
        nn_attention.make_attention(
          c.attention,
          d,
          c.num_heads,
          head_dim=c.head_dim,
          is_causal=True,
          use_rope=c.positional == "rope",
          use_bias=c.use_bias,
          dtype=dtype,
          rngs=rngs,
        )
      )
      blocks.append(
        MLP(
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
    if c.norm == "none" and c.residual != "prenorm":
      raise ValueError(
        f"DecoderLM: norm='none' is the norm-free pre-norm "
        f"stack x + f(x); it needs residual='prenorm', got "
        f"residual={c.residual!r}"
      )
    self.net = (
      nn_residual.make_residual(
        "scaled", blocks, num_features=d, rngs=rngs, norm=None, scale=1.0
      )
      if c.norm == "none"
      else nn_residual.make_residual(
        c.residual,
        blocks,
        num_features=d,
        rngs=rngs,
        **_residual_kwargs(c.residual, c.norm, norm_kwargs),
      )
    )
    self.final_norm = (
      None
      if c.norm == "none"
      else nn_norms.make_norm(c.norm, d, rngs=rngs, **norm_kwargs)
    )
    self.head = (
      None
      if c.tie_embeddings
      else Dense(
        d,
        c.vocab_size,
        names=("embed", "vocab"),
        use_bias=c.use_bias,
        dtype=dtype,
        rngs=rngs,
      )
    )

  def __call__(
    self, tokens: jax.Array, *, rngs: jax.Array | None = None
  ) -> jax.Array:
    """Logits ``(batch, seq, vocab)`` (in ``dtype``) for int tokens."""
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
    h = self.net(x)
    if self.final_norm is not None:
      h = self.final_norm(h)
    if self.head is None:
      return jnp.matmul(h, self.embed[...].astype(self.dtype).T)
    return self.head(h)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
  """A Vision Transformer classifier on NHWC images."""

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


def _vit_attention_kwargs(name: str, tokens: int) -> dict[str, Any]:
  if name == "lina":  # Static KV gates over the token positions.
    return {"lina_max_len": tokens}
  if name == "soft":  # Landmark windows must tile the tokens (CLS + patches).
    return {"soft_ratio": math.gcd(tokens, 2)}
  return {}


class ViT(nnx.Module):
  """Patch embedding, [CLS] token, learned positions, blocks, CLS head."""

  def __init__(
    self, config: ViTConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    h, w, ch = c.image_shape
    if h % c.patch_size or w % c.patch_size:
      raise ValueError(
        f"ViT: patch_size={c.patch_size} must divide the image size {h}x{w}"
      )
    self.dtype = dtype
    d = c.width
    num_patches = (h // c.patch_size) * (w // c.patch_size)
    self.patch = Dense(
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
    norm_kwargs = _norm_kwargs(c.norm, d)
    blocks = []
    for _ in range(c.depth):
      blocks.append(
        nn_attention.make_attention(
          c.attention,
          d,
          c.num_heads,
          dtype=dtype,
          rngs=rngs,
          **_vit_attention_kwargs(c.attention, num_patches + 1),
        )
      )
      blocks.append(
        MLP(d, c.mlp_ratio * d, activation=c.activation, dtype=dtype, rngs=rngs)
      )
    self.net = nn_residual.make_residual(
      c.residual,
      blocks,
      num_features=d,
      rngs=rngs,
      **_residual_kwargs(c.residual, c.norm, norm_kwargs),
    )
    self.final_norm = nn_norms.make_norm(c.norm, d, rngs=rngs, **norm_kwargs)
    self.head = Dense(
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
  """A ResNet-style CNN: strided stem, residual conv blocks, pooled head."""

  num_classes: int = 10
  image_shape: tuple[int, int, int] = (28, 28, 1)
  width: int = 32
  depth: int = 4
  norm: str = "batchnorm"
  residual: str = "prenorm"
  activation: str = "relu"


class ConvBlock(nnx.Module):
  """The residual branch ``conv3x3(act(conv3x3(x)))`` at constant width."""

  def __init__(
    self, width: int, *, activation: str, dtype: Any, rngs: nnx.Rngs
  ):
    fn, gated = ACTIVATIONS[activation]
    if gated or isinstance(fn, type):
      self.act = MLP(
        width, width, activation=activation, dtype=dtype, rngs=rngs
      )
    else:
      self.act = fn
    self.conv1 = Conv(width, width, dtype=dtype, rngs=rngs)
    self.conv2 = Conv(width, width, dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the branch to NHWC ``x``."""
    return self.conv2(self.act(self.conv1(x)))


class CNN(nnx.Module):
  """ResNet-style classifier; norms normalize the channel (last) axis."""

  def __init__(
    self, config: CNNConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    c = self.config = config
    ch = c.image_shape[-1]
    stride = 2 if min(c.image_shape[:2]) >= 16 else 1
    self.stem = Conv(ch, c.width, stride=stride, dtype=dtype, rngs=rngs)
    norm_kwargs = _norm_kwargs(c.norm, c.width)
    blocks = [
      ConvBlock(c.width, activation=c.activation, dtype=dtype, rngs=rngs)
      for _ in range(c.depth)
    ]
    self.net = nn_residual.make_residual(
      c.residual,
      blocks,
      num_features=c.width,
      rngs=rngs,
      **_residual_kwargs(c.residual, c.norm, norm_kwargs),
    )
    self.final_norm = nn_norms.make_norm(
      c.norm, c.width, rngs=rngs, **norm_kwargs
    )
    self.head = Dense(
      c.width, c.num_classes, names=("channels", None), dtype=dtype, rngs=rngs
    )
    fn, gated = ACTIVATIONS[c.activation]
    # Pre-activation ResNet head: norm -> activation -> global pooling. The
    # activation matters: per-channel spatial statistics (instance-like
    # norms) make the pooled normalized map exactly zero without it.
    self.final_act = jax.nn.relu if gated or isinstance(fn, type) else fn

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
    fn, gated = ACTIVATIONS[c.activation]
    if gated or isinstance(fn, type):
      raise ValueError(
        f"SNN: activation must be elementwise, got "
        f"{c.activation!r}; choose one of selu, elu, gelu, "
        f"relu, silu"
      )
    self.act = fn
    init = activations.lecun_normal("normal")
    sizes = [math.prod(c.image_shape)] + [c.width] * c.depth
    self.layers = nnx.List(
      [
        Dense(
          a, b, names=(None, "mlp"), kernel_init=init, dtype=dtype, rngs=rngs
        )
        for a, b in zip(sizes[:-1], sizes[1:])
      ]
    )
    self.dropout = nn_activations.AlphaDropout(c.dropout)
    self.head = Dense(
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


# ---------------------------------------------------------------------------
# Registry used by the runner.


def registries(model: str = "lm") -> dict[str, tuple[str, ...]]:
  """Valid part names per config field for ``model``."""
  attention = (
    CAUSAL_ATTENTIONS if model == "lm" else nn_attention.ATTENTION_NAMES
  )
  excluded = {
    "lm": IMAGE_ONLY_NORMS,
    "vit": IMAGE_ONLY_NORMS,
    "cnn": SEQUENCE_ONLY_NORMS,
  }.get(model, ())
  norms = [n for n in nn_norms.NORMS if n not in excluded]
  return {
    "norm": tuple(sorted(norms)),
    "attention": tuple(sorted(attention)),
    "residual": tuple(sorted(nn_residual.RESIDUALS)),
    "activation": tuple(sorted(ACTIVATIONS)),
  }


def build_model(
  cfg: Any,
  *,
  rngs: nnx.Rngs,
  dtype: Any = jnp.float32,
  vocab_size: int | None = None,
  max_len: int | None = None,
  num_classes: int | None = None,
  image_shape: tuple[int, ...] | None = None,
) -> nnx.Module:
  """Builds the model a `TrainConfig`-like ``cfg`` names.

  ``cfg`` needs ``model``, ``width``, ``depth``, ``num_heads``, ``norm``,
  ``attention``, ``residual``, ``activation`` and ``positional``; the data
  fills in the vocabulary or image shape and classes.
  """
  if cfg.model == "lm":
    return DecoderLM(
      LMConfig(
        vocab_size=vocab_size,
        width=cfg.width,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        max_len=max_len,
        norm=cfg.norm,
        attention=cfg.attention,
        residual=cfg.residual,
        activation=cfg.activation,
        positional=cfg.positional,
      ),
      dtype=dtype,
      rngs=rngs,
    )
  image_shape = tuple(int(s) for s in image_shape)
  if cfg.model == "vit":
    patch = 4 if min(image_shape[:2]) >= 16 else 2
    return ViT(
      ViTConfig(
        num_classes=num_classes,
        image_shape=image_shape,
        patch_size=patch,
        width=cfg.width,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        norm=cfg.norm,
        attention=cfg.attention,
        residual=cfg.residual,
        activation=cfg.activation,
      ),
      dtype=dtype,
      rngs=rngs,
    )
  if cfg.model == "cnn":
    return CNN(
      CNNConfig(
        num_classes=num_classes,
        image_shape=image_shape,
        width=cfg.width,
        depth=cfg.depth,
        norm=cfg.norm,
        residual=cfg.residual,
        activation=cfg.activation,
      ),
      dtype=dtype,
      rngs=rngs,
    )
  if cfg.model == "mlp":
    return SNN(
      SNNConfig(
        num_classes=num_classes,
        image_shape=image_shape,
        width=cfg.width,
        depth=cfg.depth,
        activation=cfg.activation,
      ),
      dtype=dtype,
      rngs=rngs,
    )
  raise ValueError(
    f"build_model: unknown model {cfg.model!r}; valid names "
    f"are cnn, lm, mlp, vit"
  )
