"""The complex experiments: their pieces, and each ``--quick`` run.

The pieces (parameter matching, the phase input, the fake-quantized LM,
the MQAR task, the checkpoint restore) are checked directly; the
``--quick`` runs (slow set) train every arm through the runner at toy
scale and check the artifacts (checked claim records with each arm's
setting, provenance, Markdown and plot), not the numbers.
"""

import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import (
  complex_common,
  complex_e1_cvcnn,
  complex_e2_cnet,
  complex_e3_fairy2i,
  complex_e4_complexformer,
  complex_e5_pct,
)
from experiments._harness import grid, tiers
from experiments._harness import runs as harness_runs
from jaxnorm.nn import cplx as ncplx
from jaxnorm.training import claims

SCRIPTS = (
  complex_e1_cvcnn,
  complex_e2_cnet,
  complex_e3_fairy2i,
  complex_e4_complexformer,
  complex_e5_pct,
)


def _default(module):
  return tiers.parser(module.__doc__, module.NAME).parse_args([])


@pytest.mark.slow  # Builds and runs models: with the experiments.
def test_real_fnet_matches_the_complex_fnet_within_two_percent():
  base = complex_e2_cnet.base_config(_default(complex_e2_cnet))
  models = complex_e2_cnet.Models(base)
  cfnet = complex_common.real_params(
    models.build(complex_e2_cnet.CFNET_HALF, 0)
  )
  rfnet = models.build(complex_e2_cnet.RFNET, 0)
  count = complex_common.real_params(rfnet)
  assert count == complex_e2_cnet.real_fnet_count(
    models.vocab, models.real_width, base.depth, base.seq_len
  )
  assert abs(count - cfnet) / cfnet < 0.02
  # Born and complex-softmax arms differ by the attention core only.
  born, soft = (
    complex_common.real_params(models.build(v, 0))
    for v in (complex_e2_cnet.BORN, complex_e2_cnet.SOFTMAX)
  )
  assert born == soft


def test_real_fnet_mixing_is_causal():
  lm = complex_e2_cnet.RealFNetLM(16, 8, 1, 6, rngs=nnx.Rngs(0))
  tokens = jnp.array([[1, 2, 3, 4, 5, 6]], jnp.int32)
  changed = tokens.at[0, 4].set(7)
  a, b = lm(tokens), lm(changed)
  np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=1e-5, atol=1e-5)
  assert not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.slow  # Builds and runs models: with the experiments.
def test_cnnx2_matches_the_cvcnn_within_two_percent():
  models = complex_e1_cvcnn.Models(
    complex_e1_cvcnn.base_config(_default(complex_e1_cvcnn))
  )
  counts = {
    v: complex_common.real_params(models.build(v, 0))
    for v in complex_e1_cvcnn.VARIANTS
  }
  assert abs(counts["cnnx2"] - counts["cvcnn"]) / counts["cvcnn"] < 0.02
  assert counts["cnn"] < 0.6 * counts["cvcnn"]
  assert counts["cnnx2"] == complex_e1_cvcnn.real_count(
    models.widths["cnnx2"], 2, models.classes
  )


def test_phase_images_keep_the_magnitude_and_evaluation_is_fixed():
  x = jax.random.uniform(jax.random.key(0), (3, 8, 8, 1))
  z = complex_e1_cvcnn.phase_images(x, jax.random.key(1))
  assert z.dtype == jnp.complex64 and z.shape == x.shape
  np.testing.assert_allclose(jnp.abs(z), x, rtol=1e-5, atol=1e-6)
  assert not np.allclose(jnp.angle(z[0]), jnp.angle(z[1]))
  k1, k2 = complex_e1_cvcnn._eval_key(x), complex_e1_cvcnn._eval_key(x)
  assert jnp.array_equal(jax.random.key_data(k1), jax.random.key_data(k2))


