"""Complex models: the complex decoder LM and the CV-CNN.

`ComplexLM` (CNet / PCT style) and `CVCNN` (the CNN vs CV-CNN study) are
built from the complex parts of this package; both return real logits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, cplx
from jaxnorm.nn import _common, _param
from jaxnorm.nn import layers as nn_layers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import residual as nn_residual
from jaxnorm.nn.cplx.layers import (
  ComplexConv,
  ComplexDense,
  ModReLU,
  cnet_input_init,
  complex_glorot,
  torch_linear_init,
)
from jaxnorm.nn.cplx.multihead import ComplexMultiHeadAttention
from jaxnorm.nn.cplx.norms import ComplexBatchNorm

FOURIER = "fourier"
"""`ComplexLMConfig.attention`'s one name outside the attention registry:
CNet's causal Fourier mixing, which has no projections and is no core."""

CNET_SOURCE = (
  "crasmarum/CNet at 07748ae17fc9d09ce35208a251946cb4c1ab2435: "
  "examples/dp_shakespeare.cpp and examples/gollm.cpp (buildLM), "
  "examples/README_gollm.md (working recipe)"
)
"""The official code `ComplexLMConfig.cnet_official` follows."""

PCT_SOURCE = (
  "leohio/phase-coherent-transformer-r-d at "
  "aa228b76c47f10697f964a9b2782e367a32774e5: "
  "code/complex_nn_experiment/transformer.py (TransformerCell, "
  "cell='complex_sigmoid'), baselines/lucidrains_cvt/"
  "complex_valued_transformer.py, screening.py, "
  "code/phase8_experiment/src/train_with_checkpoint.py"
)
"""The official code `ComplexLMConfig.pct_official` follows."""

_PARAM_INITS = ("glorot", "cnet", "pct")


