r"""Advantage normalization and policy losses for RL fine-tuning of LMs.

GRPO normalizes each response's reward by its group's statistics (one group =
the ``G`` responses sampled for one prompt); Dr.GRPO drops the division by
the standard deviation; CorrGRPO divides the centred total of ``K`` reward
components by the square root of the sum of their correlations; GDPO
normalizes every component on its own, sums them and whitens over the batch.
Groups sit on axis ``-1`` (``-2`` with components last); leading axes are
independent batches of groups. Statistics are computed in float32 (float64
stays), outputs come back in that compute dtype.

ERPO (arXiv:2603.28204) is **not** implemented: its three components
(entropy-aware gating at "critical decision pivots", bucket-based implicit
normalization, result-anchored advantage synthesis) are specified in nothing
that could be read (abstract only, no code). Only its verifiable ingredient,
the per-token policy entropy, is here (`token_entropy`).

The public path of every name is ``jaxnorm.rl.<name>``; the modules are
`grpo` (GRPO, Dr.GRPO and the clipped policy loss), `corrgrpo` and `gdpo`,
with `token_entropy` and `kl_k3` in the shared `_common`. ``__all__`` holds
the functions and the ``Literal`` types of their options; the tuples of
allowed values (``AGGREGATIONS``...) are not part of it.

Examples:
  Every example in this package assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import rl
  >>> r = jnp.array([1.0, 0.0, 0.0, 1.0])  # one group of G = 4 responses
  >>> print(np.asarray(rl.grpo_advantages(r)).round(4))  # (r - 0.5) / std
  [ 0.866 -0.866 -0.866  0.866]

References:
  Shao et al., *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in
  Open Language Models*, arXiv:2402.03300 (2024).
  Liu et al., *Understanding R1-Zero-Like Training: A Critical Perspective*
  (Dr.GRPO), arXiv:2503.20783 (2025).
  HKUST-KnowComp, *CorrGRPO* (official code, ``verl/trainer/ppo/
  core_algos.py``; arXiv id not confirmed).
  Liu et al., *GDPO: Group reward-Decoupled Normalization Policy
  Optimization*, arXiv:2601.05242 (2026).
"""

from jaxnorm.rl._common import kl_k3, token_entropy
from jaxnorm.rl.corrgrpo import corrgrpo_advantages
from jaxnorm.rl.gdpo import GdpoNormalization, gdpo_advantages
from jaxnorm.rl.grpo import (
  AGGREGATIONS,  # noqa: F401 (not public; tests)
  Aggregation,
  Singleton,
  grpo_advantages,
  grpo_policy_loss,
  grpo_process_advantages,
)

__all__ = [
  "Aggregation",
  "GdpoNormalization",
  "Singleton",
  "corrgrpo_advantages",
  "gdpo_advantages",
  "grpo_advantages",
  "grpo_policy_loss",
  "grpo_process_advantages",
  "kl_k3",
  "token_entropy",
]
