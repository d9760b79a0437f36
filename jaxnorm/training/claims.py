r"""The statistics of paper claims: paired intervals, verdicts, records.

One engine for every verdict the library prints (``jaxnorm-sweep --seeds``,
the scripts under ``experiments/``). A claim compares a variant ``a`` with a
baseline ``b`` on one metric; both run with the same seeds, so the evidence
is the per-seed difference ``d_i = a_i - b_i`` (a matched-pairs design: the
seed's data order and initialisation cancel). With ``n`` seeds, the mean
``\bar d``, the sample standard deviation ``s_d`` (``ddof=1``) and the
Student-t quantile ``t_{q, n-1}`` give the two-sided interval at level
``L``:

.. math::
  \bar d \pm t_{(1+L)/2,\, n-1}\, s_d / \sqrt{n}.

The claim's direction is folded in: for a ``"lower"`` metric (a loss) the
improvement of ``a`` is ``g_i = -d_i``, for a ``"higher"`` one (accuracy)
``g_i = d_i``, so "better" is always ``g > 0``. Every kind of claim is
judged on the same interval: the two-sided ``(2 L - 1)`` interval of
``\bar d`` (90% for ``level=0.95``), each end of which is a one-sided
``L`` confidence bound. At ``level=0.95`` every rule below is therefore a
one-sided test at 5% (for equivalence, Schuirmann's two one-sided tests,
TOST, at 5% each), and ``p_value < 1 - level`` exactly when the verdict is
``reproduced`` on the data alone. With ``[g_lo, g_hi]`` the interval of the
improvement and ``m`` the claim's margin:

* ``superior`` (``a`` beats ``b`` by more than ``m``, ``m >= 0``):
  reproduced if ``g_lo > m``; contradicted if ``g_hi < 0`` (``a`` is
  significantly worse); else inconclusive (including a significant gain
  smaller than ``m``).
* ``non_inferior`` (``a`` is at most ``m`` worse, ``m > 0``): reproduced if
  ``g_lo > -m``; contradicted if ``g_hi < -m``; else inconclusive.
* ``equivalent`` (``|\bar d| < m``, ``m > 0``): reproduced if the interval
  lies inside ``(-m, m)``; contradicted if it lies entirely outside (above
  ``m`` or below ``-m``); else inconclusive. Large noise gives a wide
  interval and so ``inconclusive``, never ``reproduced``.

Verdicts are one of `VERDICTS`. A caller marks a claim ``testable=False``
when the phenomenon the paper fixes is absent from the baseline at this
scale (``"not testable at this scale"``); a baseline that did not train
(``baseline_trained=False``) can never support ``reproduced``: such a claim
becomes ``inconclusive`` with the reason. One seed gives no interval and so
``inconclusive``; a non-finite value (a diverged run) likewise.

Across a table, `holm` applies the Holm-Bonferroni step-down correction to
the superiority claims' one-sided p-values; it can only turn ``reproduced``
into ``inconclusive``. `record` writes one claim's JSON-able evidence,
`recompute` re-derives the verdict from a record alone, `straddles` tells
whether more seeds could decide it, and `check_records` refuses a table
whose stored verdicts or numbers do not follow from their per-seed values.

The t quantile is computed here (scipy is not a dependency of jaxnorm):
the t distribution function for integer degrees of freedom has a finite
closed form (Abramowitz & Stegun 26.7.3 and 26.7.4), inverted by
bisection to float64 precision.

References:
  Abramowitz & Stegun, *Handbook of Mathematical Functions*, 26.7 (1964);
  Holm, *A Simple Sequentially Rejective Multiple Test Procedure*,
  Scandinavian Journal of Statistics 6(2):65-70 (1979);
  Schuirmann, *A Comparison of the Two One-Sided Tests Procedure and the
  Power Approach for Assessing the Equivalence of Average
  Bioavailability*, J. Pharmacokinetics and Biopharmaceutics 15:657-680
  (1987).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import subprocess
import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

Direction = Literal["lower", "higher"]
Kind = Literal["superior", "non_inferior", "equivalent"]
DIRECTIONS: tuple[str, ...] = ("lower", "higher")
KINDS: tuple[str, ...] = ("superior", "non_inferior", "equivalent")
NOT_TESTABLE = "not testable at this scale"
VERDICTS: tuple[str, ...] = (
  "reproduced",
  "contradicted",
  "inconclusive",
  NOT_TESTABLE,
)

# The default margin of each metric family, in that family's units: the
# smallest difference a claim in it treats as real. A `Claim` takes its
# margin from here (``margin=MARGINS["nats_per_byte"]``) unless the paper
# states its own.
MARGINS: Mapping[str, float] = types.MappingProxyType(
  {
    # Validation loss of a byte LM: 0.01 nats = 0.0144 bits per byte.
    "nats_per_byte": 0.01,
    # Classification accuracy or error as a fraction: one point.
    "accuracy_fraction": 0.01,
    # Classification accuracy or error in percent: one point.
    "accuracy_points": 1.0,
    # A ratio on the log scale (step time, activation gain): 10%.
    "log_ratio": math.log(1.1),
  }
)

# The false-"reproduced" rate of a one-sided paired t at level 0.95 that
# looks at 3 seeds and, where they leave the interval straddling the
# margin (`straddles`), once more at 5: simulated at the margin (the test
# recomputes it). A second look costs this much over the 0.05 of one.
TWO_LOOKS_ERROR = 0.082

# The keys of a `record`, in order (`holm` adds ``holm``).
RECORD_KEYS: tuple[str, ...] = (
  "paper",
  "claim",
  "metric",
  "direction",
  "kind",
  "margin",
  "level",
  "a",
  "b",
  "seeds",
  "a_values",
  "b_values",
  "n",
  "mean_diff",
  "sd_diff",
  "ci",
  "p_value",
  "verdict",
  "why",
  "testable",
  "baseline_trained",
  "commit",
  "config",
)

_ARXIV = re.compile(r"\d{4}\.\d{4,5}(v\d+)?")


def _choices(who: str, name: str, value: Any, valid: Sequence[str]) -> None:
  if value not in valid:
    raise ValueError(
      f"{who}: {name} must be one of {', '.join(map(repr, valid))}, "
      f"got {name}={value!r}"
    )


def _text(name: str, value: Any) -> None:
  if not isinstance(value, str) or not value.strip():
    raise ValueError(
      f"Claim: {name} must be a non-empty string, got {name}={value!r}"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
  """One claim of a paper: variant ``a`` against baseline ``b`` on a metric.

  Attributes:
    paper: the paper's short name, e.g. ``"DyT"``.
    arxiv: its arXiv identifier, e.g. ``"2503.10622"``; ``None`` for a
      paper that has none, which then names its ``source``.
    claim: the claim as the paper states it.
    metric: the compared value, e.g. ``"val_loss"`` (a grid line's key).
    direction: ``"lower"`` or ``"higher"``: which values are better.
    kind: ``"superior"``, ``"non_inferior"`` or ``"equivalent"`` (module
      docstring).
    margin: the margin ``m`` in metric units, ``>= 0``; ``> 0`` for
      ``non_inferior`` and ``equivalent``. See `MARGINS`.
    a: the variant.
    b: the baseline.
    level: the confidence level ``L`` of each one-sided bound, in
      ``(0.5, 1)``.
    source: where a paper without an arXiv identifier is published (e.g.
      ``"github.com/crasmarum/CNet"``); required when ``arxiv`` is None.

  Raises:
    ValueError: a field is empty or not one of its valid values (the
      message names the field, the valid choices and the value).
  """

  paper: str
  arxiv: str | None
  claim: str
  metric: str
  direction: Direction
  kind: Kind
  margin: float
  a: str
  b: str
  level: float = 0.95
  source: str | None = None

  def __post_init__(self):
    for name in ("paper", "claim", "metric", "a", "b"):
      _text(name, getattr(self, name))
    if self.source is not None:
      _text("source", self.source)
    if self.arxiv is None and self.source is None:
      raise ValueError(
        "Claim: a paper without an arXiv identifier (arxiv=None) must name "
        "its source, e.g. source='github.com/crasmarum/CNet'"
      )
    if self.arxiv is not None and (
      not isinstance(self.arxiv, str) or not _ARXIV.fullmatch(self.arxiv)
    ):
      raise ValueError(
        f"Claim: arxiv must be an arXiv identifier such as '2503.10622' "
        f"(YYMM.NNNNN, optional vN), got arxiv={self.arxiv!r}"
      )
    _choices("Claim", "direction", self.direction, DIRECTIONS)
    _choices("Claim", "kind", self.kind, KINDS)
    if (
      isinstance(self.margin, bool)
      or not isinstance(self.margin, int | float)
      or not math.isfinite(self.margin)
      or self.margin < 0
    ):
      raise ValueError(
        f"Claim: margin must be a finite number >= 0 in metric units "
        f"(e.g. MARGINS['nats_per_byte']), got margin={self.margin!r}"
      )
    if self.kind != "superior" and self.margin == 0:
      raise ValueError(
        f"Claim: margin must be > 0 for kind={self.kind!r} (only "
        f"'superior' may use 0), got margin={self.margin!r}; choose one of "
        f"MARGINS: {dict(MARGINS)}"
      )
    if (
      isinstance(self.level, bool)
      or not isinstance(self.level, int | float)
      or not 0.5 < self.level < 1
    ):
      raise ValueError(
        f"Claim: level must be a confidence level in (0.5, 1), e.g. 0.95, "
        f"got level={self.level!r}"
      )
    if self.a == self.b:
      raise ValueError(
        f"Claim: a and b must be different variants, got a=b={self.a!r}"
      )


def _check_df(who: str, df: Any) -> None:
  if isinstance(df, bool) or not isinstance(df, int | np.integer) or df < 1:
    raise ValueError(f"{who}: df must be an integer >= 1, got df={df!r}")


def student_t_cdf(x: float, df: int) -> float:
  r"""The Student-t distribution function ``P(T <= x)``, ``df`` an integer.

  With ``\theta = \arctan(|x| / \sqrt{\nu})`` and ``\nu = df``,
  ``A = P(|T| <= |x|)`` is, for odd ``\nu``,
  ``(2/\pi)(\theta + \sin\theta\,(\cos\theta + \tfrac{2}{3}\cos^3
  \theta + \dots + \tfrac{2 \cdot 4 \cdots (\nu-3)}{3 \cdot 5 \cdots
  (\nu-2)}\cos^{\nu-2}\theta))`` and, for even ``\nu``,
  ``\sin\theta\,(1 + \tfrac12\cos^2\theta + \dots +
  \tfrac{1 \cdot 3 \cdots (\nu-3)}{2 \cdot 4 \cdots (\nu-2)}
  \cos^{\nu-2}\theta)``; then ``P(T <= x) = (1 + sign(x) A) / 2``.

  Args:
    x: the point (NaN gives NaN).
    df: the degrees of freedom ``\nu``, an integer ``>= 1``.

  Returns:
    The probability, a Python float (float64).

  Raises:
    ValueError: ``df`` is not an integer ``>= 1``.

  References:
    Abramowitz & Stegun, *Handbook of Mathematical Functions*, 26.7.3-4
    (1964).
  """
  _check_df("student_t_cdf", df)
  if math.isnan(x):
    return math.nan
  theta = math.atan(abs(x) / math.sqrt(df))
  cos2 = math.cos(theta) ** 2
  if df % 2:
    total, term = 0.0, math.cos(theta)
    for j in range(1, (df - 1) // 2 + 1):
      total += term
      term *= cos2 * (2 * j) / (2 * j + 1)
    inside = 2 / math.pi * (theta + math.sin(theta) * total)
  else:
    total, term = 0.0, 1.0
    for j in range(df // 2):
      total += term
      term *= cos2 * (2 * j + 1) / (2 * j + 2)
    inside = math.sin(theta) * total
  return 0.5 + math.copysign(0.5 * min(inside, 1.0), x)


def student_t_ppf(p: float, df: int) -> float:
  """The Student-t quantile: ``x`` with ``P(T <= x) = p``.

  Bisection on `student_t_cdf` until the bracket is one float apart.

  Args:
    p: the probability, in ``(0, 1)``.
    df: the degrees of freedom, an integer ``>= 1``.

  Returns:
    The quantile, a Python float (float64).

  Raises:
    ValueError: ``p`` is not in ``(0, 1)`` or ``df`` is not an integer
      ``>= 1``.
  """
  _check_df("student_t_ppf", df)
  if not 0 < p < 1:
    raise ValueError(f"student_t_ppf: p must be in (0, 1), got p={p!r}")
  if p < 0.5:
    return -student_t_ppf(1 - p, df)
  lo, hi = 0.0, 1.0
  while student_t_cdf(hi, df) < p:
    lo, hi = hi, 2 * hi
  while True:
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      return mid
    if student_t_cdf(mid, df) < p:
      lo = mid
    else:
      hi = mid


class PairedInterval(NamedTuple):
  """The paired-t statistics of ``d = a - b`` (see `paired_interval`)."""

  n: int
  mean: float
  sd: float
  low: float
  high: float
  level: float
  p_value: float


def _improvement(direction: str) -> int:
  """+1 when larger ``a - b`` is better for ``a``, -1 otherwise."""
  return -1 if direction == "lower" else 1


def _one_sided_p(gain: float, sd: float, n: int, margin: float) -> float:
  """One-sided p of "mean improvement <= margin" given the mean improvement."""
  if math.isnan(gain) or math.isnan(sd):
    return math.nan
  excess = gain - margin
  if sd == 0:
    return 0.0 if excess > 0 else 1.0
  return student_t_cdf(-excess / (sd / math.sqrt(n)), n - 1)


def paired_interval(
  a_values: Sequence[float],
  b_values: Sequence[float],
  level: float,
  *,
  direction: Direction = "lower",
  margin: float = 0.0,
) -> PairedInterval:
  r"""The paired-t interval of the mean of ``d_i = a_i - b_i``.

  ``\bar d \pm t_{(1+L)/2, n-1} s_d / \sqrt n`` with ``L = level`` and
  ``s_d`` the sample standard deviation (``ddof=1``); the p-value is the
  one-sided paired t-test of ``H_0``: "``a`` is not better than ``b`` by
  more than ``margin``" in ``direction``, i.e. ``P(T_{n-1} >= (g - m) /
  (s_d / \sqrt n))`` with ``g`` the mean improvement (``-\bar d`` for
  ``"lower"``). Non-finite values give NaN statistics.

  Args:
    a_values: the variant's values, one per seed, shape ``(n,)``.
    b_values: the baseline's values for the same seeds in the same order.
    level: the two-sided confidence level, in ``(0, 1)``.
    direction: ``"lower"`` or ``"higher"``: which values are better.
    margin: ``m`` of the null hypothesis, in metric units.

  Returns:
    `PairedInterval`: ``n``, ``mean`` and ``sd`` of ``d``, the interval
    ``[low, high]`` at ``level`` and the one-sided ``p_value``.

  Raises:
    ValueError: the lengths differ, fewer than 2 pairs, ``level`` not in
      ``(0, 1)`` or ``direction`` not one of `DIRECTIONS`.
  """
  a = np.asarray(a_values, np.float64)
  b = np.asarray(b_values, np.float64)
  if a.ndim != 1 or a.shape != b.shape:
    raise ValueError(
      f"paired_interval: a_values and b_values must be 1-D of the same "
      f"length (one value per seed, same seed order), got {a.shape=} and "
      f"{b.shape=}"
    )
  if a.size < 2:
    raise ValueError(
      f"paired_interval: needs at least 2 pairs (seeds) for an interval, "
      f"got n={a.size}; run more seeds"
    )
  if not 0 < level < 1:
    raise ValueError(
      f"paired_interval: level must be in (0, 1), got level={level!r}"
    )
  _choices("paired_interval", "direction", direction, DIRECTIONS)
  d = a - b
  n = int(d.size)
  mean, sd = float(d.mean()), float(d.std(ddof=1))
  half = student_t_ppf((1 + level) / 2, n - 1) * sd / math.sqrt(n)
  p = _one_sided_p(_improvement(direction) * mean, sd, n, margin)
  return PairedInterval(n, mean, sd, mean - half, mean + half, level, p)


class Judgement(NamedTuple):
  """The verdict on one comparison and its evidence (see `judge`)."""

  verdict: str
  interval: PairedInterval | None
  p_value: float | None


def _decide(kind: str, direction: str, margin: float, low, high) -> str:
  """The verdict of the data alone: the module docstring's rules."""
  if kind == "equivalent":
    if -margin < low and high < margin:
      return "reproduced"
    if high < -margin or low > margin:
      return "contradicted"
    return "inconclusive"
  sign = _improvement(direction)
  g_lo, g_hi = sorted((sign * low, sign * high))
  better, worse = (margin, 0.0) if kind == "superior" else (-margin, -margin)
  if g_lo > better:
    return "reproduced"
  if g_hi < worse:
    return "contradicted"
  return "inconclusive"


