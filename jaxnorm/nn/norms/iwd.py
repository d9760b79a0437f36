"""IWD weight-decay masks for the scale vectors of norms."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
from flax import nnx

from jaxnorm import _checks
from jaxnorm.nn import _param, registry
from jaxnorm.nn.norms._registry import norm_decay
from jaxnorm.nn.norms.scale_vectors import NORM_ROLES, NormRole

WeightDecayRule = Literal["iwd", "all", "none"]

OUTPUT_NORM_PATTERN = (
  r"(q|k|qk|query|key)_?norm|post_?\w*norm|\w*out_?norm"
  r"|\w*output_?norm"
)
"""Attribute names treated as Output-Norms when a module has no ``role``:
QK-norm (``q_norm``, ``k_norm``, ``qk_norm``, ...) and post-branch norms
(``post_norm``, ``post_attn_norm``, ``out_norm``, ...)."""

_SCALE_NAMES = re.compile(r"scale\w*")


def _norm_role(
  path: tuple[Any, ...],
  node: nnx.Module,
  roles: Mapping[str, str] | None,
  pattern: re.Pattern[str],
) -> str:
  role = getattr(node, "role", None)
  if role is not None:
    return role
  name = str(path[-1]) if path else ""
  if roles is not None and name in roles:
    return roles[name]
  return "output" if pattern.fullmatch(name) else "input"


def weight_decay_mask(
  model: nnx.Module,
  *,
  rule: WeightDecayRule = "iwd",
  roles: Mapping[str, NormRole] | None = None,
  decay_others: bool = True,
  output_pattern: str = OUTPUT_NORM_PATTERN,
) -> Callable[[Any], Any]:
  """Builds the optax weight-decay mask for the scale vectors of ``model``.

  A norm module is any module registered in `NORMS`, any of flax's own
  norms (`FLAX_NORMS`), or any module with a ``role`` attribute
  (`ScaleVectorNorm`, `DualScaledLinear`, `CLSNorm`).
  Its role is, in order: its ``role`` attribute; ``roles[name]`` for its
  attribute name; ``"output"`` if the name matches ``output_pattern``
  (QK-norms and post-branch norms); else ``"input"`` (pre-norms and, an
  unverified default, the final norm). Scale parameters of a norm (names
  ``scale*``) are decayed according to ``rule``:

  * ``"iwd"``: decay Input-Norm scales, never Output-Norm scales (the
    paper's rule: decay helps Input-Norms and hurts Output-Norms);
  * ``"all"`` / ``"none"``: decay every / no norm scale (the baselines).

  Other parameters of a norm follow the one rule of
  `jaxnorm.nn.registry.decays` with the norm's spec: biases and gates are
  not decayed, matrices are (the `DualScaledLinear` kernel, RN-L's convs),
  and SeeDNorm's ``dyn_scale`` / ``dyn_proj`` are (its paper), unless
  ``decay_others`` is False. Parameters outside norms follow
  ``decay_others``.

  Args:
    model: the module tree.
    rule: ``"iwd"``, ``"all"`` or ``"none"``.
    roles: optional role per attribute name, overriding the pattern.
    decay_others: decay of the parameters outside norm modules; it
      also gates the norms' own matrices.
    output_pattern: regular expression of Output-Norm attribute names.

  Returns:
    A function of a parameter tree (``nnx.state(model, nnx.Param)``, as
    given to optax by `nnx.Optimizer`) returning the same tree of bools
    (True = decay), for ``optax.masked`` / ``optax.add_decayed_weights``.

  Raises:
    ValueError: for a bad ``rule`` or role.

  Examples:
    >>> rngs = nnx.Rngs(0)
    >>> model = nnx.Dict(pre_norm=nnx.RMSNorm(2, rngs=rngs),
    ...                  q_norm=nnx.RMSNorm(2, rngs=rngs))  # an Output-Norm
    >>> mask = weight_decay_mask(model)(nnx.state(model, nnx.Param))
    >>> jax.tree.leaves(mask)  # pre_norm.scale decayed, q_norm.scale not
    [True, False]

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "weight_decay_mask"
  _checks.check_choice(who, "rule", rule, ("iwd", "all", "none"))
  for name, role in (roles or {}).items():
    _checks.check_choice(who, f"roles[{name!r}]", role, NORM_ROLES)
  pattern = re.compile(output_pattern)
  decisions = {}
  for p in _param.owned_params(model):
    override = norm_decay(p.owner)
    if override is None and not hasattr(p.owner, "role"):
      decisions[p.path] = decay_others
    elif _SCALE_NAMES.fullmatch(p.name):
      role = _norm_role(p.owner_path, p.owner, roles, pattern)
      decisions[p.path] = rule == "all" or (rule == "iwd" and role == "input")
    else:
      decisions[p.path] = decay_others and registry.decays(
        p.name, p.value.ndim, override
      )

  def mask_fn(params: Any) -> Any:
    def decide(key_path, _):
      keys = tuple(
        k.key if isinstance(k, jax.tree_util.DictKey) else k.idx
        for k in key_path
        if isinstance(k, (jax.tree_util.DictKey, jax.tree_util.SequenceKey))
      )
      if keys not in decisions:
        raise ValueError(
          f"{who}: parameter {keys} is not a parameter of "
          "the model the mask was built for"
        )
      return decisions[keys]

    return jax.tree.map_with_path(decide, params)

  return mask_fn
