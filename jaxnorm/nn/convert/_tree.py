"""The parameter tree of a decoder LM, as the conversions read and write it.

Shared by every conversion of `jaxnorm.nn.convert`: `lm_params` and
`load_lm` (an nnx model to and from its pure tree), the checks of a
convertible config, the canonical per-layer view (`split` / `join`), and the
folding of each norm's gain, offset and divisor into the linear maps that
read its output (`fold_view`), which `untie_embeddings` makes possible for a
tied head. Leaves may be `jax.Array` or NumPy arrays; namespace and dtype are
kept.

Conventions: dense kernels are ``(in, out)``; attention ``q/k/v_kernel`` are
``(D, N, H)`` and ``out_kernel`` ``(N, H, D)``; the stream axis ``D`` is the
input axis of readers and the output axis of writers.

Examples:
  >>> LN_DEFAULTS  # the LayerNorm options a conversion reads, by default
  {'eps': 1e-06, 'use_scale': True, 'use_bias': True, 'scale_offset': 0.0}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.nn import models

Params = dict[str, Any]

# Attention variants whose only stream readers are q/k/v (plus parameters
# that do not touch the stream, such as sink logits).
SUPPORTED_ATTENTIONS: tuple[str, ...] = ("softmax", "off_by_one", "sink")
LN_KWARGS = ("eps", "use_scale", "use_bias", "scale_offset")
RMS_KWARGS = ("eps", "use_scale", "scale_offset")
LN_DEFAULTS = {
  "eps": 1e-6,
  "use_scale": True,
  "use_bias": True,
  "scale_offset": 0.0,
}
RMS_DEFAULTS = {
  "eps": 1e-6,
  "use_scale": True,
  "scale_offset": 0.0,
  "eps_mode": "inside",
}


# ---------------------------------------------------------------------------
# Loading and array namespaces.


def lm_params(model: models.DecoderLM) -> Params:
  """The pure parameter (and state) tree of a `DecoderLM`.

  Examples:
    >>> model = models.DecoderLM(models.LMConfig(
    ...     vocab_size=16, width=8, depth=1, num_heads=2, norm="layernorm",
    ...     tie_embeddings=False), rngs=nnx.Rngs(0))
    >>> params = lm_params(model)
    >>> sorted(params), params["embed"].shape
    (['embed', 'final_norm', 'head', 'net', 'pos'], (16, 8))
  """
  return nnx.to_pure_dict(nnx.state(model))


def load_lm(
  config: models.LMConfig, params: Params, *, dtype: Any = jnp.float32
) -> models.DecoderLM:
  """Builds ``DecoderLM(config)`` holding ``params``.

  Leaves are cast to the dtypes of the freshly built model (float32 for
  parameters), so NumPy float64 trees load too.

  Raises:
    ValueError: if the tree's paths or shapes differ from the model's.

  Examples:
    >>> model = models.DecoderLM(models.LMConfig(
    ...     vocab_size=16, width=8, depth=1, num_heads=2, norm="layernorm",
    ...     tie_embeddings=False), rngs=nnx.Rngs(0))
    >>> import jax
    >>> params = jax.tree.map(np.asarray, lm_params(model))  # NumPy leaves
    >>> copy = load_lm(model.config, params)
    >>> tokens = jnp.array([[1, 2, 3]], jnp.int32)
    >>> bool((copy(tokens) == model(tokens)).all())
    True
  """
  model = models.DecoderLM(config, dtype=dtype, rngs=nnx.Rngs(0))
  ref = lm_params(model)
  ref_paths = dict(_flatten(ref))
  got_paths = dict(_flatten(params))
  if ref_paths.keys() != got_paths.keys():
    missing = sorted(set(ref_paths) - set(got_paths))
    extra = sorted(set(got_paths) - set(ref_paths))
    raise ValueError(
      f"load_lm: params do not match the model of {config=}; "
      f"missing {missing}, unexpected {extra}"
    )
  for path, r in ref_paths.items():
    if tuple(np.shape(got_paths[path])) != tuple(r.shape):
      raise ValueError(
        f"load_lm: {path} must have shape {r.shape} for this "
        f"config, got {np.shape(got_paths[path])}"
      )
  # Copies: the model owns its buffers (a trainer may donate them).
  cast = _unflatten(
    {
      p: jnp.array(got_paths[p], r.dtype, copy=True)
      for p, r in ref_paths.items()
    }
  )
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, cast)
  nnx.update(model, state)
  return model


def _flatten(tree: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
  if isinstance(tree, Mapping):
    out = []
    for k in tree:
      out.extend(_flatten(tree[k], prefix + (k,)))
    return out
  return [(prefix, tree)]


def _unflatten(flat: Mapping[tuple, Any]) -> dict:
  out: dict = {}
  for path, v in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return out


def _xp(x: Any):
  return np if isinstance(x, np.ndarray) else jnp


def _zeros_like_row(w: Any, shape: tuple[int, ...]) -> Any:
  return _xp(w).zeros(shape, w.dtype)


def center(w: Any, axis: int = -1) -> Any:
  return w - _xp(w).mean(w, axis=axis, keepdims=True)


# ---------------------------------------------------------------------------
# Checks and the canonical per-layer view of the tree.


def norm_kwargs(
  who: str,
  config: models.LMConfig,
  allowed: tuple[str, ...],
  defaults: Mapping[str, Any],
) -> dict[str, Any]:
  kw = dict(config.norm_kwargs)
  unknown = sorted(set(kw) - set(allowed) - {"scale_init", "bias_init"})
  if unknown:
    raise ValueError(
      f"{who}: norm_kwargs {unknown} are not supported by the "
      f"conversion; supported keys are {', '.join(allowed)}"
    )
  return {**defaults, **{k: v for k, v in kw.items() if k in allowed}}


def check_lm(who: str, config: Any, norms: tuple[str, ...]) -> None:
  if not isinstance(config, models.LMConfig):
    raise ValueError(
      f"{who}: config must be a jaxnorm.nn.models.LMConfig, "
      f"got {type(config).__name__}"
    )
  if config.residual != "prenorm":
    raise ValueError(
      f"{who}: only pre-norm models (residual='prenorm') "
      f"convert exactly, got residual={config.residual!r}"
    )
  if config.norm not in norms:
    raise ValueError(
      f"{who}: the model's norm must be one of "
      f"{', '.join(norms)}, got norm={config.norm!r}"
    )
  if config.attention not in SUPPORTED_ATTENTIONS:
    raise ValueError(
      f"{who}: attention={config.attention!r} reads the "
      f"stream through maps this conversion does not know; "
      f"supported: {', '.join(SUPPORTED_ATTENTIONS)}"
    )


def check_untied(who: str, config: models.LMConfig) -> None:
  if config.tie_embeddings:
    raise ValueError(
      f"{who}: the model ties its head to the embedding; the folded head "
      f"diag(scale) E^T and the centered embedding differ, so untie first: "
      f"params, config = jaxnorm.nn.convert.untie_embeddings(params, config)"
    )


def dims(config: models.LMConfig) -> tuple[int, int]:
  head_dim = config.head_dim or config.width // config.num_heads
  hidden = config.mlp_hidden or config.mlp_ratio * config.width
  return head_dim, hidden


def split(params: Params, config: models.LMConfig) -> dict[str, Any]:
  """Canonical view: embed, pos, layers [(norm1, attn, norm2, mlp)], ..."""
  net = params["net"]
  wrapped = config.zero_mean_writers

  def block(i):
    b = net["blocks"][i]
    return dict(b["sublayer"] if wrapped else b)

  def norm(tree):
    return dict(tree) if tree is not None else {}

  steps = net.get("steps", {})
  layers = [
    (
      norm(steps.get(2 * i, {}).get("norm")),
      block(2 * i),
      norm(steps.get(2 * i + 1, {}).get("norm")),
      block(2 * i + 1),
    )
    for i in range(config.depth)
  ]
  return {
    "embed": params["embed"],
    "pos": params.get("pos"),
    "layers": layers,
    "final": norm(params.get("final_norm")),
    "head": None if "head" not in params else dict(params["head"]),
  }


def join(view: dict[str, Any], config: models.LMConfig) -> Params:
  """Inverse of `split` for the structure ``config`` builds."""
  blocks, steps = {}, {}
  for i, (n1, attn, n2, mlp) in enumerate(view["layers"]):
    for j, (n, b) in enumerate(((n1, attn), (n2, mlp))):
      blocks[2 * i + j] = {"sublayer": b} if config.zero_mean_writers else b
      if config.norm != "none":
        steps[2 * i + j] = {"norm": n}
  out: Params = {"embed": view["embed"]}
  if view["pos"] is not None:
    out["pos"] = view["pos"]
  out["net"] = {"blocks": blocks}
  if config.norm != "none":
    out["net"]["steps"] = steps
    out["final_norm"] = view["final"]
  if not config.tie_embeddings:
    out["head"] = view["head"]
  return out


def _gamma_beta(
  norm: Mapping[str, Any], kw: Mapping[str, Any], d: int, like: Any
) -> tuple[Any, Any]:
  xp = _xp(like)
  offset = float(kw.get("scale_offset", 0.0))
  if kw.get("use_scale", True) and "scale" in norm:
    gamma = norm["scale"] + offset
  else:
    gamma = xp.full((d,), 1.0 + offset, like.dtype)
  beta = norm["bias"] if "bias" in norm else xp.zeros((d,), like.dtype)
  return gamma, beta


def with_biases(
  view: dict[str, Any], config: models.LMConfig
) -> dict[str, Any]:
  """Adds zero biases to every linear map (for ``use_bias=True``)."""
  head_dim, _ = dims(config)
  d, n = config.width, config.num_heads
  e = view["embed"]
  layers = []
  for n1, attn, n2, mlp in view["layers"]:
    attn = dict(attn)
    for name in ("q", "k", "v"):
      attn.setdefault(f"{name}_bias", _zeros_like_row(e, (n, head_dim)))
    attn.setdefault("out_bias", _zeros_like_row(e, (d,)))
    mlp = dict(mlp)
    up, down = dict(mlp["up"]), dict(mlp["down"])
    up.setdefault("bias", _zeros_like_row(e, (up["kernel"].shape[1],)))
    down.setdefault("bias", _zeros_like_row(e, (d,)))
    mlp["up"], mlp["down"] = up, down
    layers.append((n1, attn, n2, mlp))
  head = view["head"]
  if head is not None:
    head = dict(head)
    head.setdefault("bias", _zeros_like_row(e, (config.vocab_size,)))
  return {**view, "layers": layers, "head": head}


def _fold_reader(
  kernel: Any, bias: Any, scale: Any, shift: Any, center_input: bool = False
) -> tuple[Any, Any]:
  """``(shift + c(x) * scale) W + b`` as ``x W' + b'`` (input axis 0)."""
  xp = _xp(kernel)
  expand = scale.reshape((-1,) + (1,) * (kernel.ndim - 1))
  new_bias = bias + xp.tensordot(shift, kernel, axes=1)
  new_kernel = expand * kernel
  if center_input:
    new_kernel = center(new_kernel, axis=0)
  return new_kernel, new_bias


def untie_embeddings(
  params: Params, config: models.LMConfig
) -> tuple[Params, models.LMConfig]:
  """Gives a tied model its own head ``kernel = embed.T`` (same function).

  The head bias (with ``use_bias``) starts at zero.

  Returns:
    ``(params, config)`` with ``tie_embeddings=False``; unchanged copies if
    the model is already untied.

  Examples:
    >>> model = models.DecoderLM(models.LMConfig(
    ...     vocab_size=16, width=8, depth=1, num_heads=2), rngs=nnx.Rngs(0))
    >>> params, config = untie_embeddings(lm_params(model), model.config)
    >>> config.tie_embeddings, params["head"]["kernel"].shape  # embed.T
    (False, (8, 16))
  """
  if not config.tie_embeddings:
    return dict(params), config
  e = params["embed"]
  head = {"kernel": e.T}
  if config.use_bias:
    head["bias"] = _zeros_like_row(e, (config.vocab_size,))
  out = dict(params)
  out["head"] = head
  return out, dataclasses.replace(config, tie_embeddings=False)


def fold_view(
  view: dict[str, Any],
  config: models.LMConfig,
  kw: Mapping[str, Any],
  *,
  center_input: bool,
  std: Any = None,
) -> dict[str, Any]:
  """Folds each norm's (gamma/std, beta) into its readers.

  ``std`` maps a norm's id to its divisor (FakeLN export); readers of a
  centered input also get ``center_input``. Norm dicts become empty.
  """
  d = config.width
  e = view["embed"]

  def gb(norm, key):
    g, b = _gamma_beta(norm, kw, d, e)
    if std is not None:
      g = g / std[key]
    return g, b

  def fold(tree, names, g, b):
    tree = dict(tree)
    for name in names:
      kname, bname = (
        (f"{name}_kernel", f"{name}_bias") if name else ("kernel", "bias")
      )
      # Callers add zero biases (`with_biases`) whenever a norm has an
      # offset, so a reader without a bias only ever absorbs b = 0.
      bias = tree.get(bname)
      k, bb = _fold_reader(
        tree[kname],
        _zeros_like_row(e, tree[kname].shape[1:]) if bias is None else bias,
        g,
        b,
        center_input,
      )
      tree[kname] = k
      if bias is not None:
        tree[bname] = bb
    return tree

  layers = []
  for i, (n1, attn, n2, mlp) in enumerate(view["layers"]):
    g1, b1 = gb(n1, ("steps", 2 * i))
    g2, b2 = gb(n2, ("steps", 2 * i + 1))
    attn = fold(attn, ("q", "k", "v"), g1, b1)
    mlp = dict(mlp)
    mlp["up"] = fold(mlp["up"], ("",), g2, b2)
    layers.append(({}, attn, {}, mlp))
  gf, bf = gb(view["final"], ("final_norm",))
  head = fold(view["head"], ("",), gf, bf)
  return {**view, "layers": layers, "final": {}, "head": head}