def _kind_p(kind: str, direction: str, margin: float, iv) -> float:
  """The p-value of the kind's own test (below ``1 - level`` iff shown)."""
  gain = _improvement(direction) * iv.mean
  if kind == "superior":
    return _one_sided_p(gain, iv.sd, iv.n, margin)
  if kind == "non_inferior":
    return _one_sided_p(gain, iv.sd, iv.n, -margin)
  return max(
    _one_sided_p(iv.mean, iv.sd, iv.n, -margin),
    _one_sided_p(-iv.mean, iv.sd, iv.n, -margin),
  )


def judge(
  a_values: Sequence[float],
  b_values: Sequence[float],
  *,
  kind: Kind,
  direction: Direction,
  margin: float,
  level: float = 0.95,
) -> Judgement:
  """The data's verdict on one comparison (module docstring's rules).

  The interval is `paired_interval` at ``2 level - 1`` (each end a
  one-sided ``level`` bound). Fewer than 2 pairs or a non-finite value
  give ``inconclusive``.

  Args:
    a_values: the variant's per-seed values, shape ``(n,)``.
    b_values: the baseline's values for the same seeds, same order.
    kind: one of `KINDS`.
    direction: one of `DIRECTIONS`.
    margin: the claim's margin, in metric units.
    level: the one-sided confidence level.

  Returns:
    `Judgement`: ``reproduced``, ``contradicted`` or ``inconclusive``, the
    interval (``None`` for one pair) and the p-value of the kind's test
    (superior: ``H_0`` gain ``<= m``; non-inferior: gain ``<= -m``;
    equivalent: the larger TOST p-value); ``None`` for one pair.

  Raises:
    ValueError: the lengths differ or are 0, ``kind`` or ``direction`` is
      not a valid name, ``level`` is not in ``(0.5, 1)`` or ``margin`` is
      negative or not finite.
  """
  _choices("judge", "kind", kind, KINDS)
  _choices("judge", "direction", direction, DIRECTIONS)
  if not 0.5 < level < 1:
    raise ValueError(f"judge: level must be in (0.5, 1), got level={level!r}")
  if not (math.isfinite(margin) and margin >= 0):
    raise ValueError(
      f"judge: margin must be a finite number >= 0, got margin={margin!r}"
    )
  if len(a_values) != len(b_values) or not len(a_values):
    raise ValueError(
      f"judge: a_values and b_values must have the same, non-zero length "
      f"(one value per seed), got {len(a_values)} and {len(b_values)}"
    )
  if len(a_values) < 2:
    return Judgement("inconclusive", None, None)
  iv = paired_interval(a_values, b_values, 2 * level - 1, direction=direction)
  p = _kind_p(kind, direction, margin, iv)
  if not all(map(math.isfinite, (iv.low, iv.high))):
    return Judgement("inconclusive", iv, p)
  return Judgement(_decide(kind, direction, margin, iv.low, iv.high), iv, p)


