"""`jaxnorm.training.claims`: t quantiles, paired intervals, verdicts, Holm.

Oracles: a printed t table (three decimals), closed forms of the df = 2
distribution (``F(t) = 1/2 + t / (2 sqrt(t^2 + 2))``), scipy.stats where
it is installed, coverage by simulation with a fixed seed, and hand-worked
Holm steps. Also the `experiments._grid` adapter and ``jaxnorm-sweep
--seeds`` on fake run summaries (nothing trains here).
"""

import argparse
import json
import math

import numpy as np
import pytest

from experiments._harness import grid as _grid
from experiments._harness import report as _report
from jaxnorm.training import claims, cli

# Student-t quantiles t_{p, df} from a printed table (e.g. NIST/SEMATECH
# e-Handbook, table 1.4.2.1.2.3), three decimals.
T_TABLE = {
  1: (3.078, 6.314, 12.706, 31.821),
  2: (1.886, 2.920, 4.303, 6.965),
  3: (1.638, 2.353, 3.182, 4.541),
  4: (1.533, 2.132, 2.776, 3.747),
  5: (1.476, 2.015, 2.571, 3.365),
  10: (1.372, 1.812, 2.228, 2.764),
  30: (1.310, 1.697, 2.042, 2.457),
}
T_PROBS = (0.90, 0.95, 0.975, 0.99)


def _claim(**changes):
  fields = dict(
    paper="DyT",
    arxiv="2503.10622",
    claim="DyT matches LayerNorm",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="dyt",
    b="layernorm",
  )
  return claims.Claim(**{**fields, **changes})


def _record(claim, a, b, **kw):
  kw = {"baseline_trained": True, "commit": {"sha": "x"}, "config": {}, **kw}
  return claims.record(claim, list(range(len(a))), a, b, **kw)


# --- the t distribution ---------------------------------------------------


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantiles_match_the_printed_table(df):
  for p, expected in zip(T_PROBS, T_TABLE[df]):
    assert claims.student_t_ppf(p, df) == pytest.approx(expected, abs=5e-4)
    assert claims.student_t_ppf(1 - p, df) == pytest.approx(-expected, abs=5e-4)
  assert claims.student_t_ppf(0.5, df) == 0.0


def test_t_distribution_closed_forms():
  # df = 2: F(t) = 1/2 + t / (2 sqrt(t^2 + 2)); t_p = q sqrt(2 / (1 - q^2)),
  # q = 2p - 1. df = 1 (Cauchy): F(t) = 1/2 + atan(t) / pi.
  for t in (-7.0, -1.0, 0.3, 2.0, 40.0):
    assert claims.student_t_cdf(t, 2) == pytest.approx(
      0.5 + t / (2 * math.sqrt(t * t + 2)), rel=1e-14
    )
    assert claims.student_t_cdf(t, 1) == pytest.approx(
      0.5 + math.atan(t) / math.pi, rel=1e-14
    )
  for p in (0.6, 0.95, 0.999):
    q = 2 * p - 1
    assert claims.student_t_ppf(p, 2) == pytest.approx(
      q * math.sqrt(2 / (1 - q * q)), rel=1e-12
    )
  assert math.isnan(claims.student_t_cdf(math.nan, 3))


def test_t_distribution_matches_scipy():
  stats = pytest.importorskip("scipy.stats")
  for df in (1, 2, 3, 4, 7, 10, 30, 101):
    for p in (0.55, 0.9, 0.975, 0.999, 0.9999):
      assert claims.student_t_ppf(p, df) == pytest.approx(
        stats.t.ppf(p, df), rel=1e-11
      )
    for x in (-30.0, -2.5, 0.0, 0.7, 4.0):
      assert claims.student_t_cdf(x, df) == pytest.approx(
        stats.t.cdf(x, df), rel=1e-12, abs=1e-15
      )


def test_t_distribution_errors():
  with pytest.raises(ValueError, match=r"p must be in \(0, 1\), got p=1.0"):
    claims.student_t_ppf(1.0, 3)
  with pytest.raises(ValueError, match="df must be an integer >= 1, got df=0"):
    claims.student_t_ppf(0.9, 0)
  with pytest.raises(ValueError, match="df must be an integer >= 1"):
    claims.student_t_cdf(1.0, 2.5)


# --- the paired interval --------------------------------------------------


