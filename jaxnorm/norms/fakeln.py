"""FakeLN: LayerNorm with a frozen standard deviation, and its schedule.

The training mode of LayerNorm removal by fine-tuning (Baroni et al. 2025;
spec ``norms.md`` section 10). Every LayerNorm is replaced by a FakeLN that
is an ordinary LayerNorm until its removal step and from then on divides by
a constant, so it is a linear map that folds into the next linear layer
(`jaxnorm.nn.convert.remove_fake_ln`). Three pure pieces:

* `fake_layer_norm`: LayerNorm with a given divisor (the FakeLN equation);
* `fake_ln` with `FakeLNState` / `init_fake_ln_state`: one call of a
  scheduled FakeLN (per-token std while real, the frozen running average
  once fake, its own std for position 0 until ``bos_off_at``) and the
  running-average update of a training call;
* `removal_steps` / `removal_events`: the paper's removal schedule.

The module is `jaxnorm.nn.fakeln.FakeLayerNorm`; `jaxnorm.nn.fakeln.
install_fake_ln` puts one in place of every LayerNorm of a decoder LM.

References:
  Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim, *Transformers Don't
  Need LayerNorm at Inference Time: Scaling LayerNorm Removal to GPT-2 XL
  and the Implications for Mechanistic Interpretability*, arXiv:2507.02559
  (2025).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope


@_scope.scoped
def fake_layer_norm(
  x: Float[ArrayLike, "... d"],
  scale: Float[ArrayLike, " d"] | None = None,
  bias: Float[ArrayLike, " d"] | None = None,
  *,
  std: Float[ArrayLike, "..."],
) -> Float[Array, "... d"]:
  r"""LayerNorm with a given standard deviation (FakeLN).

  .. math::
    y = \mathrm{scale} \odot \frac{x - \mathrm{mean}_d(x)}{s} + \mathrm{bias}

  The centering is kept (it is linear); ``s = std`` replaces the per-token
  :math:`\sqrt{\mathrm{var}_d(x) + \epsilon}`. With ``std`` equal to that
  value this is `jaxnorm.norms.layer_norm`; with a constant it is linear.
  Causal-safe on ``(batch, seq, d)`` for any ``std`` that is.

  Args:
    x: input ``(..., d)``, floating.
    scale: gain ``(d,)`` or ``None``.
    bias: offset ``(d,)`` or ``None``.
    std: divisor broadcastable to ``x.shape[:-1]`` (a scalar, a
      per-position ``(T,)`` vector or per-token values).

  Returns:
    Array with the shape and dtype of ``x``; computed in at least float32.

  Raises:
    TypeError: for non-floating ``x``.
    ValueError: for a parameter whose shape is not ``(d,)``, or a ``std``
      that does not broadcast to ``x.shape[:-1]``.

  Examples:
    >>> x = jnp.array([1.0, 2.0, 3.0])
    >>> print(np.asarray(norms.fake_layer_norm(x, std=2.0)).round(4))
    [-0.5  0.   0.5]
    >>> y = norms.fake_layer_norm(x, std=jnp.sqrt(2 / 3))  # the real std
    >>> print(np.asarray(y).round(4))
    [-1.2247  0.      1.2247]

  References:
    Baroni et al., *Transformers Don't Need LayerNorm at Inference Time*,
    arXiv:2507.02559 (2025).
  """
  who = "fake_layer_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  d = x.shape[-1]
  for name, p in (("scale", scale), ("bias", bias)):
    if p is not None:
      _checks.check_floating(who, name, p)
      _checks.check_shape(who, name, p, (d,))
  std = jnp.asarray(std)
  try:
    ok = np.broadcast_shapes(std.shape, x.shape[:-1]) == x.shape[:-1]
  except ValueError:
    ok = False
  if not ok:
    raise ValueError(
      f"{who}: std must broadcast to x.shape[:-1]="
      f"{x.shape[:-1]}, got {std.shape=}"
    )
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
  s = jnp.broadcast_to(std.astype(cdt), x.shape[:-1])[..., None]
  return _numerics.affine(xc / s, scale, bias).astype(x.dtype)


class FakeLNState(NamedTuple):
  """State of `fake_ln`: frozen stds, counters and the schedule.

  Attributes:
    std: bias-corrected running average of the shared std, float32 scalar.
    bos_std: the same for position 0, float32 scalar.
    count: updates of the averages so far, int32 scalar.
    step: training calls so far, int32 scalar.
    remove_at: the step from which the norm is fake, int32 scalar.
    bos_off_at: the step from which position 0 uses ``std`` (0: never its
      own), int32 scalar.
  """

  std: jax.Array
  bos_std: jax.Array
  count: jax.Array
  step: jax.Array
  remove_at: jax.Array
  bos_off_at: jax.Array


def _check_step(who: str, name: str, value: object) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(
      f"{who}: {name} must be a non-negative integer step, got {name}={value!r}"
    )


@_scope.scoped
def init_fake_ln_state(
  *, remove_at: int = 0, bos_off_at: int = 0
) -> FakeLNState:
  """`fake_ln` state before training: stds 1, counters 0.

  Raises:
    ValueError: for a negative or non-integer step.

  Examples:
    >>> state = norms.init_fake_ln_state(remove_at=100)
    >>> print(state.std, state.step, state.remove_at)
    1.0 0 100
  """
  who = "init_fake_ln_state"
  _check_step(who, "remove_at", remove_at)
  _check_step(who, "bos_off_at", bos_off_at)
  return FakeLNState(
    std=jnp.ones((), jnp.float32),
    bos_std=jnp.ones((), jnp.float32),
    count=jnp.zeros((), jnp.int32),
    step=jnp.zeros((), jnp.int32),
    remove_at=jnp.asarray(remove_at, jnp.int32),
    bos_off_at=jnp.asarray(bos_off_at, jnp.int32),
  )


def _record(
  state: FakeLNState, tok: jax.Array, fake: jax.Array, momentum: float
) -> FakeLNState:
  """One training call's update of the bias-corrected running averages."""
  bos_on = state.step < state.bos_off_at
  if tok.shape[-1] > 1:
    shared = jnp.where(bos_on, jnp.mean(tok[..., 1:]), jnp.mean(tok))
  else:
    shared = jnp.mean(tok)
  count = state.count
  record = jnp.logical_or(jnp.logical_not(fake), count == 0)
  m = momentum
  done = 1.0 - jnp.power(m, count.astype(jnp.float32))
  total = 1.0 - jnp.power(m, (count + 1).astype(jnp.float32))

  def update(old, batch):
    return jnp.where(record, (m * old * done + (1.0 - m) * batch) / total, old)

  return state._replace(
    std=update(state.std, shared),
    bos_std=update(state.bos_std, jnp.mean(tok[..., 0])),
    count=count + record.astype(jnp.int32),
    step=state.step + 1,
  )