@pytest.mark.slow  # Builds and runs models: with the experiments.
def test_fake_quant_lm_quantizes_kernels_only():
  lm = complex_common.real_lm(8, 1, 2, 8, 0, vocab_size=16)
  tokens = jnp.arange(8, dtype=jnp.int32)[None]
  fp = complex_e3_fairy2i.FakeQuantLM(lm, "fp")
  np.testing.assert_allclose(fp(tokens), lm(tokens), rtol=1e-6)
  params = nnx.state(lm, nnx.Param)
  q = complex_e3_fairy2i.quantize_params(
    params, complex_e3_fairy2i.QUANTIZERS["binary"]
  )
  for (path, before), (_, after) in zip(
    nnx.to_flat_state(params), nnx.to_flat_state(q)
  ):
    name = str(path[-1])
    same = np.array_equal(before[...], after[...])
    if before[...].ndim >= 2 and name not in ("embed", "pos"):
      assert not same, path  # a kernel: binarized
      assert len(np.unique(np.round(np.abs(after[...]), 6))) <= 2
    else:
      assert same, path  # embedding, norms, biases: full precision
  # Straight-through: the quantized forward has gradients on the kernels.
  w1 = complex_e3_fairy2i.FakeQuantLM(lm, "w1")
  grads = nnx.grad(lambda m: jnp.sum(m(tokens) ** 2))(w1)
  assert any(
    float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(nnx.state(grads))
  )


def test_mqar_queries_repeat_their_pairs():
  t = complex_e5_pct.TIERS["default"]
  seqs, mask = complex_e5_pct.mqar(
    np.random.default_rng(0), 5, t.seq_len, t.pairs
  )
  assert seqs.shape == mask.shape == (5, t.seq_len)
  assert seqs.max() < complex_e5_pct.VOCAB and seqs.min() >= 0
  for seq, m in zip(seqs, mask):
    pairs = dict(zip(seq[: 2 * t.pairs : 2], seq[1 : 2 * t.pairs : 2]))
    queried = np.flatnonzero(m)
    assert len(queried) == t.pairs
    for p in queried:  # a key of the pairs, followed by its value
      assert pairs[seq[p]] == seq[p + 1]
  with pytest.raises(ValueError, match="need length >= 32"):
    complex_e5_pct.mqar(np.random.default_rng(0), 1, 16, 8)


def test_mqar_corpus_windows_are_sequences(tmp_path):
  t = complex_e5_pct.TIERS["quick"]
  folder = complex_e5_pct.write_corpus(tmp_path / "mqar", t)
  train = np.fromfile(folder / "train.bin", "<u2")
  assert len(train) == (t.steps * t.batch + 1) * t.seq_len
  windows = (len(train) - 1) // t.seq_len
  assert windows == t.steps * t.batch  # one pass: every window once


def test_pct_arms_are_the_official_presets():
  base = complex_e5_pct.base_config(_default(complex_e5_pct), "x")
  models = complex_e5_pct.Models(base, complex_e5_pct.TIERS["default"].pairs)
  sig = models.config(complex_e5_pct.SIGMOID)
  assert sig == ncplx.ComplexLMConfig.pct_official(
    complex_e5_pct.VOCAB,
    width=base.width,
    depth=base.depth,
    num_heads=base.num_heads,
    head_dim=base.width // base.num_heads,
    max_len=base.seq_len,
  )
  assert models.config(complex_e5_pct.RELU).attention_kwargs[0] == (
    "gate",
    "relu",
  )
  assert models.config(complex_e5_pct.SOFTMAX).attention == "complex_softmax"
  assert models.config(complex_e5_pct.DEEP).depth == 2 * base.depth