def test_paired_interval_hand_computed():
  # d = (-0.1, -0.15, -0.05): mean -0.1, sd 0.05, se 0.05 / sqrt 3; with
  # df = 2, t_{0.95} = 0.9 sqrt(2 / 0.19) and p = (1 - sqrt(6 / 7)) / 2
  # (t = 0.1 / se = 2 sqrt 3).
  a, b = [1.0, 2.0, 3.0], [1.1, 2.15, 3.05]
  iv = claims.paired_interval(a, b, 0.90)
  half = 0.9 * math.sqrt(2 / 0.19) * 0.05 / math.sqrt(3)
  assert iv.n == 3 and iv.level == 0.90
  assert iv.mean == pytest.approx(-0.1, rel=1e-12)
  assert iv.sd == pytest.approx(0.05, rel=1e-12)
  assert (iv.low, iv.high) == pytest.approx((-0.1 - half, -0.1 + half))
  assert iv.p_value == pytest.approx((1 - math.sqrt(6 / 7)) / 2, rel=1e-9)
  # The same data for a "higher" metric: a is worse, p = 1 - that.
  up = claims.paired_interval(a, b, 0.90, direction="higher")
  assert up.p_value == pytest.approx((1 + math.sqrt(6 / 7)) / 2, rel=1e-9)


def test_paired_interval_matches_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(3)
  for n in (2, 3, 5, 12):
    a, b = rng.normal(size=n), rng.normal(size=n)
    iv = claims.paired_interval(a, b, 0.95)
    d = a - b
    lo, hi = stats.t.interval(
      0.95, n - 1, loc=d.mean(), scale=stats.sem(d, ddof=1)
    )
    assert (iv.low, iv.high) == pytest.approx((lo, hi), rel=1e-10)
    for direction, alternative in (("lower", "less"), ("higher", "greater")):
      p = claims.paired_interval(a, b, 0.95, direction=direction).p_value
      want = stats.ttest_rel(a, b, alternative=alternative).pvalue
      assert p == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("level", [0.95, 0.90])
def test_paired_interval_coverage_by_simulation(level):
  # 2000 experiments of 3 seeds, correlated pairs (a shared seed effect):
  # the interval covers the true mean difference (0.3) about `level` of
  # the time; the binomial sd at 2000 draws is about 0.005.
  rng = np.random.default_rng(0)
  covered = 0
  for _ in range(2000):
    seed_effect = rng.normal(size=3)
    b = 2.0 + seed_effect + 0.2 * rng.normal(size=3)
    a = 2.3 + seed_effect + 0.2 * rng.normal(size=3)
    iv = claims.paired_interval(a, b, level)
    covered += iv.low <= 0.3 <= iv.high
  assert level - 0.02 <= covered / 2000 <= level + 0.02


def test_paired_interval_errors():
  with pytest.raises(ValueError, match="same length"):
    claims.paired_interval([1.0, 2.0], [1.0], 0.95)
  with pytest.raises(ValueError, match="at least 2 pairs.*n=1"):
    claims.paired_interval([1.0], [2.0], 0.95)
  with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
    claims.paired_interval([1.0, 2.0], [1.0, 3.0], 95)
  with pytest.raises(ValueError, match="direction must be one of"):
    claims.paired_interval([1.0, 2.0], [1.0, 3.0], 0.9, direction="less")


# --- decision rules ---------------------------------------------------------


def _judge(d, base=(2.0, 2.5, 3.0), **kw):
  b = np.asarray(base)
  return claims.judge(list(b + np.asarray(d)), list(b), **kw)


def test_superior_a_small_worse_difference_in_every_seed_is_contradicted():
  # The audit's case: seeds differ by 0.5 (unpaired se ~0.4) but a is worse
  # by 0.01 in each of 3 seeds with paired t = +20; the claim "a is lower"
  # is contradicted, not "within noise".
  d = 0.01 + 0.01 * math.sqrt(3) / 20 * np.array([-1.0, 0.0, 1.0])
  j = _judge(d, kind="superior", direction="lower", margin=0.0)
  iv = j.interval
  assert iv.mean / (iv.sd / math.sqrt(3)) == pytest.approx(20.0)
  assert j.verdict == "contradicted"
  # The same numbers read as a higher-is-better metric: reproduced.
  j = _judge(d, kind="superior", direction="higher", margin=0.0)
  assert j.verdict == "reproduced"


