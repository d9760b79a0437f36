"""Tests of `jaxnorm.depth_metrics` (DepthBench layer metrics).

Oracles: the spec's identities (a state against itself and its negation,
identity and input-independent blocks, exactly affine blocks), NumPy
float64 transcriptions of the official loops, and a toy residual stack run
with a block skipped, swapped or replaced by its affine fit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import depth_metrics as dm
from tests import helpers


def _angles_numpy(hs, mask):
  hs = np.asarray(hs, np.float64)
  flat = hs.reshape(hs.shape[0], -1, hs.shape[-1])[:, np.asarray(mask).ravel()]
  n = hs.shape[0]
  out = np.zeros((n, n))
  for i in range(n):
    for j in range(i + 1, n):
      a, b = flat[i], flat[j]
      cos = np.sum(a * b, -1) / (
        np.maximum(np.linalg.norm(a, axis=-1), 1e-8)
        * np.maximum(np.linalg.norm(b, axis=-1), 1e-8)
      )
      out[i, j] = out[j, i] = np.mean(np.arccos(np.clip(cos, -1, 1))) / np.pi
  return out


def _stack(key, layers=4, d=6):
  """A toy residual stack h <- h + tanh(h A_l) + c_l, its states and loss."""
  ka, kc, kx = jax.random.split(key, 3)
  mats = 0.7 * jax.random.normal(ka, (layers, d, d))
  shifts = 0.1 * jax.random.normal(kc, (layers, d))
  x = jax.random.normal(kx, (2, 5, d))

  def block(i, h):
    return h + jnp.tanh(h @ mats[i]) + shifts[i][None, None]

  def run(blocks):
    hs = [x]
    for f in blocks:
      hs.append(f(hs[-1]))
    return jnp.stack(hs)

  def loss(hs):
    return jnp.mean(jnp.square(hs[-1] - 1.0)) + 0.5

  blocks = [lambda h, i=i: block(i, h) for i in range(layers)]
  return blocks, run, loss


class TestAngularDistance:
  def test_identities(self, key):
    h = jax.random.normal(key, (3, 4, 8))
    orth = jnp.concatenate([h[..., :4], jnp.zeros_like(h[..., 4:])], -1)
    other = jnp.concatenate([jnp.zeros_like(h[..., :4]), h[..., 4:]], -1)
    d = dm.angular_distance_matrix(jnp.stack([h, h, -h, orth, other]))
    helpers.assert_close(d[0, 1], 0.0, atol=1e-3)  # arccos near 1 is steep
    helpers.assert_close(d[0, 2], 1.0, atol=1e-3)
    helpers.assert_close(d[3, 4], 0.5, atol=1e-6)
    helpers.assert_close(d, d.T, atol=0.0)
    np.testing.assert_array_equal(np.diag(np.asarray(d)), 0.0)

  def test_matches_official_loop_with_mask(self, key):
    hs = jax.random.normal(key, (4, 3, 5, 6))
    mask = jax.random.bernoulli(jax.random.key(1), 0.7, (3, 5))
    d = dm.angular_distance_matrix(hs, mask=mask)
    helpers.assert_close(d, _angles_numpy(hs, mask), atol=1e-5)
    # padded tokens do not count: garbage there changes nothing
    garbage = jnp.where(mask[None, ..., None], hs, 1e3)
    helpers.assert_close(
      dm.angular_distance_matrix(garbage, mask=mask), d, atol=1e-6
    )

  def test_errors(self):
    who = "angular_distance_matrix"
    with pytest.raises(ValueError, match=f"{who}: hs must have rank >= 3"):
      dm.angular_distance_matrix(jnp.ones((2, 3)))
    with pytest.raises(TypeError, match=f"{who}: hs must have a floating"):
      dm.angular_distance_matrix(jnp.ones((2, 3, 4), jnp.int32))
    with pytest.raises(TypeError, match=f"{who}: mask must be boolean"):
      dm.angular_distance_matrix(jnp.ones((2, 3, 4)), mask=jnp.ones(3))
    with pytest.raises(ValueError, match=f"{who}: mask must have shape"):
      dm.angular_distance_matrix(jnp.ones((2, 3, 4)), mask=jnp.ones(4, bool))


class TestCausalEffect:
  def test_matches_numpy_on_a_stack(self, key):
    blocks, run, _ = _stack(key)
    base = run(blocks)
    for s in range(4):
      skipped = run(
        [(lambda h: h) if i == s else f for i, f in enumerate(blocks)]
      )
      c = dm.causal_effect(base, skipped, s)
      b, m = np.asarray(base, np.float64), np.asarray(skipped, np.float64)
      expected = np.zeros(4)
      for j in range(s + 1, 4):
        db, dmod = b[j + 1] - b[j], m[j + 1] - m[j]
        expected[j] = np.linalg.norm(dmod - db, axis=-1).mean() / (
          np.linalg.norm(db, axis=-1).mean()
        )
      helpers.assert_close(c, expected, atol=1e-5)
      assert s == 3 or float(jnp.max(c)) > 0.01

  def test_identity_and_input_independent_blocks(self, key):
    x = jax.random.normal(key, (3, 4))
    ident = jnp.stack([x] * 5)
    helpers.assert_close(dm.causal_effect(ident, ident, 1), np.zeros(4), atol=0)
    shifts = jax.random.normal(jax.random.key(2), (4, 4))
    cum = np.concatenate([np.zeros((1, 4)), np.cumsum(shifts, 0)])[:, None]
    base = x[None] + cum
    skip = base.at[2:].add(-shifts[1][None, None])
    helpers.assert_close(
      dm.causal_effect(base, skip, 1), np.zeros(4), atol=1e-6
    )

  def test_errors(self):
    hs = jnp.ones((3, 2, 4))
    with pytest.raises(ValueError, match="causal_effect: skipped_hs must hav"):
      dm.causal_effect(hs, hs[:2], 0)
    with pytest.raises(ValueError, match=r"causal_effect: skipped must be a "):
      dm.causal_effect(hs, hs, 2)


def _official_permutation(base, pair_losses, n):
  scores = {
    p: abs(base - v) / base if base > 1e-8 else 0.0
    for p, v in pair_losses.items()
  }
  vals = list(scores.values())
  counts, sums = np.zeros(n), np.zeros(n)
  w = 0.9 ** np.arange(n)
  for (i, j), s in scores.items():
    counts[i] += 1
    sums[i] += s * w[i]
    counts[j] += 1
    sums[j] += s * w[j]
  per = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
  return np.mean(vals), np.sum(vals) / (n * (n - 1) / 2), np.mean(per), per


class TestPermutationScore:
  def test_matches_official_summaries(self):
    rng = np.random.default_rng(0)
    n = 5
    losses = 2.0 + rng.random((n, n))
    pairs = np.triu(rng.random((n, n)) < 0.6, 1)
    pairs[0, 1] = pairs[3, 4] = True
    pair_losses = {(i, j): losses[i, j] for i, j in zip(*np.nonzero(pairs))}
    out = dm.permutation_score(
      jnp.float32(2.3), jnp.asarray(losses, jnp.float32), pairs=pairs
    )
    mean, norm, weighted, per = _official_permutation(2.3, pair_losses, n)
    helpers.assert_close(
      (out.mean, out.normalized, out.weighted, out.per_layer),
      (mean, norm, weighted, per),
      atol=1e-6,
    )
    assert np.all(np.asarray(out.scores)[~pairs] == 0.0)

  def test_swapping_equal_blocks_scores_zero(self, key):
    blocks, run, loss = _stack(key)
    same = [blocks[0]] * 4
    base = loss(run(same))
    swapped = jnp.full((4, 4), base)
    out = dm.permutation_score(base, swapped)
    helpers.assert_close(out.scores, np.zeros((4, 4)), atol=0.0)
    swap = [blocks[1], blocks[0], blocks[2], blocks[3]]
    moved = jnp.full((4, 4), loss(run(blocks))).at[0, 1].set(loss(run(swap)))
    assert (
      float(dm.permutation_score(loss(run(blocks)), moved).scores[0, 1]) > 0
    )

  def test_errors(self):
    with pytest.raises(ValueError, match="permutation_score: loss must be a "):
      dm.permutation_score(jnp.ones(2), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="permutation_score: swapped_loss mus"):
      dm.permutation_score(jnp.float32(1), jnp.ones((2, 3)))
    with pytest.raises(TypeError, match="permutation_score: pairs must be bo"):
      dm.permutation_score(
        jnp.float32(1), jnp.ones((2, 2)), pairs=np.ones((2, 2))
      )


class TestLinearUsefulness:
  def test_affine_block_is_recovered(self, key):
    kw, kb, kx = jax.random.split(key, 3)
    w = jax.random.normal(kw, (4, 3))
    b = jax.random.normal(kb, (3,))
    x = jax.random.normal(kx, (2, 10, 4))
    mask = jnp.ones((2, 10), bool).at[1, 7:].set(False)
    y = jnp.where(
      mask[..., None], x @ w + b[None, None], 50.0
    )  # padding is not affine
    w_fit, b_fit = dm.fit_linear_layer(x, y, mask=mask)
    helpers.assert_close((w_fit, b_fit), (w, b), atol=1e-4)

  def test_identity_and_linear_blocks_have_ratio_one(self, key):
    blocks, run, loss = _stack(key)
    kw = jax.random.key(7)
    lin = 0.5 * jax.random.normal(kw, (6, 6))
    blocks = [blocks[0], lambda h: h, lambda h: h @ lin + 0.2, blocks[3]]
    hs = run(blocks)
    base = loss(hs)
    linear_losses = []
    for layer in range(4):
      w, b = dm.fit_linear_layer(hs[layer], hs[layer + 1])
      swapped = [
        (lambda h, w=w, b=b: h @ w + b[None, None]) if i == layer else f
        for i, f in enumerate(blocks)
      ]
      linear_losses.append(loss(run(swapped)))
    out = dm.linear_usefulness(base, jnp.stack(linear_losses))
    helpers.assert_close(out.ratio[1:3], np.ones(2), atol=1e-4)
    expected = np.asarray(out.ratio) > 1.1
    np.testing.assert_array_equal(out.significant, expected)
    helpers.assert_close(out.score, expected.mean(), atol=0.0)

  def test_errors(self):
    with pytest.raises(ValueError, match="fit_linear_layer: outputs must mat"):
      dm.fit_linear_layer(jnp.ones((5, 3)), jnp.ones((4, 3)))
    with pytest.raises(ValueError, match="linear_usefulness: linear_loss mus"):
      dm.linear_usefulness(jnp.float32(1), jnp.ones((2, 2)))
    with pytest.raises(TypeError, match="linear_usefulness: loss must have a"):
      dm.linear_usefulness(1, jnp.ones(2))