def _finite_or_none(x: float | None) -> float | None:
  return None if x is None or not math.isfinite(x) else float(x)


def _verdict(
  judged: Judgement, *, testable: bool, baseline_trained: bool
) -> str:
  if not testable:
    return NOT_TESTABLE
  if judged.verdict == "reproduced" and not baseline_trained:
    return "inconclusive"
  return judged.verdict


def _why(
  claim: Claim,
  judged: Judgement,
  verdict: str,
  *,
  testable: bool,
  baseline_trained: bool,
  reason: str | None,
) -> str:
  iv = judged.interval
  if iv is None:
    evidence = "one seed: no interval"
  else:
    pct = f"{100 * (2 * claim.level - 1):g}%"
    evidence = (
      f"{claim.a} - {claim.b} = {iv.mean:+.4g} [{iv.low:+.4g}, "
      f"{iv.high:+.4g}] ({pct} paired t, n={iv.n}, p={judged.p_value:.3g})"
    )
  rule = f"{claim.kind}, {claim.direction} is better, margin {claim.margin:g}"
  why = f"{evidence}; {rule}: {verdict}"
  if not testable:
    why += f" ({reason or 'phenomenon absent in the baseline'})"
  elif not baseline_trained:
    why += f" (baseline not trained: {reason or 'reason not given'})"
  elif reason:
    why += f" ({reason})"
  return why