@pytest.mark.parametrize(
  "d,margin,verdict",
  [
    ([-0.05, -0.06, -0.04], 0.0, "reproduced"),
    ([-0.05, -0.06, -0.04], 0.02, "reproduced"),  # gain > margin
    ([-0.05, -0.06, -0.04], 0.045, "inconclusive"),  # gain not > margin
    ([-0.05, 0.06, 0.0], 0.0, "inconclusive"),
    ([0.05, 0.06, 0.04], 0.0, "contradicted"),
  ],
)
def test_superior(d, margin, verdict):
  j = _judge(d, kind="superior", direction="lower", margin=margin)
  assert j.verdict == verdict


@pytest.mark.parametrize(
  "d,verdict",
  [
    ([0.005, 0.006, 0.004], "reproduced"),  # worse, but within 0.02
    ([-0.05, -0.06, -0.04], "reproduced"),  # better
    ([0.05, 0.06, 0.04], "contradicted"),  # all beyond 0.02 worse
    ([0.0, 0.05, -0.05], "inconclusive"),  # noisy
  ],
)
def test_non_inferior(d, verdict):
  j = _judge(d, kind="non_inferior", direction="lower", margin=0.02)
  assert j.verdict == verdict
  # For a higher-is-better metric the worse side flips.
  flipped = _judge(
    -np.asarray(d), kind="non_inferior", direction="higher", margin=0.02
  )
  assert flipped.verdict == verdict


@pytest.mark.parametrize(
  "d,verdict",
  [
    ([0.001, -0.001, 0.0], "reproduced"),
    ([0.05, -0.05, 0.0], "inconclusive"),  # large noise: not reproduced
    ([0.05, 0.06, 0.04], "contradicted"),
    ([-0.05, -0.06, -0.04], "contradicted"),
    ([0.009, 0.011, 0.01], "inconclusive"),  # straddles the margin
  ],
)
def test_equivalent(d, verdict):
  for direction in ("lower", "higher"):
    j = _judge(d, kind="equivalent", direction=direction, margin=0.01)
    assert j.verdict == verdict


def test_the_p_value_agrees_with_the_interval():
  # reproduced on the data alone <=> p < 1 - level, for every kind.
  rng = np.random.default_rng(1)
  for kind, margin in (
    ("superior", 0.0),
    ("superior", 0.05),
    ("non_inferior", 0.05),
    ("equivalent", 0.1),
  ):
    hits = 0
    for _ in range(300):
      d = rng.normal(-0.05, 0.08, size=4)
      j = _judge(
        d,
        base=(1.0, 2.0, 3.0, 4.0),
        kind=kind,
        direction="lower",
        margin=margin,
      )
      assert (j.verdict == "reproduced") == (j.p_value < 0.05), (kind, d)
      hits += j.verdict == "reproduced"
    assert 0 < hits < 300, kind


def test_one_seed_and_non_finite_values_are_inconclusive():
  j = claims.judge([1.0], [2.0], kind="superior", direction="lower", margin=0)
  assert j == claims.Judgement("inconclusive", None, None)
  j = claims.judge(
    [1.0, math.nan], [2.0, 3.0], kind="superior", direction="lower", margin=0
  )
  assert j.verdict == "inconclusive"
  with pytest.raises(ValueError, match="same, non-zero length"):
    claims.judge([], [], kind="superior", direction="lower", margin=0)
  with pytest.raises(ValueError, match="judge: kind must be one of"):
    claims.judge([1, 2], [1, 2], kind="better", direction="lower", margin=0)
  with pytest.raises(ValueError, match=r"judge: level must be in \(0.5, 1\)"):
    claims.judge([1, 2], [1, 2], kind="superior", direction="lower",
                 margin=0, level=0.5)  # fmt: skip
  with pytest.raises(ValueError, match="judge: margin must be a finite"):
    claims.judge([1, 2], [1, 2], kind="superior", direction="lower",
                 margin=-1.0)  # fmt: skip


# --- Claim validation -------------------------------------------------------


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("paper", "", "paper must be a non-empty string"),
    ("arxiv", "arXiv:2503.10622", "arxiv must be an arXiv identifier"),
    ("claim", " ", "claim must be a non-empty string"),
    ("metric", None, "metric must be a non-empty string"),
    ("direction", "lowest", "direction must be one of 'lower', 'higher'"),
    ("kind", "better", "kind must be one of 'superior', 'non_inferior'"),
    ("margin", -0.01, "margin must be a finite number >= 0"),
    ("margin", True, "margin must be a finite number >= 0"),
    ("margin", math.inf, "margin must be a finite number >= 0"),
    ("level", 1.0, r"level must be a confidence level in \(0.5, 1\)"),
    ("a", "", "a must be a non-empty string"),
    ("b", "dyt", "a and b must be different variants"),
  ],
)
def test_claim_validation(field, value, message):
  with pytest.raises(ValueError, match=f"Claim: {message}"):
    _claim(**{field: value})


