"""Optimizers for complex parameters: the conjugation and a complex Adam.

JAX's gradient of a real loss ``L(z)``, ``z = x + iy``, is
``g = dL/dx - i dL/dy = conj(2 dL/dz̄)``. The steepest-descent step is
``z <- z - lr conj(g)``; optax never conjugates, so stepping along raw ``g``
moves every imaginary part uphill. `conjugate_complex` fixes the direction
first; `complex_adam` chains it with Adam, either on ``(Re, Im)`` as two
independent reals (CNet's "true Adam", second moment per component) or with
optax's single ``|g|^2`` second moment per complex entry.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike, DTypeLike

from jaxnorm import _checks
from jaxnorm.optim import _common

SecondMoment = Literal["per_component", "modulus"]
SECOND_MOMENTS: tuple[str, ...] = ("per_component", "modulus")


@_common.scoped_transform
def conjugate_complex() -> optax.GradientTransformation:
  """Conjugates every complex leaf of the updates; real leaves pass.

  Put it first in a chain on ``jax.grad`` output: the result is the steepest
  ascent direction ``2 dL/dz̄`` of each complex parameter (descent is its
  negative, which the learning-rate step applies), so every optax transform
  after it can treat it as an ordinary gradient. Stateless.

  Returns:
    An `optax.GradientTransformation`.

  Examples:
    >>> tx = optim.conjugate_complex()
    >>> g = {"b": jnp.array([2.0]), "z": jnp.array([1.0 + 2.0j], jnp.complex64)}
    >>> u, state = tx.update(g, tx.init(g))
    >>> print(np.asarray(u["z"]).tolist(), np.asarray(u["b"], float).tolist())
    [(1-2j)] [2.0]

  References:
    Kreutz-Delgado, *The Complex Gradient Operator and the CR-Calculus*,
    arXiv:0906.4835 (2009); JAX autodiff cookbook, "Complex numbers and
    differentiation".
  """

  def conj(u: Any) -> Any:
    return jnp.conj(u) if jnp.iscomplexobj(u) else u

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(conj, updates), state

  return optax.GradientTransformation(
    lambda params: optax.EmptyState(), update_fn
  )


class ScaleByComplexAdamState(NamedTuple):
  """State of the per-component complex Adam.

  Attributes:
    count: steps taken, int32 scalar.
    mu: first moments; a complex leaf packs the moments of its real and
      imaginary parts as ``mu_re + i mu_im``.
    nu: second moments, packed the same way (``nu_re + i nu_im``, each a
      mean of squares).
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def _per_component_adam(b1, b2, eps, mu_dtype) -> optax.GradientTransformation:
  """Adam on ``(Re, Im)`` as independent reals, moments packed complex.

  The per-component formulas are optax's (`optax.tree.update_moment`,
  ``optax.tree.update_moment_per_elem_norm``, ``optax.tree.bias_correction``)
  applied to the pair ``(Re, Im)`` of each leaf, so the updates equal
  ``optax.adam`` on the explicit ``(Re, Im)`` tree (bit for bit for a
  complex leaf against its two-leaf tree; XLA may round the division of
  differently fused trees 1 ulp apart); unlike
  ``optax.contrib.split_real_and_imaginary``, the state keeps the
  parameters' tree structure (nnx states included).
  """

  def parts(t):
    return (jnp.real(t), jnp.imag(t)) if jnp.iscomplexobj(t) else (t,)

  def pack(like, ps):
    return jax.lax.complex(*ps) if jnp.iscomplexobj(like) else ps[0]

  def init_fn(params):
    def zeros(p, dtype=None):
      return jnp.zeros_like(p, dtype=None if jnp.iscomplexobj(p) else dtype)

    return ScaleByComplexAdamState(
      count=jnp.zeros([], jnp.int32),
      mu=jax.tree.map(lambda p: zeros(p, mu_dtype), params),
      nu=jax.tree.map(zeros, params),
    )

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)

    def leaf(g, m, v):
      gs = parts(g)
      ms = optax.tree.update_moment(gs, parts(m), b1, 1)
      vs = optax.tree.update_moment_per_elem_norm(gs, parts(v), b2, 2)
      m_hat = optax.tree.bias_correction(ms, b1, count)
      v_hat = optax.tree.bias_correction(vs, b2, count)
      us = jax.tree.map(lambda a, b: a / (jnp.sqrt(b) + eps), m_hat, v_hat)
      return pack(g, us), pack(g, ms), pack(g, vs)

    out = jax.tree.map(leaf, updates, state.mu, state.nu)
    treedef = jax.tree.structure(updates)
    u, m, v = (
      jax.tree.unflatten(treedef, [t[i] for t in treedef.flatten_up_to(out)])
      for i in range(3)
    )
    return u, ScaleByComplexAdamState(count=count, mu=m, nu=v)

  return optax.GradientTransformation(init_fn, update_fn)