def record(
  claim: Claim,
  seeds: Sequence[int | str],
  a_values: Sequence[float],
  b_values: Sequence[float],
  *,
  baseline_trained: bool,
  commit: Any,
  config: Any,
  testable: bool = True,
  reason: str | None = None,
) -> dict[str, Any]:
  """One claim's evidence and verdict as a JSON-able dict.

  Args:
    claim: the claim.
    seeds: the seeds, unique, in the order of the values.
    a_values: ``claim.a``'s value per seed.
    b_values: ``claim.b``'s value per seed.
    baseline_trained: False when the baseline did not train (diverged,
      stuck at chance): ``reproduced`` then becomes ``inconclusive``.
    commit: the code's commit, e.g. `commit`'s result (JSON-able).
    config: the runs' shared config (JSON-able).
    testable: False when the phenomenon is absent in the baseline at this
      scale: the verdict is ``"not testable at this scale"``.
    reason: why not testable or not trained (required then), or a note.

  Returns:
    A dict with the keys `RECORD_KEYS`: ``paper`` (``name``, ``arxiv``;
    ``source`` when the claim gives one), the claim's fields, ``seeds``,
    ``a_values``, ``b_values``, ``n``, ``mean_diff`` and ``sd_diff`` of
    ``a - b``, ``ci`` (``[low, high]``, the ``2 level - 1`` two-sided
    interval of the mean of ``a - b``, or
    ``None`` for one seed), ``p_value`` (of the kind's test), ``verdict``,
    a one-line ``why``, ``testable``, ``baseline_trained``, ``commit``,
    ``config``. Non-finite numbers are ``None`` (strict JSON).

  Raises:
    ValueError: ``claim`` is not a `Claim`, the lengths differ or are 0,
      seeds repeat, or ``testable=False`` comes without a ``reason``.
  """
  if not isinstance(claim, Claim):
    raise ValueError(f"record: claim must be a Claim, got {claim!r}")
  if not len(seeds) == len(a_values) == len(b_values) or not len(seeds):
    raise ValueError(
      f"record: seeds, a_values and b_values must have the same, non-zero "
      f"length (one value per seed), got {len(seeds)}, {len(a_values)} and "
      f"{len(b_values)}"
    )
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"record: seeds must be unique, got seeds={list(seeds)}")
  if not testable and not reason:
    raise ValueError(
      "record: testable=False needs a reason (what is absent in the "
      "baseline at this scale)"
    )
  a = [float(v) for v in a_values]
  b = [float(v) for v in b_values]
  judged = judge(
    a,
    b,
    kind=claim.kind,
    direction=claim.direction,
    margin=claim.margin,
    level=claim.level,
  )
  verdict = _verdict(
    judged, testable=testable, baseline_trained=baseline_trained
  )
  iv = judged.interval
  d = np.asarray(a) - np.asarray(b)
  return {
    "paper": {
      "name": claim.paper,
      "arxiv": claim.arxiv,
      **({} if claim.source is None else {"source": claim.source}),
    },
    "claim": claim.claim,
    "metric": claim.metric,
    "direction": claim.direction,
    "kind": claim.kind,
    "margin": float(claim.margin),
    "level": float(claim.level),
    "a": claim.a,
    "b": claim.b,
    "seeds": list(seeds),
    "a_values": [_finite_or_none(v) for v in a],
    "b_values": [_finite_or_none(v) for v in b],
    "n": len(seeds),
    "mean_diff": _finite_or_none(float(d.mean())),
    "sd_diff": None if iv is None else _finite_or_none(iv.sd),
    "ci": None
    if iv is None
    else [_finite_or_none(iv.low), _finite_or_none(iv.high)],
    "p_value": _finite_or_none(judged.p_value),
    "verdict": verdict,
    "why": _why(
      claim,
      judged,
      verdict,
      testable=testable,
      baseline_trained=baseline_trained,
      reason=reason,
    ),
    "testable": bool(testable),
    "baseline_trained": bool(baseline_trained),
    "commit": commit,
    "config": config,
  }