def test_claim_validation_names_the_value():
  with pytest.raises(ValueError, match="got direction='lowest'"):
    _claim(direction="lowest")
  with pytest.raises(ValueError, match="margin must be > 0 for kind="):
    _claim(kind="equivalent", margin=0.0)
  with pytest.raises(ValueError, match="margin must be > 0 for kind="):
    _claim(kind="non_inferior", margin=0)
  assert _claim(kind="equivalent", margin=claims.MARGINS["nats_per_byte"])
  assert _claim(arxiv="2503.10622v2").arxiv == "2503.10622v2"


def test_claim_without_arxiv_names_its_source():
  with pytest.raises(ValueError, match="must name its source"):
    _claim(arxiv=None)
  with pytest.raises(ValueError, match="source must be a non-empty string"):
    _claim(arxiv=None, source=" ")
  claim = _claim(arxiv=None, source="github.com/crasmarum/CNet")
  rec = claims.record(
    claim, [0, 1], [1.0, 2.0], [1.5, 2.5], baseline_trained=True,
    commit=None, config=None,
  )  # fmt: skip
  assert rec["paper"] == {
    "name": "DyT", "arxiv": None, "source": "github.com/crasmarum/CNet",
  }  # fmt: skip
  claims.check_records([rec])


# --- records ----------------------------------------------------------------


def test_record_schema_and_values():
  claim = _claim()
  rec = claims.record(
    claim,
    [0, 1, 2],
    [1.0, 2.0, 3.0],
    [1.1, 2.15, 3.05],
    baseline_trained=True,
    commit={"sha": "abc", "dirty": False},
    config={"steps": 10},
  )
  assert tuple(rec) == claims.RECORD_KEYS
  assert set(rec) == {
    "paper", "claim", "metric", "direction", "kind", "margin", "level", "a",
    "b", "seeds", "a_values", "b_values", "ci", "verdict", "baseline_trained",
    "commit", "config", "mean_diff", "sd_diff", "n", "p_value", "why",
    "testable",
  }  # fmt: skip
  assert rec["paper"] == {"name": "DyT", "arxiv": "2503.10622"}
  assert rec["seeds"] == [0, 1, 2] and rec["n"] == 3
  assert rec["mean_diff"] == pytest.approx(-0.1)
  half = 0.9 * math.sqrt(2 / 0.19) * 0.05 / math.sqrt(3)
  assert rec["ci"] == pytest.approx([-0.1 - half, -0.1 + half])
  assert rec["verdict"] == "reproduced"
  assert "\n" not in rec["why"] and "90% paired t" in rec["why"]
  back = json.loads(json.dumps(rec, allow_nan=False))
  assert claims.recompute(back) == "reproduced"
  claims.check_records([back])


def test_untrained_baseline_is_never_reproduced():
  claim = _claim()
  good = ([1.0, 2.0, 3.0], [1.1, 2.15, 3.05])
  rec = _record(claim, *good, baseline_trained=False, reason="loss at chance")
  assert rec["verdict"] == "inconclusive"
  assert "baseline not trained: loss at chance" in rec["why"]
  assert claims.recompute(rec) == "inconclusive"
  worse = _record(claim, good[1], good[0], baseline_trained=False)
  assert worse["verdict"] == "contradicted"


def test_not_testable_at_this_scale():
  rec = _record(
    _claim(),
    [1.0, 2.0, 3.0],
    [1.1, 2.15, 3.05],
    testable=False,
    reason="no loss spikes in the baseline",
  )
  assert rec["verdict"] == "not testable at this scale"
  assert "no loss spikes in the baseline" in rec["why"]
  assert claims.recompute(rec) == rec["verdict"]
  with pytest.raises(ValueError, match="testable=False needs a reason"):
    _record(_claim(), [1.0, 2.0], [1.0, 2.0], testable=False)


