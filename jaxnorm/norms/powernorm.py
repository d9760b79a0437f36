"""PowerNorm: batch normalization by a running quadratic mean.

PowerNorm and Unified Normalization keep running statistics in the forward
pass and have approximate backward passes with state of their own. A
`jax.custom_vjp` cannot mutate state, so the state its backward pass updates
(the gradient statistics) is an explicit input of the function, and the
backward pass returns the *increment* of that state (``new - old``) as its
cotangent. A train step differentiates with respect to these state fields
too, removes them from the gradient tree before the optimizer, and adds them
to the state. Under gradient accumulation the increments of the micro-steps
are summed and applied once.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer


class PowerNormState(NamedTuple):
  r"""State of `power_norm`.

  Attributes:
    count: training steps taken, int32 scalar (``t`` after the update).
    running_phi: running quadratic mean :math:`\Phi`, ``(C,)``, init 1.
    grad_ema: backward statistic :math:`\nu`, ``(C,)``, init 0; updated
      only through the backward pass (its cotangent is the increment).
  """

  count: jax.Array
  running_phi: jax.Array
  grad_ema: jax.Array


@_scope.scoped
def init_power_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> PowerNormState:
  """`power_norm` state at initialization: ``t=0, Phi=1, nu=0``.

  Examples:
    >>> state = norms.init_power_norm_state(2)
    >>> print(state.count, state.running_phi, state.grad_ema)
    0 [1. 1.] [0. 0.]
  """
  _checks.check_positive_int(
    "init_power_norm_state", "num_features", num_features
  )
  return PowerNormState(
    count=jnp.zeros((), jnp.int32),
    running_phi=jnp.ones((num_features,), dtype),
    grad_ema=jnp.zeros((num_features,), dtype),
  )


BackwardStatSource = Literal["batch", "running"]
r"""Which statistic the approximate backward of `power_norm` divides by.