@_scope.scoped
def fake_ln(
  x: Float[ArrayLike, "... t d"],
  scale: Float[ArrayLike, " d"] | None,
  bias: Float[ArrayLike, " d"] | None,
  state: FakeLNState,
  *,
  eps: float = 1e-6,
  momentum: float = 0.9,
  training: bool = True,
) -> tuple[Float[Array, "... t d"], FakeLNState]:
  r"""One call of a scheduled FakeLN: real LayerNorm, then a frozen std.

  With :math:`n` = ``state.step`` (the call's step, before the increment),
  per-token std :math:`\sigma_t = \sqrt{\mathrm{var}_d(x_t) + \epsilon}`
  and ``y = fake_layer_norm(x, scale, bias, std=s)``:

  .. math::
    s_t = \begin{cases}
      \sigma_t & n < \mathrm{remove\_at} \quad\text{(real)} \\
      \hat s_0 & n \ge \mathrm{remove\_at},\ t = 0,
        \ n < \mathrm{bos\_off\_at} \\
      \hat s & \text{otherwise (fake)}
    \end{cases}

  A training call that records (every call while real, and the first call
  if there was none before) updates the running averages
  :math:`\hat s` (``state.std``) and :math:`\hat s_0` (``state.bos_std``)
  with the batch means :math:`b` of :math:`\sigma` (without gradient; for
  :math:`\hat s` over every token, excluding position 0 while
  :math:`n < \mathrm{bos\_off\_at}` and ``T > 1``; for :math:`\hat s_0` over
  position 0). After :math:`k` updates with batch means
  :math:`b_1, \dots, b_k` and momentum :math:`m`:

  .. math::
    \hat s = \frac{(1 - m) \sum_{j=1}^{k} m^{k-j} b_j}{1 - m^k},

  computed as :math:`\hat s \leftarrow (m (1 - m^{k-1}) \hat s + (1 - m) b)
  / (1 - m^k)`. A call that is fake uses the averages after its own update.
  Every training call increments ``step``; an empty ``x`` (a static fact)
  leaves the state unchanged. ``training=False`` only reads the state.

  Deviation: the spec's running estimate
  :math:`s \leftarrow m s + (1 - m) b` is bias-corrected here (Adam-style),
  so the frozen value does not depend on an initial guess; and the frozen
  std is always this running estimate (the repo's "recompute std on real"
  path), never the repo's default precomputed dataset-average std
  (``gpt2*_std_dicts.json``). There is no special std for EOT tokens
  (byte-level corpora have none). ``eps`` is the replaced LayerNorm's
  (the repo's LN uses 1e-5; jaxnorm's default is 1e-6).

  Unverified: that the repo's shared average leaves out position 0 while
  position 0 has its own std (here it does), and the default momentum
  (the spec reports 0.9 in the config and 0.1 as the class default; this
  ``momentum`` weights the old value, so 0.9 is the config's).

  Causality on ``(batch, seq, d)``: causal-safe, except a call that is fake
  and records in the same call (the first training call with
  ``remove_at=0``), whose frozen std is that batch's average over every
  position.

  Args:
    x: input ``(..., T, d)``, positions on axis -2, floating.
    scale: gain ``(d,)`` or ``None``.
    bias: offset ``(d,)`` or ``None``.
    state: `FakeLNState` (`init_fake_ln_state`).
    eps: added to the variance of the per-token std.
    momentum: running-average momentum :math:`m` in ``[0, 1)``.
    training: update the state.

  Returns:
    ``(y, new_state)``; ``y`` has the shape and dtype of ``x`` (computed in
    at least float32), the state keeps its dtypes.

  Raises:
    TypeError: for non-floating ``x`` or parameters, or a state that is not
      a `FakeLNState`.
    ValueError: for rank < 2, a parameter of shape other than ``(d,)``, a
      non-scalar state field, or ``momentum`` outside ``[0, 1)``.

  Examples:
    >>> x = jnp.array([[[1.0, 3.0], [0.0, 4.0]]])  # (batch, t, d), stds 1, 2
    >>> state = norms.init_fake_ln_state(remove_at=1)
    >>> y, state = norms.fake_ln(x, None, None, state, eps=0.0)  # real
    >>> y, state = norms.fake_ln(x, None, None, state, eps=0.0)  # std 1.5
    >>> print(np.asarray(y[0]).round(4), state.step)
    [[-0.6667  0.6667]
     [-1.3333  1.3333]] 2

  References:
    Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim, *Transformers
    Don't Need LayerNorm at Inference Time: Scaling LayerNorm Removal to
    GPT-2 XL and the Implications for Mechanistic Interpretability*,
    arXiv:2507.02559 (2025).
  """
  who = "fake_ln"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=2)
  x = jnp.asarray(x)
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  _numerics.check_state(
    who, state, FakeLNState, {name: () for name in FakeLNState._fields}
  )
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"{who}: momentum must be in [0, 1), got {momentum=}")
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
  tok = jnp.sqrt(jnp.mean(jnp.square(xc), axis=-1) + eps)  # (..., T)
  fake = state.step >= state.remove_at
  bos_on = state.step < state.bos_off_at
  if training and x.size:
    t = jax.lax.stop_gradient(tok).astype(jnp.float32)
    state = _record(state, t, fake, momentum)
  first = jnp.arange(x.shape[-2]) == 0
  frozen = jnp.where(
    jnp.logical_and(bos_on, first), state.bos_std, state.std
  ).astype(cdt)
  std = jnp.where(fake, jnp.broadcast_to(frozen, tok.shape), tok)
  return fake_layer_norm(x, scale, bias, std=std), state