@pytest.mark.parametrize(
  "kind,margin,d,want",
  [
    # superior: the interval of the gain contains the margin
    ("superior", 0.0, [-0.05, 0.06, 0.0], True),
    ("superior", 0.02, [-0.03, -0.01, -0.02], True),
    ("superior", 0.0, [-0.05, -0.06, -0.04], False),  # reproduced
    ("superior", 0.0, [0.05, 0.06, 0.04], False),  # contradicted
    # a gain below the margin: more seeds cannot make it reproduced
    ("superior", 0.5, [-0.05, -0.06, -0.04], False),
    ("non_inferior", 0.02, [0.0, 0.05, -0.05], True),
    ("non_inferior", 0.02, [0.005, 0.006, 0.004], False),  # reproduced
    ("non_inferior", 0.02, [0.05, 0.06, 0.04], False),  # contradicted
    ("equivalent", 0.01, [0.009, 0.011, 0.01], True),
    ("equivalent", 0.01, [-0.009, -0.011, -0.01], True),
    ("equivalent", 0.01, [0.05, -0.05, 0.0], True),  # both bounds
    ("equivalent", 0.01, [0.001, -0.001, 0.0], False),
    ("equivalent", 0.01, [0.05, 0.06, 0.04], False),
  ],
)
def test_straddles_the_margin(kind, margin, d, want):
  b = np.array([1.0, 2.0, 3.0])
  for direction, sign in (("lower", 1), ("higher", -1)):
    claim = _claim(kind=kind, margin=margin, direction=direction)
    rec = _record(claim, list(b + sign * np.asarray(d)), list(b))
    assert claims.straddles(rec) is want, (direction, rec["why"])
    back = json.loads(json.dumps(rec))
    assert claims.straddles(back) is want
  # Neither an untrained baseline, an untestable claim nor one seed.
  claim = _claim(kind=kind, margin=margin)
  a = list(b + np.asarray(d))
  assert not claims.straddles(
    _record(claim, a, list(b), baseline_trained=False)
  )
  assert not claims.straddles(
    _record(claim, a, list(b), testable=False, reason="absent")
  )
  assert not claims.straddles(_record(claim, a[:1], list(b[:1])))


def test_two_looks_error_by_simulation():
  # Paired differences at the margin (mean 0 here), tested one-sided at
  # 5% on seeds 0-2 and, where not rejected, on seeds 0-4.
  d = np.random.default_rng(0).standard_normal((200_000, 5))

  def rejects(x):
    n = x.shape[1]
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
    return t > claims.student_t_ppf(0.95, n - 1)

  first = rejects(d[:, :3])
  assert first.mean() == pytest.approx(0.05, abs=0.002)
  assert (first | rejects(d)).mean() == pytest.approx(
    claims.TWO_LOOKS_ERROR, abs=0.002
  )


def test_record_of_one_seed_and_of_a_diverged_run():
  one = _record(_claim(), [1.0], [2.0])
  assert one["verdict"] == "inconclusive" and one["ci"] is None
  assert one["p_value"] is None and "one seed" in one["why"]
  nan = _record(_claim(), [1.0, math.nan, 3.0], [1.1, 2.15, 3.05])
  assert nan["a_values"][1] is None and nan["verdict"] == "inconclusive"
  json.dumps(nan, allow_nan=False)
  claims.check_records([one, nan])


def test_record_errors():
  with pytest.raises(ValueError, match="claim must be a Claim"):
    claims.record(
      "dyt", [0], [1.0], [1.0], baseline_trained=True, commit="", config={}
    )
  with pytest.raises(ValueError, match="same, non-zero length"):
    claims.record(
      _claim(),
      [0, 1],
      [1.0],
      [1.0],
      baseline_trained=True,
      commit="",
      config={},
    )
  with pytest.raises(ValueError, match="seeds must be unique"):
    claims.record(
      _claim(),
      [0, 0],
      [1.0, 2.0],
      [1.0, 2.0],
      baseline_trained=True,
      commit="",
      config={},
    )


def test_check_records_refuses_edited_records():
  rec = _record(_claim(), [1.0, 2.0, 3.0], [1.1, 2.15, 3.05])
  with pytest.raises(ValueError, match="stored verdict 'contradicted'"):
    claims.check_records([rec, {**rec, "verdict": "contradicted"}])
  with pytest.raises(ValueError, match=r"record 0 .* stored ci="):
    claims.check_records([{**rec, "ci": [-0.5, 0.5]}])
  with pytest.raises(ValueError, match="stored verdict 'reproduced'"):
    claims.check_records([{**rec, "b_values": [0.9, 1.85, 2.95]}])