``"batch"``: the batch quadratic mean :math:`\psi^2_B` (the official code);
``"running"``: the pre-update running :math:`\Phi` (the paper's recalled
form). Not the `jaxnorm.nn.BackwardStat` variable, the module state that the
backward pass updates.
"""


@_scope.scoped
def power_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: PowerNormState,
  *,
  training: bool,
  pad_mask: ArrayLike | None = None,
  eps: float = 1e-5,
  alpha_fwd: float = 0.9,
  alpha_bkw: float = 0.9,
  warmup_iters: int = 10000,
  num_groups: int | None = 1,
  group_eps: float = 1e-5,
  backward_stat: BackwardStatSource = "batch",
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], PowerNormState]:
  r"""PowerNorm: batch normalization by a running quadratic mean.

  Follows the official code (``sIncerass/powernorm``, ``MaskPowerNorm``).
  Features are last; every other axis is a batch/token axis.

  0. Group scaling (differentiated normally; skipped with
     ``num_groups=None``): per token, each of ``G`` contiguous channel
     groups is divided by :math:`\sqrt{\mathrm{mean}_{group}(x^2) +
     \mathrm{group\_eps}}`. With ``G = 1`` this is an affine-free RMSNorm.
  1. :math:`\psi^2_B[c]` = mean of :math:`x^2` over non-pad positions.
  2. Training (the step counter ``t`` is incremented first):
     :math:`z = x/\sqrt{\psi^2_B + \epsilon}` while ``t <= warmup_iters``,
     else :math:`z = x/\sqrt{\Phi + \epsilon}`; then, if
     ``t < warmup_iters``, :math:`\Phi \leftarrow \Phi (t-1)/t +
     \psi^2_B/t`, and always :math:`\Phi \leftarrow \alpha_f \Phi +
     (1-\alpha_f)\psi^2_B`. Inference: :math:`z = x/\sqrt{\Phi + \epsilon}`.
  3. :math:`y = \gamma \odot z + \beta`. Pads are normalized too.

  A training batch with no positions (a static fact of the shape) returns
  an empty output and leaves the state unchanged.

  Approximate backward (training; a `jax.custom_vjp`):
  :math:`g_z = \gamma \odot g_y`,
  :math:`\tilde g = g_z - (1-\alpha_b)\,\nu \odot z`,
  :math:`\partial L/\partial x = \tilde g / \sqrt{\psi^2_B + \epsilon}` (the
  batch statistic even after warmup, as in the code), and
  :math:`\nu \leftarrow \nu + \mathrm{mean}_{all}(\tilde g \odot z)` (pads
  included). Gradients do not flow through :math:`\psi^2_B`. The increment
  of :math:`\nu` is returned as the cotangent of ``state.grad_ema``: add it
  to the state after the backward pass (see the module docstring);
  ``new_state.grad_ema`` is the unchanged input. In inference the function
  is differentiated normally.

  Unverified: the paper's Algorithm 1 could not be read; its form is
  recalled as dividing by the running statistic in backward, available as
  ``backward_stat="running"`` (the pre-update :math:`\Phi`). The group
  scaling is in the code; whether the paper has it is unverified.
  ``warmup_iters`` defaults to the class default 10000; fairseq's
  ``NormSelect`` passes ``--warmup-updates`` (default 1000).

  Causality on ``(batch, seq, d)``: training statistics mix all positions
  (not causal-safe); inference divides by the running :math:`\Phi` and the
  group scaling is per token, so inference is causal-safe.

  Args:
    x: input ``(..., c)``; fairseq's layout is ``(T, B, C)``.
    scale: :math:`\gamma`, ``(c,)`` or ``None``.
    bias: :math:`\beta`, ``(c,)`` or ``None``.
    state: `PowerNormState`.
    training: training step (statistics, state update, custom backward).
    pad_mask: boolean ``x.shape[:-1]``, True at pads (for fairseq's
      ``(B, T)`` mask and ``(T, B, C)`` input pass ``pad_mask.T``).
    eps: added to the statistics.
    alpha_fwd: :math:`\alpha_f`.
    alpha_bkw: :math:`\alpha_b`.
    warmup_iters: steps that normalize with the batch statistic.
    num_groups: groups of the group scaling; ``None`` disables it.
    group_eps: eps of the group scaling (hard-coded 1e-5 in the code).
    backward_stat: ``"batch"`` (code) or ``"running"`` (paper, unverified).
    axis_name: mapped axis name(s): :math:`\psi^2_B` and the :math:`\nu`
      increment are averaged across devices.

  Returns:
    ``(y, new_state)`` with ``y`` shaped and typed like ``x``.

  Raises:
    TypeError: for non-floating input or parameters, a non-boolean
      ``pad_mask`` or a bad state type.
    ValueError: for bad shapes, group configuration or ``backward_stat``.

  Examples:
    >>> x = jnp.array([[1.0], [-3.0]])  # psi^2 = mean(x^2) = 5
    >>> state = norms.init_power_norm_state(1)
    >>> y, state = norms.power_norm(
    ...     x, None, None, state, training=True, num_groups=None, eps=0.0)
    >>> print(np.asarray(y[:, 0]).round(4), int(state.count))
    [ 0.4472 -1.3416] 1

  References:
    Shen, Yao, Gholami, Mahoney & Keutzer, *PowerNorm: Rethinking Batch
    Normalization in Transformers*, arXiv:2003.07845 (ICML 2020).
  """
  who = "power_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(
    who, "backward_stat", backward_stat, ("batch", "running")
  )
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  c = x.shape[-1]
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  _numerics.check_state(
    who,
    state,
    PowerNormState,
    {"count": (), "running_phi": (c,), "grad_ema": (c,)},
  )
  pad_mask = _numerics.check_pad_mask(who, pad_mask, x)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  if num_groups is not None:
    groups = _numerics.resolve_groups(who, "x.shape[-1]", c, num_groups, None)
    xg = xf.reshape(*x.shape[:-1], groups, c // groups)
    xf = layer.rms_norm(xg, eps=group_eps).reshape(x.shape)
  phi = state.running_phi.astype(cdt)
  if not training or _numerics.is_empty(x, range(x.ndim - 1)):
    z = xf * jax.lax.rsqrt(_numerics.channel(phi, x.ndim, cdt) + eps)
    return _numerics.affine(z, scale, bias).astype(x.dtype), state
  gamma = _numerics.vector_or(scale, 1.0, c, cdt)
  beta = _numerics.vector_or(bias, 0.0, c, cdt)
  t = state.count + 1
  psi2 = _numerics.quadratic_mean(xf, pad_mask, axis_name)
  warm = t <= warmup_iters
  var = jnp.where(warm, psi2, phi)
  denom = psi2 if backward_stat == "batch" else phi
  y = _power_norm_core(
    xf,
    gamma,
    beta,
    state.grad_ema.astype(cdt),
    var,
    denom,
    float(eps),
    float(alpha_bkw),
    axis_name,
  )
  tf = t.astype(cdt)
  phi_c = jnp.where(t < warmup_iters, phi * (tf - 1) / tf + psi2 / tf, phi)
  new_phi = alpha_fwd * phi_c + (1 - alpha_fwd) * psi2
  new_state = PowerNormState(
    count=t.astype(state.count.dtype),
    running_phi=new_phi.astype(state.running_phi.dtype),
    grad_ema=state.grad_ema,
  )
  return y.astype(x.dtype), new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _power_norm_core(x, gamma, beta, nu, var, denom, eps, alpha_bkw, axis_name):
  return _power_norm_core_fwd(
    x, gamma, beta, nu, var, denom, eps, alpha_bkw, axis_name
  )[0]


def _power_norm_core_fwd(
  x, gamma, beta, nu, var, denom, eps, alpha_bkw, axis_name
):
  del alpha_bkw, axis_name
  z = x * jax.lax.rsqrt(_numerics.channel(var, x.ndim, x.dtype) + eps)
  return _numerics.affine(z, gamma, beta), (z, gamma, nu, denom)


def _power_norm_core_bwd(eps, alpha_bkw, axis_name, res, dy):
  z, gamma, nu, denom = res
  nd = z.ndim
  dy = dy.astype(z.dtype)
  g = dy * _numerics.channel(gamma, nd, z.dtype)
  g_tilde = g - (1 - alpha_bkw) * _numerics.channel(nu, nd, z.dtype) * z
  d_nu = _numerics.all_mean(g_tilde * z, axis_name)
  dx = g_tilde * jax.lax.rsqrt(_numerics.channel(denom, nd, z.dtype) + eps)
  reduce = tuple(range(nd - 1))
  dgamma = jnp.sum(dy * z, axis=reduce)
  dbeta = jnp.sum(dy, axis=reduce)
  return dx, dgamma, dbeta, d_nu.astype(nu.dtype), None, None


_power_norm_core.defvjp(_power_norm_core_fwd, _power_norm_core_bwd)