def removal_steps(
  num_layers: int, *, start: int = 20, gap: int = 1
) -> dict[tuple[str, int | None], int]:
  r"""The LayerNorm removal schedule of Baroni et al. (``gpt2_standard``).

  Events fire at the start of the given (0-based) optimizer step, for
  ``n = num_layers`` and layer ``i``:

  =============  ==========================================
  event          step (``gap=1``)
  =============  ==========================================
  ``ln_2`` i     ``start + 2i`` (MLP input)
  ``ln_1qk`` i   ``start + 2n + 2i`` (attention Q/K path)
  ``ln_1v`` i    ``start + 4n + 3i`` (attention V path)
  ``ln_f``       ``start + 7n``
  ``eot_off``    ``start + 7n + 2`` (special EOT std off)
  ``bos_off``    ``start + 7n + 12`` (special position-0 std off)
  =============  ==========================================

  With 12 layers: ``ln_2`` 20-42, ``ln_1qk`` 44-66, ``ln_1v`` 68-101,
  ``ln_f`` 104, EOT 106, BOS 116 (of 300 steps). ``gap`` stretches every
  offset from ``start`` (small models may want more steps per event).

  Args:
    num_layers: number of Transformer layers ``n``.
    start: steps of fine-tuning with every norm real.
    gap: integer multiplier of all offsets after ``start``.

  Returns:
    ``{(event, layer): step}`` with ``layer=None`` for ``ln_f``, ``eot_off``
    and ``bos_off``.

  Raises:
    ValueError: for a non-positive ``num_layers`` or ``gap``, or a negative
      ``start``.
  """
  who = "removal_steps"
  _checks.check_positive_int(who, "num_layers", num_layers)
  _checks.check_positive_int(who, "gap", gap)
  if isinstance(start, bool) or not isinstance(start, int) or start < 0:
    raise ValueError(
      f"{who}: start must be a non-negative integer, got {start=}"
    )
  n = num_layers
  out: dict[tuple[str, int | None], int] = {}
  for i in range(n):
    out[("ln_2", i)] = start + gap * 2 * i
    out[("ln_1qk", i)] = start + gap * (2 * n + 2 * i)
    out[("ln_1v", i)] = start + gap * (4 * n + 3 * i)
  out[("ln_f", None)] = start + gap * 7 * n
  out[("eot_off", None)] = start + gap * (7 * n + 2)
  out[("bos_off", None)] = start + gap * (7 * n + 12)
  return out


def removal_events(
  step: int, num_layers: int, *, start: int = 20, gap: int = 1
) -> frozenset[tuple[str, int | None]]:
  """The events of `removal_steps` that fire at the start of ``step``."""
  return frozenset(
    k
    for k, v in removal_steps(num_layers, start=start, gap=gap).items()
    if v == step
  )