# --- Holm -------------------------------------------------------------------


def _fake(kind, p, verdict):
  return {"kind": kind, "p_value": p, "verdict": verdict, "level": 0.95,
          "why": "w"}  # fmt: skip


def test_holm_hand_worked():
  # Family: the 6 superiority records with a p-value. Sorted p and
  # thresholds 0.05 / (6, 5, 4, 3, 2, 1): 0.001 <= .00833, 0.005 <= .01,
  # 0.01 <= .0125, 0.02 > .01667: stop; ranks 4-6 are not rejected.
  records = [
    _fake("superior", 0.02, "reproduced"),  # rank 4: -> inconclusive
    _fake("superior", 0.005, "reproduced"),  # rank 2: stays
    _fake("non_inferior", 0.3, "reproduced"),  # other kind: untouched
    _fake("superior", 0.9, "contradicted"),  # rank 6: stays contradicted
    _fake("superior", 0.001, "inconclusive"),  # rank 1: never promoted
    _fake("superior", 0.04, "reproduced"),  # rank 5: -> inconclusive
    _fake("superior", 0.01, "reproduced"),  # rank 3: stays
    _fake("superior", None, "inconclusive"),  # one seed: not in the family
  ]
  out = claims.holm(records)
  assert [r["verdict"] for r in out] == [
    "inconclusive",
    "reproduced",
    "reproduced",
    "contradicted",
    "inconclusive",
    "inconclusive",
    "reproduced",
    "inconclusive",
  ]
  assert [r.get("holm", {}).get("rank") for r in out] == [
    4, 2, None, 6, 1, 5, 3, None,
  ]  # fmt: skip
  assert out[0]["holm"] == {
    "alpha": pytest.approx(0.05),
    "family": 6,
    "rank": 4,
    "threshold": pytest.approx(0.05 / 3),
    "rejected": False,
  }
  assert "Holm over 6" in out[0]["why"]
  assert records[0]["verdict"] == "reproduced"  # inputs are not changed
  # With alpha = 0.2 the step-down goes further: 0.04 <= 0.1 rejects.
  loose = claims.holm(records, alpha=0.2)
  assert loose[5]["verdict"] == "reproduced"
  # Step-down: 0.03 > 0.05 / 2 stops it, so 0.035 <= 0.05 / 1 is not
  # rejected either.
  pair = claims.holm(
    [
      _fake("superior", 0.035, "reproduced"),
      _fake("superior", 0.03, "reproduced"),
    ]
  )
  assert [r["verdict"] for r in pair] == ["inconclusive", "inconclusive"]
  assert [r["holm"]["rejected"] for r in pair] == [False, False]


def test_holm_errors():
  with pytest.raises(ValueError, match="different levels"):
    claims.holm(
      [
        _fake("superior", 0.01, "reproduced"),
        {**_fake("superior", 0.01, "reproduced"), "level": 0.9},
      ]
    )
  once = claims.holm([_fake("superior", 0.01, "reproduced")])
  with pytest.raises(ValueError, match="already has a holm entry"):
    claims.holm(once)


def test_holm_records_round_trip_through_check_records():
  base = [1.0, 2.0, 3.0, 4.0]
  strong = _record(_claim(), [x - 0.1 for x in base],
                   [x + 0.001 * i for i, x in enumerate(base)])  # fmt: skip
  # weak: d = -0.01 +- 0.0064, sd 0.0074, t = 2.71 on 3 df: p ~ 0.037;
  # weaker: jitter 0.0068, p ~ 0.04. Holm over 3: strong's p <= 0.05 / 3,
  # then 0.037 > 0.05 / 2 stops the step-down: both weak ones are demoted.
  jitter = np.array([1.0, -1.0, 1.0, -1.0])
  weak = _record(
    _claim(a="crms"), list(np.add(base, -0.01 + 0.0064 * jitter)), base
  )
  weaker = _record(
    _claim(a="l1"), list(np.add(base, -0.01 + 0.0068 * jitter)), base
  )
  assert {r["verdict"] for r in (strong, weak, weaker)} == {"reproduced"}
  assert 0.025 < weak["p_value"] < weaker["p_value"] < 0.05
  out = claims.holm([strong, weak, weaker])
  assert [r["verdict"] for r in out] == [
    "reproduced",
    "inconclusive",
    "inconclusive",
  ]
  table = json.loads(json.dumps(out, allow_nan=False))
  claims.check_records(table)
  assert [claims.recompute(r) for r in table] == [r["verdict"] for r in out]
  forged = [table[0], {**table[1], "verdict": "reproduced"}, table[2]]
  with pytest.raises(ValueError, match="stored verdict 'reproduced'"):
    claims.check_records(forged)
  lax = dict(table[1], holm={**table[1]["holm"], "rejected": True},
             verdict="reproduced")  # fmt: skip
  with pytest.raises(ValueError, match="Holm over the 3 corrected records"):
    claims.check_records([table[0], lax, table[2]])