@dataclasses.dataclass(frozen=True)
class ComplexLMConfig:
  """A complex-valued decoder LM (CNet Born stack or PCT stack).

  Attributes:
    vocab_size: vocabulary.
    width: complex width ``D`` (``2 D`` reals per token).
    depth: blocks.
    num_heads: heads of the attention.
    max_len: longest sequence.
    attention: a name of `jaxnorm.nn.attention.ATTENTIONS` whose core is
      complex-valued and has a causal form (``born``, ``pct``,
      ``complex_softmax``), run inside
      `ComplexMultiHeadAttention`; or the one exception ``fourier``
      (`FOURIER`): CNet's causal DFT of the flattened token-major stream
      (`cplx.causal_fourier_mix`), which has no projections and is not an
      attention core.
    attention_kwargs: ``(name, value)`` options of the attention core, over
      its spec's defaults, e.g. ``(("gate", "tanh1"),)`` for ``pct``
      (`jaxnorm.cplx.PCT_GATES`).
    norm: a name of `jaxnorm.nn.norms.NORMS` whose module is complex-valued,
      per-token and causal, without batch statistics: ``complexrmsnorm``
      (`ComplexRMSNorm`, CNet's TokenNorm with a complex gain: output RMS
      1), ``pctrmsnorm`` (`PCTRMSNorm`, the PCT's: output RMS ``1/d``) or
      ``complexlayernorm`` (`ComplexLayerNorm`).
    norm_kwargs: ``(name, value)`` pairs for `make_norm`, e.g.
      ``(("use_scale", False),)`` (CNet's parameter-free TokenNorm).
    activation: FFN activation: ``split_gelu`` (CNet) or ``modrelu`` (PCT,
      power 2).
    ffn_ratio: FFN hidden width over ``D``.
    readout: ``born`` (logits ``log|z|^2`` of a complex head: the softmax
      of them is the Born rule) or ``real`` (a real dense layer on ``[Re |
      Im]``, the PCT's readout).
    embed_init: ``gauss`` (CNet's recipe ``emb_gauss``: Re, Im ~
      U(-1, 1)/sqrt(D)), ``glorot``, ``cnet`` (``CEmbedding``'s biased
      init, Re ~ U(-1/2, 1/2)/sqrt(D), Im = sqrt(1 - Re^2)/sqrt(D),
      positive imaginary parts, which the authors report sits at a unigram
      saddle with the Born loss) or ``normal`` (the PCT's
      ``torch.randn(V, D, dtype=complex64) / sqrt(D)``: a circular complex
      normal with ``E|e|^2 = 1/D``).
    cnet_gelu: CNet's block, which applies ``split_gelu`` to the stream
      after each residual add (and the norm input after the first); off
      gives a plain pre-norm block.
    remat: `jaxnorm.nn.layers.REMAT_CHOICES`: runs each `ComplexBlock`
      under that `jax.checkpoint` policy (complex products are recomputed,
      never saved: see `jaxnorm.nn.layers.rematerialize`).
    head_dim: complex width of each attention head; None is ``width //
      num_heads``. CNet's Born attention is one head of ``width // 2``
      (``dh = E / 2`` in its ``buildLM``).
    pos_embed: add a learned complex ``(max_len, width)`` positional table
      to the token embedding (CNet's ``pos = CInput(OutSize(N * E))``, an
      ``N x E`` table added by a ``Residual``), init by ``param_init``
      (``cnet``: `cnet_input_init`; else zeros). RoPE on q and k is on in
      every attention.
    ffn_bias: biases on the two FFN denses (CNet's ``TokenwiseLinear`` has
      none; the PCT's complex ``nn.Linear`` has them).
    modrelu_bias: ``feature`` (one modReLU bias per hidden feature) or
      ``scalar`` (one per FFN: the PCT's official ``ModReLU``, whose bias
      is ``torch.tensor(0.)``); used with ``activation="modrelu"``.
    param_init: ``glorot`` (complex Glorot projections and FFN, zero
      biases, flax's default real readout), ``cnet`` (CNet: every weight
      and the positional table by `cnet_input_init`, each divided by its
      element count) or ``pct`` (the PCT: q, k, v drawn as one fused Glorot
      matrix of fan-out ``3 N H``, output projection Glorot, FFN weights
      and biases and the real readout by PyTorch's ``nn.Linear`` default,
      `torch_linear_init`).

  The defaults build the stacks the experiments have used so far; the
  official stacks are `cnet_official` and `pct_official`.

  Examples:
    >>> config = ComplexLMConfig(vocab_size=16, width=8, depth=1)
    >>> config.attention, config.norm, config.readout  # CNet's defaults
    ('born', 'complexrmsnorm', 'born')
  """

  vocab_size: int = 256
  width: int = 32
  depth: int = 2
  num_heads: int = 1
  max_len: int = 64
  attention: str = "born"
  attention_kwargs: tuple[tuple[str, Any], ...] = ()
  norm: str = "complexrmsnorm"
  norm_kwargs: tuple[tuple[str, Any], ...] = ()
  activation: str = "split_gelu"
  ffn_ratio: int = 4
  readout: str = "born"
  embed_init: str = "gauss"
  cnet_gelu: bool = True
  remat: str = "none"
  head_dim: int | None = None
  pos_embed: bool = False
  ffn_bias: bool = True
  modrelu_bias: str = "feature"
  param_init: str = "glorot"

  @classmethod
  def cnet_official(
    cls,
    vocab_size: int = 256,
    *,
    width: int = 64,
    depth: int = 4,
    max_len: int = 64,
    **overrides: Any,
  ) -> ComplexLMConfig:
    """CNet's language model as its official code builds it (Born stack).

    ``buildLM`` of ``examples/gollm.cpp`` and ``examples/dp_shakespeare.cpp``
    (`CNET_SOURCE`) with the flags of ``README_gollm.md``'s working recipe
    (``-born true -rope true -token_norm true -emb_gauss true``):

    * token embedding ``emb_gauss`` (Re, Im ~ U(-1, 1)/sqrt(E)) plus a
      learned ``N x E`` positional table (``pos_embed``);
    * per block: ``pre = CGelu(TokenNorm(x))``; one Born-attention head of
      width ``E/2`` (``head_dim``: Q, K, V ``TokenwiseLinear`` E -> E/2,
      RoPE on Q and K, ``BornAttention(N, E/2, causal=True, attn_eps=0)``,
      output E/2 -> E); ``x = CGelu(x + attn)``; ``x = CGelu(x +
      W2 CGelu(W1 TokenNorm(x)))`` with ``W1`` E -> 4E and ``W2`` 4E -> E
      and no biases (``ffn_bias``);
    * final ``TokenNorm`` (parameter-free, eps 1e-5), ``TokenwiseLinear``
      E -> vocab without bias, Born readout;
    * every weight by CNet's ``CInput`` init (``param_init="cnet"``).

    Sizes default to ``dp_shakespeare``'s flags (``-emb 64 -tokens 64
    -blocks 4``); ``gollm``'s recipe uses 256 / 128 / 6. ``overrides``
    replace any field (e.g. ``remat``).

    Training (not part of the config): the Born cross-entropy with
    ``ce_eps = 1e-3`` (`jaxnorm.cplx.born_cross_entropy` with
    ``target_floor=1e-3`` on `ComplexLM.amplitudes`); CNet's "true Adam"
    (Adam on Re and Im separately: `jaxnorm.optim.complex_adam`, b1 0.9,
    b2 0.999, eps 1e-8) at lr 1e-3 with linear warmup (100 steps in
    ``README_gollm.md``, 200 in ``dp_shakespeare``) and cosine decay to
    1e-4. ``-grad_clip 1.0`` is, by the flag's comment, a clip *by value*
    of each gradient component (the real and imaginary parts of CNet's
    ``dz_star = conj(g)/2``, i.e. ``|Re g|, |Im g| <= 2`` for JAX's
    gradient ``g`` of the same loss) inside the Adam update; the runner's
    ``--clip-norm 1.0`` is a global-norm clip, a different operation
    (CNet's separate ``-grad_norm_clip`` flag is off in the recipe).

    Args:
      vocab_size: vocabulary.
      width: complex width ``E``.
      depth: blocks ``L``.
      max_len: context ``N`` (the positional table's length).
      **overrides: other fields.

    Returns:
      The config.

    Examples:
      >>> c = ComplexLMConfig.cnet_official(65)
      >>> c.width, c.head_dim, c.pos_embed, c.ffn_bias, c.param_init
      (64, 32, True, False, 'cnet')
    """
    fields = dict(
      vocab_size=vocab_size,
      width=width,
      depth=depth,
      num_heads=1,
      head_dim=width // 2,
      max_len=max_len,
      attention="born",
      attention_kwargs=(),
      norm="complexrmsnorm",
      norm_kwargs=(("use_scale", False),),
      activation="split_gelu",
      ffn_ratio=4,
      readout="born",
      embed_init="gauss",
      cnet_gelu=True,
      pos_embed=True,
      ffn_bias=False,
      param_init="cnet",
    )
    return cls(**{**fields, **overrides})

  @classmethod
  def pct_official(
    cls,
    vocab_size: int = 256,
    *,
    width: int = 128,
    depth: int = 4,
    num_heads: int = 4,
    head_dim: int = 32,
    max_len: int = 64,
    gate: str = "sigmoid",
    **overrides: Any,
  ) -> ComplexLMConfig:
    """The Phase-Coherent Transformer as its official code builds it.

    ``TransformerCell(cell="complex_sigmoid")`` (`PCT_SOURCE`):

    * embedding ``torch.randn(V, D, dtype=complex64) / sqrt(D)``
      (``embed_init="normal"``), complex RoPE on q and k, no positional
      table;
    * per block, pre-norm: ``x + attn(norm x)``, ``x + FFN(norm x)``; the
      norm is the repository's ``ComplexRMSNorm`` (``pctrmsnorm``: output
      RMS ``1/d``, complex gain 1); attention
      ``ComplexMultiHeadSigmoidAttention``: fused bias-free ``to_qkv`` and
      ``to_out`` with complex Glorot (``param_init="pct"``), the sigmoid
      gate with one scalar bias per layer at ``-log(seq_len)`` (the trainer
      passes ``sigmoid_seq_len=seq_len``: ``gate_bias_len=max_len``);
      FFN ``nn.Linear(D, 4D)`` (complex, with bias), modReLU squared with
      ONE scalar bias init 0 (``modrelu_bias="scalar"``), ``nn.Linear(4D,
      D)``, both with PyTorch's default init;
    * final norm, real readout ``nn.Linear(2D, V)`` on ``[Re | Im]``.

    Sizes default to the README's quickstart (``--dim 128 --depth 4
    --heads 4 --dim-head 32``; ``TransformerCell``'s own defaults are 64 /
    2 / 4 / 16); set ``max_len`` to the training sequence length, which
    also sets the gate-bias init. ``overrides`` replace any field.

    Training (not part of the config): softmax cross-entropy on the real
    logits; ``torch.optim.AdamW`` (lr 3e-4, weight decay 1e-2 on every
    parameter) with linear warmup (1000 steps) and cosine decay to 0.1 lr;
    ``clip_grad_norm_(1.0)``, a global-norm clip like the runner's
    ``--clip-norm 1.0``. PyTorch's Adam keeps moments per real component of
    a complex parameter. Deviation: at ``z = 0`` the official modReLU gives
    ``relu(b)^2`` (``angle(0) = 0``), `jaxnorm.cplx.modrelu` gives 0.

    Args:
      vocab_size: vocabulary.
      width: complex width ``D`` (``--dim``).
      depth: blocks (``--depth``).
      num_heads: heads (``--heads``).
      head_dim: complex head width (``--dim-head``).
      max_len: sequence length (and the gate-bias init ``-log max_len``).
      gate: a `jaxnorm.cplx.PCT_GATES` name (``sigmoid`` is the PCT; the
        others are the repository's ablation cells).
      **overrides: other fields (with another ``attention`` the PCT core's
        options are dropped).

    Returns:
      The config.

    Examples:
      >>> c = ComplexLMConfig.pct_official(16, max_len=32)
      >>> c.norm, c.modrelu_bias, c.embed_init, c.param_init
      ('pctrmsnorm', 'scalar', 'normal', 'pct')
      >>> c.attention_kwargs  # the gate bias starts at -log(max_len)
      (('gate', 'sigmoid'), ('gate_bias_len', 32))
    """
    fields = dict(
      vocab_size=vocab_size,
      width=width,
      depth=depth,
      num_heads=num_heads,
      head_dim=head_dim,
      max_len=max_len,
      attention="pct",
      attention_kwargs=(("gate", gate), ("gate_bias_len", max_len)),
      norm="pctrmsnorm",
      norm_kwargs=(),
      activation="modrelu",
      ffn_ratio=4,
      readout="real",
      embed_init="normal",
      cnet_gelu=False,
      pos_embed=False,
      ffn_bias=True,
      modrelu_bias="scalar",
      param_init="pct",
    )
    if overrides.get("attention", "pct") != "pct":
      fields["attention_kwargs"] = ()
    return cls(**{**fields, **overrides})


