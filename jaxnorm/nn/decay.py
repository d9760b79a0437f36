"""The one weight-decay policy of jaxnorm models, as an optax mask.

Every parameter is decided by `jaxnorm.nn.registry.decays`: matrices
(``ndim >= 2``: kernels, embeddings, convolutions) are decayed; vectors and
scalars (norm scales, biases, gates) are not; the spec of the registered
module that owns a parameter may override this for it by attribute name,
with its paper's rule (SeeDNorm decays ``dyn_scale`` and ``dyn_proj``). The
owners looked up are the norms of `jaxnorm.nn.NORMS`, flax's own norms
(scales and biases never decayed), the attention cores of `ATTENTIONS`
and the residual modules listed in the ``modules`` of a `RESIDUALS` spec
(HC's ``static_alpha`` and mHC's ``b_res`` are not decayed).

Examples:
  >>> from jaxnorm.nn.registry import decays
  >>> decays("kernel", 2), decays("scale", 1)  # matrices yes, vectors no
  (True, False)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from flax import nnx

from jaxnorm.nn import _param, attention, norms, registry, residual


def _registered_classes() -> Iterator[tuple[type, Mapping[str, bool]]]:
  """``(class, decay overrides)`` of the attention and residual specs.

  An attention spec names its core class; a residual spec's ``build`` is a
  function, so it lists the module classes it builds in ``modules``.
  """
  for spec in attention.ATTENTIONS.values():
    yield spec.core, spec.decay
  for spec in residual.RESIDUALS.values():
    for cls in spec.modules:
      yield cls, spec.decay


def module_decay(module: nnx.Module) -> Mapping[str, bool] | None:
  """The decay overrides of ``module``'s registered class, if any.

  Args:
    module: a module of the model.

  Returns:
    The ``decay`` mapping of the spec registering its class (or a base
    class) in `NORMS`, flax's norms, the attention or residual registry;
    ``None`` for an unregistered module.

  Examples:
    >>> from jaxnorm.nn import HyperConnection
    >>> module_decay(HyperConnection(4, layer_index=0, rngs=nnx.Rngs(0)))
    mappingproxy({'static_alpha': False})
  """
  override = norms.norm_decay(module)
  if override is not None:
    return override
  classes = dict(_registered_classes())
  for cls in type(module).__mro__:
    if cls in classes:
      return classes[cls]
  return None


def decay_mask(model: nnx.Module) -> Any:
  r"""Which parameters of ``model`` weight decay applies to.

  .. math::
    \mathrm{decay}(p) = \mathrm{override}_{\mathrm{owner}}(p)
      \ \text{if given, else}\ [\mathrm{ndim}(p) \ge 2]

  Args:
    model: the module tree.

  Returns:
    An ``nnx.State`` of Python bools with the structure of
    ``nnx.as_pure(nnx.state(model, nnx.Param))`` (True = decayed): pass it
    as ``mask=`` of ``optax.adamw`` / ``optax.add_decayed_weights``, or to
    ``optax.masked``; it fits both the variables `nnx.Optimizer` gives to
    ``init`` and the arrays it gives to ``update``.

  Examples:
    >>> from jaxnorm.nn import HyperConnection, make_attention
    >>> mha = make_attention("sink", 8, 2, qk_norm="rmsnorm", rngs=nnx.Rngs(0))
    >>> mask = nnx.to_pure_dict(decay_mask(mha))
    >>> mask["q_kernel"], mask["core"]["sinks"], mask["q_norm"]["scale"]
    (True, False, False)

    A spec's override: HC's ``static_alpha`` is 2-D but not decayed.

    >>> hc = HyperConnection(4, layer_index=0, rngs=nnx.Rngs(0))
    >>> mask = nnx.to_pure_dict(decay_mask(hc))
    >>> mask["dynamic_alpha"], mask["static_alpha"]
    (True, False)

  References:
    Loshchilov & Hutter, *Decoupled Weight Decay Regularization*,
    arXiv:1711.05101 (2019); per-parameter exceptions from each part's
    paper (see the ``decay`` field of its spec).
  """
  return nnx.from_flat_state(
    [
      (p.path, registry.decays(p.name, p.value.ndim, module_decay(p.owner)))
      for p in _param.owned_params(model)
    ]
  )