# --- commit -----------------------------------------------------------------


def test_commit(tmp_path):
  assert claims.commit(tmp_path) == {"sha": "unknown", "dirty": None}
  here = claims.commit()
  if here["sha"] != "unknown":
    assert len(here["sha"]) == 40 and int(here["sha"], 16) >= 0
    assert isinstance(here["dirty"], bool)


# --- experiments._grid ------------------------------------------------------


def _lines(values, variant, metric="val_loss", seeds=(0, 1, 2)):
  return [
    {"variant": variant, "seed": s, metric: v} for s, v in zip(seeds, values)
  ]


def test_grid_pairs_by_seed():
  # Lines out of seed order and a seed missing from b: pairs 0 and 2.
  lines = _lines([3.0, 1.0], "dyt", seeds=(2, 0)) + _lines(
    [1.1, 2.1, 3.1], "layernorm"
  )
  grid = _grid.cells(lines, "val_loss")
  assert grid["dyt"]["seeds"] == [0, 2] and grid["dyt"]["values"] == [1.0, 3.0]
  assert _grid.paired(grid["dyt"], grid["layernorm"]) == (
    [0, 2], [1.0, 3.0], [1.1, 3.1],
  )  # fmt: skip
  rec = _grid.claim_record(
    lines, _claim(), baseline_trained=True, config={}, commit="c"
  )
  assert rec["seeds"] == [0, 2] and rec["b_values"] == [1.1, 3.1]
  assert rec["mean_diff"] == pytest.approx(-0.1)
  accuracy = lines + _lines([0.5, 0.6, 0.7], "layernorm", "val_accuracy")
  with pytest.raises(ValueError, match=r"variant\(s\) \['dyt'\] has metric"):
    _grid.claim_record(
      accuracy, _claim(metric="val_accuracy"), baseline_trained=True, config={}
    )
  with pytest.raises(ValueError, match="no shared seed"):
    _grid.paired({"seeds": [0], "values": [1.0]},
                 {"seeds": [1], "values": [1.0]})  # fmt: skip
  with pytest.raises(ValueError, match="matched by position"):
    _grid.paired({"values": [1.0, 2.0]}, {"values": [1.0]})


def test_verdict_table_renders_records():
  rec = _record(_claim(), [1.0, 2.0, 3.0], [1.1, 2.15, 3.05])
  rows = _report.verdict_table([rec])
  assert rows[0] == "| paper | claim | kind | margin | a − b | n | verdict |"
  assert rows[2].startswith(
    "| DyT (arXiv:2503.10622) | dyt vs layernorm: DyT matches LayerNorm | "
    "superior | 0 | -0.1 ["
  )
  assert rows[2].endswith("(90%) | 3 | **Verdict: reproduced** |")


def test_report_checks_claim_records_before_writing(tmp_path):
  rec = _record(_claim(), [1.0, 2.0, 3.0], [1.1, 2.15, 3.05])
  args = argparse.Namespace(out=str(tmp_path), quick=True)

  def run(records):
    return _report.run(
      "x",
      "Title line.\n\nMore doc.",
      args,
      lambda: {"claims": records},
      lambda result, path: None,
      lambda result: ["Settings.", ""],
    )

  with pytest.raises(ValueError, match="stored verdict 'contradicted'"):
    run([{**rec, "verdict": "contradicted"}])
  assert not (tmp_path / "x.json").exists()
  run([rec])
  assert json.loads((tmp_path / "x.json").read_text())["claims"] == [rec]
  md = (tmp_path / "x.md").read_text().splitlines()
  assert md[0] == "# Title line." and ", commit " in md[2]
  assert md[4:9] == [
    "Settings.",
    "",
    "## Claims",
    "",
    _report.verdict_table([rec])[0],
  ]
  assert md[-3].startswith("- dyt vs layernorm (val_loss): ")
  assert md[-2:] == ["", _report.HOLM_NOTE]