def _embed_init(kind: str, key, shape) -> jax.Array:
  v, d = shape
  kr, ki = jax.random.split(key)
  if kind == "gauss":
    u = jax.random.uniform(kr, (2, v, d), minval=-1.0, maxval=1.0)
    return jax.lax.complex(u[0], u[1]) / math.sqrt(d)
  if kind == "cnet":
    re = jax.random.uniform(kr, (v, d), minval=-0.5, maxval=0.5)
    im = jnp.sqrt(1.0 - re**2)
    return jax.lax.complex(re, im) / math.sqrt(d)
  if kind == "normal":
    u = jax.random.normal(kr, (2, v, d)) * math.sqrt(0.5 / d)
    return jax.lax.complex(u[0], u[1])
  return complex_glorot(key, shape, in_axis=1, out_axis=0)


def _pos_init(c: ComplexLMConfig, rngs: nnx.Rngs) -> jax.Array:
  """The learned positional table: CNet's ``CInput`` init, or zeros."""
  shape = (c.max_len, c.width)
  if c.param_init == "cnet":
    return cnet_input_init(rngs.params(), shape)
  return jnp.zeros(shape, jnp.complex64)


def _dense_inits(c: ComplexLMConfig, fan_in: int) -> dict[str, Any]:
  """``kernel_init``/``bias_init`` of a `ComplexDense` under ``param_init``."""
  if c.param_init == "cnet":
    return {"kernel_init": cnet_input_init}
  if c.param_init == "pct":
    init = torch_linear_init(fan_in)
    return {"kernel_init": init, "bias_init": init}
  return {}


