"""Residual wiring as pure functions: where the norm sits around a sublayer.

A block is written once as a sublayer ``f`` (attention, MLP) and a norm
``norm``; these functions decide how the residual stream ``x`` flows around
them. They take callables, so they compose with plain functions as well as
with nnx modules (call them inside a module's ``__call__``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from jaxnorm import norms

ArrayFn = Callable[[jax.Array], jax.Array]


def _scaled(norm: ArrayFn, layer_index: int | None) -> ArrayFn:
  if layer_index is None:
    return norm
  factor = norms.layer_norm_scaling(layer_index)
  return lambda h: norm(h) * factor


def pre_norm(x: jax.Array, sublayer: ArrayFn, norm: ArrayFn, *,
             layer_index: int | None = None) -> jax.Array:
  r"""Pre-norm residual step :math:`x + f(\mathrm{norm}(x))`.

  With ``layer_index`` (0-based) the norm output is multiplied by the
  LayerNorm Scaling factor :math:`1/\sqrt{\ell}`, ``ell = layer_index + 1``
  (see `jaxnorm.norms.layer_norm_scaling`), giving
  :math:`x + f(\mathrm{norm}(x)/\sqrt{\ell})`.

  Args:
    x: residual stream.
    sublayer: the branch ``f``.
    norm: the normalization applied to the branch input.
    layer_index: 0-based block index enabling LayerNorm Scaling; ``None``
      (default) is the plain pre-norm block.

  Returns:
    The updated stream, shaped like ``x``.

  References:
    Xiong et al., *On Layer Normalization in the Transformer Architecture*,
    arXiv:2002.04745 (2020); Sun et al., *The Curse of Depth in Large
    Language Models*, arXiv:2502.05795 (2025).
  """
  return x + sublayer(_scaled(norm, layer_index)(x))


def post_norm(x: jax.Array, sublayer: ArrayFn, norm: ArrayFn) -> jax.Array:
  r"""Post-norm residual step :math:`\mathrm{norm}(x + f(x))`.

  The original Transformer wiring.

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017).
  """
  return norm(x + sublayer(x))


def sandwich_norm(x: jax.Array, sublayer: ArrayFn, norm_in: ArrayFn,
                  norm_out: ArrayFn, *, layer_index: int | None = None
                  ) -> jax.Array:
  r"""Sandwich residual step.

  .. math:: x + \mathrm{norm_{out}}(f(\mathrm{norm_{in}}(x)))

  ``layer_index`` applies LayerNorm Scaling to the input norm as in
  `pre_norm`.

  References:
    Ding et al., *CogView: Mastering Text-to-Image Generation via
    Transformers*, arXiv:2105.13290 (2021).
  """
  return x + norm_out(sublayer(_scaled(norm_in, layer_index)(x)))