# --- jaxnorm-sweep --seeds --------------------------------------------------


def _fake_train(losses, accuracy):
  """trainer.train's stand-in: a summary from (norm, seed) tables."""

  def train(cfg, model=None):
    import pathlib

    pathlib.Path(cfg.out_dir).mkdir(parents=True)
    return {
      "kind": "lm",
      "baseline": 5.0,
      "baseline_bits_per_byte": 5.0 / math.log(2),
      "params": 100,
      "steps": cfg.steps,
      "train_loss": 2.0,
      "val_loss": losses[cfg.norm][cfg.seed],
      "val_bits_per_byte": losses[cfg.norm][cfg.seed] / math.log(2),
      "val_accuracy": accuracy[cfg.norm][cfg.seed],
      "tokens_per_sec": 1.0,
      "stop_reason": None,
    }

  return train


def test_sweep_seeds_reports_paired_statistics(tmp_path, monkeypatch, capsys):
  # rmsnorm - layernorm per seed (seeds 7, 8, 9 = --seed .. --seed + 2):
  # loss (-0.02, -0.03, -0.025): mean -0.025, sd 0.005, 95% half width
  # t_{0.975, 2} 0.005 / sqrt 3 with t_{0.975, 2} = 4.303: better.
  # Accuracy (-0.01, -0.01, -0.015): interval [-0.0188, -0.0045]: worse.
  # dyt: loss (+0.05, -0.05, 0): no difference; accuracy NaN (diverged).
  losses = {
    "layernorm": {7: 2.0, 8: 2.5, 9: 3.0},
    "rmsnorm": {7: 1.98, 8: 2.47, 9: 2.975},
    "dyt": {7: 2.05, 8: 2.45, 9: 3.0},
  }
  accuracy = {
    "layernorm": {7: 0.5, 8: 0.4, 9: 0.6},
    "rmsnorm": {7: 0.49, 8: 0.39, 9: 0.585},
    "dyt": {7: 0.5, 8: math.nan, 9: 0.6},
  }
  monkeypatch.setattr(cli.trainer, "train", _fake_train(losses, accuracy))
  plotted = []
  monkeypatch.setattr(
    cli.metrics, "plot_runs", lambda runs, path, **kw: plotted.append(runs)
  )
  code = cli.sweep_main([
    "--vary", "norm=layernorm,rmsnorm,dyt", "--seeds", "3", "--seed", "7",
    "--out-dir", str(tmp_path),
  ])  # fmt: skip
  assert code == 0
  table = (tmp_path / "sweep.md").read_text()
  assert "| layernorm/seed8 |" in table and "| rmsnorm/seed9 |" in table
  rows = {}
  for ln in table.splitlines():
    cells = [c.strip() for c in ln.split("|")[1:-1]]
    if cells and cells[0].startswith("val_"):
      rows[cells[0].split()[0], cells[1]] = cells[2:]
  n, mean, interval, _, reading = rows["val_loss", "rmsnorm"]
  assert (n, mean, reading) == ("3", "-0.0250", "better")
  half = 4.303 * 0.005 / math.sqrt(3)
  lo, hi = (float(x) for x in interval.strip("[]").split(","))
  assert (lo, hi) == pytest.approx((-0.025 - half, -0.025 + half), abs=2e-4)
  assert rows["val_accuracy", "rmsnorm"][-1] == "worse"
  assert rows["val_loss", "dyt"][-1] == "no difference at 95%"
  assert rows["val_accuracy", "dyt"][-1] == "non-finite value (a run diverged)"
  assert len(rows) == 4  # the first variant is the reference
  assert [name for name, _ in plotted[0]][:2] == [
    "layernorm/seed7", "layernorm/seed8",
  ]  # fmt: skip
  assert (tmp_path / "layernorm" / "seed9").is_dir()
  assert "| val_loss (lower is better) | rmsnorm |" in capsys.readouterr().out


def test_sweep_seeds_errors(capsys):
  assert cli.sweep_main(["--seeds", "0"]) == 2
  assert "--seeds must be a number of seeds >= 1" in capsys.readouterr().err


def test_margins_are_declared_once():
  assert claims.MARGINS["nats_per_byte"] == 0.01
  assert all(m > 0 for m in claims.MARGINS.values())
  with pytest.raises(TypeError):
    claims.MARGINS["new"] = 1.0  # read-only