def _values(rec: Mapping[str, Any], key: str) -> list[float]:
  return [math.nan if v is None else float(v) for v in rec[key]]


def _judge_record(rec: Mapping[str, Any]) -> Judgement:
  return judge(
    _values(rec, "a_values"),
    _values(rec, "b_values"),
    kind=rec["kind"],
    direction=rec["direction"],
    margin=rec["margin"],
    level=rec["level"],
  )


def recompute(rec: Mapping[str, Any]) -> str:
  """The verdict that follows from a record's own fields.

  From the per-seed values, the claim's kind, direction, margin and level,
  ``testable``, ``baseline_trained`` and, when `holm` corrected the
  record, its ``holm`` entry (a ``reproduced`` that Holm did not reject is
  ``inconclusive``).

  Args:
    rec: a `record` (possibly after `holm` and a JSON round trip).

  Returns:
    One of `VERDICTS`.
  """
  verdict = _verdict(
    _judge_record(rec),
    testable=rec["testable"],
    baseline_trained=rec["baseline_trained"],
  )
  correction = rec.get("holm")
  if verdict == "reproduced" and correction and not correction["rejected"]:
    return "inconclusive"
  return verdict


def straddles(rec: Mapping[str, Any]) -> bool:
  """Whether a record's interval straddles the margin its verdict turns on.

  True for a testable claim with a trained baseline whose interval
  contains the bound that would decide it: ``m`` for ``superior`` (``g_lo
  <= m < g_hi``, so a gain smaller than ``m`` is excluded: more seeds can
  only show it smaller), ``-m`` for ``non_inferior``, ``-m`` or ``m`` for
  ``equivalent``. These are the claims more seeds could decide; a
  decided, untestable or single-seed claim is False.

  Args:
    rec: a `record` (possibly after `holm` and a JSON round trip).
  """
  ci, m = rec["ci"], rec["margin"]
  if not rec["testable"] or not rec["baseline_trained"]:
    return False
  if ci is None or None in ci or _judge_record(rec).verdict != "inconclusive":
    return False
  low, high = ci
  if rec["kind"] == "equivalent":
    return low <= -m <= high or low <= m <= high
  sign = _improvement(rec["direction"])
  g_lo, g_hi = sorted((sign * low, sign * high))
  if rec["kind"] == "superior":
    return g_lo <= m < g_hi
  return g_lo <= -m <= g_hi