def _attention_init(c: ComplexLMConfig) -> str:
  """`ComplexMultiHeadAttention`'s ``init`` under ``param_init``."""
  return {"cnet": "cnet", "pct": "fused_glorot"}.get(c.param_init, "glorot")


def _norm(c: ComplexLMConfig, rngs: nnx.Rngs) -> nnx.Module:
  """The config's norm over the complex width."""
  return nn_norms.make_norm(
    c.norm, c.width, rngs=rngs, layout="tokens", **dict(c.norm_kwargs)
  )


def _fourier(x: jax.Array) -> jax.Array:
  """CNet's causal DFT of the flattened token-major stream of ``x``."""
  b, t, d = x.shape
  return cplx.causal_fourier_mix(x.reshape(b, t * d)).reshape(b, t, d)


class ComplexBlock(nnx.Module):
  """Pre-norm block: ``x + mix(norm x)``, ``x + FFN(norm x)``.

  ``mix`` is `ComplexMultiHeadAttention` (``attn``), or CNet's causal
  Fourier mixing for ``attention="fourier"`` (``attn`` is None).

  Examples:
    >>> block = ComplexBlock(ComplexLMConfig(width=8), rngs=nnx.Rngs(0))
    >>> y = block(jnp.ones((1, 3, 8), jnp.complex64))  # complex (B, T, D)
    >>> y.shape, y.dtype, type(block.attn).__name__
    ((1, 3, 8), dtype('complex64'), 'ComplexMultiHeadAttention')
  """

  def __init__(self, c: ComplexLMConfig, *, rngs: nnx.Rngs):
    d = c.width
    self.cnet_gelu = c.cnet_gelu
    self.norm1, self.norm2 = _norm(c, rngs), _norm(c, rngs)
    self.attn = (
      None
      if c.attention == FOURIER
      else ComplexMultiHeadAttention(
        d,
        c.num_heads,
        head_dim=c.head_dim,
        attention=c.attention,
        attention_kwargs=dict(c.attention_kwargs),
        init=_attention_init(c),
        rngs=rngs,
      )
    )
    hidden = c.ffn_ratio * d
    self.up = ComplexDense(
      d, hidden, use_bias=c.ffn_bias, rngs=rngs, **_dense_inits(c, d)
    )
    self.down = ComplexDense(
      hidden,
      d,
      use_bias=c.ffn_bias,
      rngs=rngs,
      axis_names=("mlp", "embed"),
      **_dense_inits(c, hidden),
    )
    self.act = (
      ModReLU(
        hidden,
        power=2,
        per_feature=c.modrelu_bias == "feature",
        rngs=rngs,
      )
      if c.activation == "modrelu"
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """One block on complex ``(B, T, D)``."""
    gelu = cplx.split_gelu if self.cnet_gelu else (lambda z: z)
    h = gelu(self.norm1(x))
    x = x + (_fourier(h) if self.attn is None else self.attn(h))
    x = gelu(x)
    h = self.up(self.norm2(x))
    h = cplx.split_gelu(h) if self.act is None else self.act(h)
    return gelu(x + self.down(h))


class ComplexLM(nnx.Module):
  """Complex decoder LM: complex embedding, blocks, norm, readout.

  ``__call__`` returns real logits ``(B, T, V)`` (for any softmax
  cross-entropy: with ``readout="born"`` that softmax is the Born rule);
  `amplitudes` returns the complex Born amplitudes for
  `jaxnorm.cplx.born_cross_entropy` (CNet's loss, with its backward-only
  ``target_floor``).

  Its norms and attention see the ``tokens`` layout, are causal and
  complex-valued (the class attributes ``layout``, ``causal`` and
  ``dtype_kind``, against which it checks its parts).

  Examples:
    >>> config = ComplexLMConfig(vocab_size=16, width=8, depth=1, max_len=8)
    >>> lm = ComplexLM(config, rngs=nnx.Rngs(0))
    >>> logits = lm(jnp.zeros((2, 5), jnp.int32))  # real (B, T, V)
    >>> logits.shape, logits.dtype
    ((2, 5, 16), dtype('float32'))
  """

  layout: ClassVar[str] = "tokens"
  causal: ClassVar[bool] = True
  dtype_kind: ClassVar[str] = "complex"

  def __init__(
    self, config: ComplexLMConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    """Builds the model.

    ``dtype`` is the dtype of the returned logits (the runner's argument;
    the compute is complex64).

    Raises:
      ValueError: for a norm or attention the model cannot run (real, not
        per-token causal, batch statistics, no causal form; the message
        names the field, the value and the valid names), or a bad choice of
        another field.
    """
    c = self.config = config
    self.dtype = dtype
    who = "ComplexLM"
    _common.check_parts(
      who,
      layout=self.layout,
      causal=self.causal,
      norm=c.norm,
      attention=c.attention,
      dtype_kind=self.dtype_kind,
      extra_attentions=(FOURIER,),
    )
    nn_layers.check_remat(who, c.remat)
    if c.norm == nn_residual.NORM_FREE:
      valid = _common.valid_norms(
        self.layout, self.causal, False, dtype_kind=self.dtype_kind
      )
      raise ValueError(
        f"{who}: norm {c.norm!r}: this model has no norm-free form; choose "
        f"one of {', '.join(valid)}"
      )
    _checks.check_choice(
      who, "activation", c.activation, ("split_gelu", "modrelu")
    )
    _checks.check_choice(who, "readout", c.readout, ("born", "real"))
    _checks.check_choice(
      who, "embed_init", c.embed_init, ("gauss", "glorot", "cnet", "normal")
    )
    _checks.check_choice(
      who, "modrelu_bias", c.modrelu_bias, ("feature", "scalar")
    )
    _checks.check_choice(who, "param_init", c.param_init, _PARAM_INITS)
    if c.head_dim is not None:
      _checks.check_positive_int(who, "head_dim", c.head_dim)
    self.embed = _param.param(
      _embed_init(c.embed_init, rngs.params(), (c.vocab_size, c.width)),
      ("vocab", "embed"),
    )
    self.pos_embed = (
      _param.param(_pos_init(c, rngs), (None, "embed")) if c.pos_embed else None
    )
    self.blocks = nnx.List([ComplexBlock(c, rngs=rngs) for _ in range(c.depth)])
    self.final_norm = _norm(c, rngs)
    if c.readout == "born":
      self.head = ComplexDense(
        c.width,
        c.vocab_size,
        use_bias=False,
        rngs=rngs,
        axis_names=("embed", "vocab"),
        **_dense_inits(c, c.width),
      )
    elif c.param_init == "pct":
      init = torch_linear_init(2 * c.width)
      self.head = nnx.Linear(
        2 * c.width,
        c.vocab_size,
        kernel_init=init,
        bias_init=init,
        rngs=rngs,
      )
    else:
      self.head = nnx.Linear(2 * c.width, c.vocab_size, rngs=rngs)

  def features(self, tokens: jax.Array) -> jax.Array:
    """Final normed complex hidden states ``(B, T, D)``."""
    if tokens.ndim != 2 or tokens.shape[1] > self.config.max_len:
      raise ValueError(
        f"ComplexLM: tokens must have shape (batch, seq) with seq <= "
        f"max_len={self.config.max_len}, got tokens.shape={tokens.shape}"
      )
    x = jnp.take(self.embed[...], tokens, axis=0)
    if self.pos_embed is not None:
      x = x + self.pos_embed[None, : tokens.shape[1]].astype(x.dtype)
    step = nn_layers.rematerialize(lambda block, x: block(x), self.config.remat)
    for block in self.blocks:
      x = step(block, x)
    return self.final_norm(x)

  def amplitudes(self, tokens: jax.Array) -> jax.Array:
    """Complex Born amplitudes ``(B, T, V)`` (``readout="born"`` only)."""
    if self.config.readout != "born":
      raise ValueError(
        "ComplexLM.amplitudes: needs readout='born', got "
        f"readout={self.config.readout!r}"
      )
    return self.head(self.features(tokens))

  def __call__(self, tokens: jax.Array, *, rngs: Any = None) -> jax.Array:
    """Real logits ``(B, T, V)`` for int tokens."""
    del rngs
    if self.config.readout == "born":
      z = self.amplitudes(tokens)
      logits = jnp.log(cplx.modulus_squared(z) + 1e-15)
    else:
      logits = self.head(cplx.to_real(self.features(tokens)))
    return logits.astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class CVCNNConfig:
  """The CV-CNN of the CNN vs CV-CNN study (complex conv, BN, CReLU).

  Attributes:
    num_classes: classes.
    image_shape: ``(H, W, C)`` of the input.
    widths: complex channels per stride-2 stage.
    input: ``real`` (a real image becomes ``x + 0i``), ``pairs`` (channel
      split halves ``[Re | Im]``, so ``C`` is even), or ``complex``.
    activation: ``crelu`` (the study's) or ``cardioid``/``zrelu``.
    remat: `jaxnorm.nn.layers.REMAT_CHOICES`: runs each stage (conv,
      norm, activation) under that `jax.checkpoint` policy (complex values
      are recomputed, never saved: see `jaxnorm.nn.layers.rematerialize`).

  Examples:
    >>> config = CVCNNConfig(image_shape=(8, 8, 2), input="pairs")  # [Re | Im]
    >>> config.widths, config.activation
    ((16, 32, 64), 'crelu')
  """

  num_classes: int = 10
  image_shape: tuple[int, ...] = (28, 28, 1)
  widths: tuple[int, ...] = (16, 32, 64)
  input: str = "real"
  activation: str = "crelu"
  remat: str = "none"


class CVCNN(nnx.Module):
  """Stride-2 complex conv stages -> mean pool -> ``|z|`` -> real dense.

  Each stage: `ComplexConv` 3x3 stride 2, `ComplexBatchNorm`, activation
  (CReLU). How the study formed complex inputs from MRI is unknown; the
  ``input`` field says what this model does. Parameter counts in reals:
  `count_real_parameters`.

  Examples:
    >>> config = CVCNNConfig(num_classes=3, image_shape=(8, 8, 1), widths=(4,))
    >>> model = CVCNN(config, rngs=nnx.Rngs(0))
    >>> model(jnp.ones((2, 8, 8, 1))).shape  # real logits; training-mode BN
    (2, 3)
  """

  def __init__(
    self, config: CVCNNConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    """Builds the model.

    ``dtype`` is the dtype of the returned logits (the runner's argument;
    the compute is complex64).
    """
    c = self.config = config
    self.dtype = dtype
    who = "CVCNN"
    _checks.check_choice(who, "input", c.input, ("real", "pairs", "complex"))
    _checks.check_choice(
      who, "activation", c.activation, tuple(cplx.ACTIVATIONS)
    )
    nn_layers.check_remat(who, c.remat)
    ch = c.image_shape[-1]
    if c.input == "pairs":
      if ch % 2:
        raise ValueError(
          f"{who}: input='pairs' needs an even channel count, got "
          f"image_shape={c.image_shape}"
        )
      ch //= 2
    convs, norms = [], []
    for w in c.widths:
      convs.append(ComplexConv(ch, w, (3, 3), strides=2, rngs=rngs))
      norms.append(ComplexBatchNorm(w, rngs=rngs))
      ch = w
    self.convs, self.norms = nnx.List(convs), nnx.List(norms)
    self.head = nnx.Linear(ch, c.num_classes, rngs=rngs)

  def __call__(
    self,
    x: jax.Array,
    *,
    use_running_average: bool | None = None,
    rngs: Any = None,
  ) -> jax.Array:
    """Real logits ``(N, classes)`` for images ``(N, H, W, C)``."""
    del rngs
    c = self.config
    if c.input == "real":
      z = jax.lax.complex(
        x.astype(jnp.float32), jnp.zeros(x.shape, jnp.float32)
      )
    elif c.input == "pairs":
      z = cplx.to_complex(x)
    else:
      z = x
    act = cplx.ACTIVATIONS[c.activation]
    stage = nn_layers.rematerialize(
      lambda conv, norm, z: act(
        norm(conv(z), use_running_average=use_running_average)
      ),
      c.remat,
    )
    for conv, norm in zip(self.convs, self.norms):
      z = stage(conv, norm, z)
    pooled = jnp.mean(z, axis=tuple(range(1, z.ndim - 1)))
    return self.head(cplx.modulus(pooled)).astype(self.dtype)


def count_real_parameters(model: nnx.Module) -> int:
  """Trainable parameters in reals: a complex entry counts twice.

  Examples:
    >>> count_real_parameters(ComplexDense(2, 3, rngs=nnx.Rngs(0)))  # 9 complex
    18
  """
  return sum(
    p.size * (2 if jnp.iscomplexobj(p) else 1)
    for p in jax.tree.leaves(nnx.state(model, nnx.Param))
  )