@pytest.mark.slow  # Builds and runs models: with the experiments.
def test_query_readout_scores_the_queried_values_only():
  lm = ncplx.ComplexLM(
    ncplx.ComplexLMConfig.pct_official(16, width=8, num_heads=2, head_dim=4,
                                       depth=1, max_len=8),
    rngs=nnx.Rngs(0),
  )  # fmt: skip
  model = complex_e5_pct.QueryReadout(lm, 8, 2)
  mask = complex_e5_pct.query_positions(8, 2)
  assert mask.tolist() == [False] * 4 + [True, False, True, False]
  tokens = jnp.arange(8, dtype=jnp.int32)[None] % 16
  logits = model(tokens)
  assert not jnp.any(logits[:, ~mask]) and jnp.all(logits[:, mask] != 0)
  np.testing.assert_array_equal(logits[:, mask], lm(tokens)[:, mask])

  def loss(m, targets):
    lg = m(tokens).astype(jnp.float32)
    return -jnp.sum(jax.nn.log_softmax(lg)[0, jnp.arange(8), targets])

  # A target changed at a position outside the queries changes no gradient.
  t1 = jnp.arange(1, 9) % 16
  t2 = t1.at[1].set(9)
  g1, g2 = (nnx.grad(loss)(model, t) for t in (t1, t2))
  for a, b in zip(
    jax.tree.leaves(nnx.state(g1)), jax.tree.leaves(nnx.state(g2))
  ):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_gated_records_follow_the_regime():
  lines = [
    {"variant": v, "seed": s, "val_loss": x + 0.01 * s}
    for s in range(3)
    for v, x in (("a", 1.0), ("b", 2.0), ("c", 1.5))
  ]

  def record(claim, **kw):
    return grid.claim_record(lines, claim, config={}, **kw)

  def claim(a, b):
    return claims.Claim(
      paper="P",
      arxiv="2501.00001",
      claim="x",
      metric="val_loss",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=a,
      b=b,
    )

  present = complex_common.gated(
    claim("a", "b"), [claim("c", "b")], record, baselines={}, absent="no"
  )
  assert [r["verdict"] for r in present] == ["reproduced", "reproduced"]
  absent = complex_common.gated(
    claim("b", "a"), [claim("c", "b")], record, baselines={}, absent="no"
  )
  assert absent[1]["verdict"] == claims.NOT_TESTABLE
  assert "not testable at this scale (no (" in absent[1]["why"]


def _check(out: pathlib.Path, name: str) -> None:
  md = (out / f"{name}.md").read_text()
  assert "**Verdict" in md and "## Claims" in md
  assert (out / f"{name}.png").stat().st_size > 0
  result = json.loads((out / f"{name}.json").read_text())
  claims.check_records(result["claims"])
  assert result["claims"] and all(r["setting"] for r in result["claims"])
  for rec in result["claims"]:
    for arm in ("a", "b"):
      assert rec["setting"][arm]["params"] > 0
      assert rec["config"][arm] is not None
  assert result["run"]["tier"] == "quick"
  assert math.isfinite(result["run"]["seconds"])


@pytest.mark.slow
@pytest.mark.parametrize("module", SCRIPTS, ids=lambda m: m.NAME)
def test_quick(module, tmp_path):
  argv = ["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]
  result = module.main(argv)
  assert result["claims"]
  _check(tmp_path, module.NAME)


@pytest.mark.slow
def test_quick_fairy2i_fine_tunes_the_trained_parent(tmp_path):
  runs = tmp_path / "runs"
  argv = ["--quick", "--out", str(tmp_path), "--runs", str(runs)]
  result = complex_e3_fairy2i.main(argv)
  # The fine-tunes start from the trained parent, not a fresh LM.
  args = _default(complex_e3_fairy2i)
  args.quick = True
  parent = complex_e3_fairy2i.parent_config(args)
  models = complex_e3_fairy2i.Models(parent, runs / "parents" / "grid.jsonl")
  lm = harness_runs.trained(
    models.parents, parent, {}, "parent", 0, model=lambda: models.lm(0)
  )
  fresh = models.lm(0)
  a, b = (nnx.state(m, nnx.Param)["head"]["kernel"][...] for m in (lm, fresh))
  assert not np.allclose(a, b)
  assert result["parents"][0]["steps"] == parent.steps