def _in_family(rec: Mapping[str, Any]) -> bool:
  return (
    rec["kind"] == "superior"
    and rec["p_value"] is not None
    and rec["verdict"] != NOT_TESTABLE
  )


def holm(
  records: Sequence[Mapping[str, Any]], *, alpha: float | None = None
) -> list[dict[str, Any]]:
  """Holm-Bonferroni across the superiority claims of one table.

  The family is every ``superior`` record with a p-value (two seeds or
  more, testable). Sorted by p-value, ``p_(1) <= ... <= p_(m)``, the
  hypotheses ``1..k`` are rejected where ``k`` is the largest with
  ``p_(j) <= alpha / (m - j + 1)`` for every ``j <= k``. A ``reproduced``
  record that is not rejected becomes ``inconclusive``; nothing else
  changes (no other verdict, no other kind).

  Args:
    records: `record` dicts, none corrected before.
    alpha: the family's error rate; ``None``: ``1 - level`` of the
      family's records, which must then share one level.

  Returns:
    New records in the same order; each family member gains ``holm``:
    ``alpha``, ``family`` (``m``), ``rank`` (``j``), ``threshold``
    (``alpha / (m - j + 1)``) and ``rejected``.

  Raises:
    ValueError: a record was already corrected, or ``alpha`` is ``None``
      and the family's levels differ.
  """
  out = [dict(r) for r in records]
  if any("holm" in r for r in out):
    raise ValueError(
      "holm: a record already has a holm entry; correct each table once, "
      "from the uncorrected records"
    )
  family = [i for i, r in enumerate(out) if _in_family(r)]
  if not family:
    return out
  if alpha is None:
    levels = sorted({out[i]["level"] for i in family})
    if len(levels) != 1:
      raise ValueError(
        f"holm: the superiority claims have different levels {levels}; "
        f"pass alpha= for the family"
      )
    alpha = 1 - levels[0]
  order = sorted(family, key=lambda i: out[i]["p_value"])
  m, still = len(order), True
  for j, i in enumerate(order):
    threshold = alpha / (m - j)
    still = still and out[i]["p_value"] <= threshold
    out[i]["holm"] = {
      "alpha": alpha,
      "family": m,
      "rank": j + 1,
      "threshold": threshold,
      "rejected": still,
    }
    if out[i]["verdict"] == "reproduced" and not still:
      out[i]["verdict"] = "inconclusive"
      out[i]["why"] += (
        f"; Holm over {m}: p={out[i]['p_value']:.3g} not rejected at "
        f"alpha/{m - j}={threshold:.3g}: inconclusive"
      )
  return out