@_common.scoped_transform
def scale_by_complex_adam(
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  *,
  second_moment: SecondMoment = "per_component",
  mu_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
  r"""Adam scaling of (already conjugated) complex updates.

  ``second_moment="per_component"`` keeps first and second moments per
  component of each complex leaf, :math:`\hat m_r / (\sqrt{\hat v_r} +
  \epsilon) + i\,\hat m_i / (\sqrt{\hat v_i} + \epsilon)`: exactly
  ``optax.adam`` on the explicit ``(Re, Im)`` tree, and CNet's "true Adam"
  (state `ScaleByComplexAdamState`). ``"modulus"`` runs
  `optax.scale_by_adam` on the complex leaf, whose second moment is one
  :math:`|g|^2` per entry (direction-preserving in the complex plane; optax
  stores it in a complex-typed leaf with zero imaginary part). Real leaves
  get plain Adam either way.

  Deviation: CNet's CPU code corrects the bias with ``t + 1`` and ``t``
  starting at 1 (off by one); here the correction is optax's (``t`` from 1).

  Args:
    b1: first-moment decay.
    b2: second-moment decay.
    eps: added to the root of the second moment.
    second_moment: ``"per_component"`` or ``"modulus"``.
    mu_dtype: first-moment dtype of real leaves (optax's ``mu_dtype``).

  Returns:
    An `optax.GradientTransformation`.

  Raises:
    ValueError: for an unknown ``second_moment``.

  Examples:
    The first step on ``3 + 4i``: per component, the sign of each part;
    with the modulus, the direction ``(3 + 4i) / 5``:

    >>> g = {"z": jnp.array([3.0 + 4.0j], jnp.complex64)}
    >>> for mode in ("per_component", "modulus"):
    ...   tx = optim.scale_by_complex_adam(second_moment=mode)
    ...   u, state = tx.update(g, tx.init(g))
    ...   print(mode, np.asarray(u["z"], complex).round(4).tolist())
    per_component [(1+1j)]
    modulus [(0.6+0.8j)]

  References:
    Kingma & Ba, *Adam*, arXiv:1412.6980 (2015); Crasmaru, *CNet* (code,
    Adam on ``dz_star``).
  """
  _checks.check_choice(
    "scale_by_complex_adam", "second_moment", second_moment, SECOND_MOMENTS
  )
  if second_moment == "modulus":
    inner = optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype)
  else:
    inner = _per_component_adam(b1, b2, eps, mu_dtype)
  # optax's Adam computes ``b ** count`` (a Python float to an int32 power)
  # and, on complex leaves, adds a real ``|g|^2`` to its complex-typed second
  # moment: both raise under strict promotion (the library's test setting).
  return _common.standard_promotion(inner)


@_common.scoped_transform
def complex_adam(
  learning_rate: optax.ScalarOrSchedule,
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  *,
  weight_decay: ArrayLike = 0.0,
  mask: Any = None,
  second_moment: SecondMoment = "per_component",
  conjugate: bool = True,
  mu_dtype: DTypeLike | None = None,
) -> optax.GradientTransformation:
  r"""Adam(W) for complex (and real) parameters, driven by ``jax.grad``.

  The chain `conjugate_complex` -> `scale_by_complex_adam` -> decoupled
  weight decay (``optax.add_decayed_weights``, ``mask`` as
  ``optax.adamw``) -> learning rate. Weight decay pulls a complex parameter
  toward 0 (the conjugated update of :math:`\tfrac{\lambda}{2}|z|^2` is
  :math:`\lambda z`).

  ``conjugate=False`` drops the conjugation; it exists for the negative
  test and for gradients that are already conjugated (e.g. CNet's
  ``dz_star``): on raw ``jax.grad`` output it climbs the loss in every
  imaginary part.

  Args:
    learning_rate: scalar or schedule.
    b1: first-moment decay.
    b2: second-moment decay.
    eps: Adam's epsilon.
    weight_decay: decoupled weight decay.
    mask: which leaves decay (``optax.adamw``'s ``mask``).
    second_moment: ``"per_component"`` (default) or ``"modulus"``.
    conjugate: conjugate complex gradients first.
    mu_dtype: first-moment dtype.

  Returns:
    An `optax.GradientTransformation`.

  Raises:
    ValueError: for an unknown ``second_moment``.

  Examples:
    One step on :math:`|z|^2` from ``z = 1 + i`` moves both parts toward 0
    (without the conjugation the imaginary part would climb to 1.1):

    >>> import optax
    >>> z = {"z": jnp.array([1.0 + 1.0j], jnp.complex64)}
    >>> grads = jax.grad(lambda p: jnp.sum(jnp.abs(p["z"]) ** 2))(z)
    >>> opt = optim.complex_adam(learning_rate=0.1)
    >>> u, state = opt.update(grads, opt.init(z), z)
    >>> new = optax.apply_updates(z, u)["z"]
    >>> print(np.asarray(new, complex).round(4).tolist())
    [(0.9+0.9j)]

  References:
    Kingma & Ba, arXiv:1412.6980 (2015); Loshchilov & Hutter, *Decoupled
    Weight Decay Regularization*, arXiv:1711.05101 (2019).
  """
  parts = [conjugate_complex()] if conjugate else []
  parts += [
    scale_by_complex_adam(
      b1, b2, eps, second_moment=second_moment, mu_dtype=mu_dtype
    ),
    optax.add_decayed_weights(weight_decay, mask),
    optax.scale_by_learning_rate(learning_rate),
  ]
  # Hyperparameters injected as float32 arrays meet complex leaves in the
  # decay and learning-rate steps: also standard promotion.
  return _common.standard_promotion(optax.chain(*parts))