def _same(x: Any, y: Any) -> bool:
  if x is None or y is None:
    return x is y
  if isinstance(x, list):
    return len(x) == len(y) and all(map(_same, x, y))
  return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def check_records(records: Sequence[Mapping[str, Any]]) -> None:
  """Raises unless every record's verdict and numbers follow from it.

  Each record's ``verdict`` must equal `recompute`'s, its ``mean_diff``,
  ``sd_diff``, ``ci`` and ``p_value`` the recomputed ones; the records
  with a ``holm`` entry must be one family whose entries `holm` gives.

  Args:
    records: `record` dicts (one table).

  Raises:
    ValueError: names the first record (index and claim) and field that
      differ, with the stored and the recomputed values.
  """
  for i, rec in enumerate(records):
    where = f"check_records: record {i} ({rec['claim']!r})"
    got = recompute(rec)
    if got != rec["verdict"]:
      raise ValueError(
        f"{where}: stored verdict {rec['verdict']!r} but its values give "
        f"{got!r}; rewrite the record with claims.record"
      )
    judged = _judge_record(rec)
    iv = judged.interval
    fresh = {
      "mean_diff": _finite_or_none(
        float(
          np.mean(
            np.subtract(_values(rec, "a_values"), _values(rec, "b_values"))
          )
        )
      ),
      "sd_diff": None if iv is None else _finite_or_none(iv.sd),
      "ci": None
      if iv is None
      else [_finite_or_none(iv.low), _finite_or_none(iv.high)],
      "p_value": _finite_or_none(judged.p_value),
    }
    for key, value in fresh.items():
      if not _same(rec[key], value):
        raise ValueError(
          f"{where}: stored {key}={rec[key]!r} but its values give {value!r}"
        )
  corrected = [r for r in records if "holm" in r]
  if not corrected:
    return
  raw = []
  for r in corrected:
    stripped = {k: v for k, v in r.items() if k != "holm"}
    stripped["verdict"] = _verdict(
      _judge_record(r),
      testable=r["testable"],
      baseline_trained=r["baseline_trained"],
    )
    raw.append(stripped)
  redone = holm(raw, alpha=corrected[0]["holm"]["alpha"])
  for r, fresh in zip(corrected, redone):
    if fresh.get("holm") != r["holm"]:
      raise ValueError(
        f"check_records: record ({r['claim']!r}) has holm={r['holm']} but "
        f"Holm over the {len(corrected)} corrected records gives "
        f"{fresh.get('holm')}"
      )


def commit(path: str | pathlib.Path | None = None) -> dict[str, Any]:
  """The git commit of the working tree holding ``path``, and if it is dirty.

  Reads only (``git rev-parse HEAD`` and ``git --no-optional-locks status
  --porcelain --untracked-files=no``): the index is not refreshed. Dirty
  means a tracked file differs from the commit; untracked files (runs,
  results) do not count.

  Args:
    path: a folder inside the working tree; ``None``: this package's.

  Returns:
    ``{"sha": <40 hex digits>, "dirty": bool}``, or ``{"sha": "unknown",
    "dirty": None}`` outside a git working tree or without git.
  """
  where = pathlib.Path(__file__).parent if path is None else pathlib.Path(path)

  def git(*args: str) -> str | None:
    try:
      done = subprocess.run(
        ["git", "--no-optional-locks", *args],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
      )
    except (OSError, subprocess.SubprocessError):
      return None
    return done.stdout if done.returncode == 0 else None

  sha = git("rev-parse", "HEAD")
  status = git("status", "--porcelain", "--untracked-files=no")
  if sha is None or status is None:
    return {"sha": "unknown", "dirty": None}
  return {"sha": sha.strip(), "dirty": bool(status.strip())}
