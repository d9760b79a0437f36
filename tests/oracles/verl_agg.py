"""NumPy float64 restatement of verl's ``agg_loss`` (tests only).

Source (read, not copied): ``verl/trainer/ppo/core_algos.py``, function
``agg_loss``, in ``verl-project/verl`` (formerly ``volcengine/verl``) at
commit 1dda039b9c6311889a9c9a26040677e1254814f9 (2026-08-22); the function is
identical in release v0.9.0 (483b8a009ba3a97563edee3a19887e4862b8094a) and in
the copy vendored by ``HKUST-KnowComp/CorrGRPO`` (commit 3586915ec333). Its
``masked_sum`` is ``verl/utils/torch_functional.py``'s (``where(mask, v, 0)``
summed), at the same commit.

What the source computes, with ``m`` the 0/1 mask of shape ``(B, T)``,
``L`` the loss matrix and ``n_i = sum_t m_it`` the valid tokens of row i:

* ``token-mean``: ``sum(m * L) / batch_num_tokens * dp_size``, with
  ``batch_num_tokens = sum(m)`` when not given (required when dp_size > 1);
* ``token-sum`` (added in verl v0.9.0, PR #7197): ``sum(m * L) * dp_size``;
* ``seq-mean-token-sum``: ``sum_{i: n_i > 0} s_i / global_batch_size *
  dp_size`` with ``s_i = sum_t m_it L_it``; ``global_batch_size`` defaults to
  the number of rows with ``n_i > 0`` (fully masked rows are excluded);
* ``seq-mean-token-sum-norm``: the previous value divided by
  ``loss_scale_factor`` (default ``T = loss_mask.shape[-1]``). Before verl PR
  #5417 (2026-02-26, first released in v0.7.1) this mode was
  ``sum_i s_i / loss_scale_factor`` with no division by the batch size;
* ``seq-mean-token-mean``: as seq-mean-token-sum with
  ``s_i = sum_t m_it L_it / (n_i + 1e-8)``.

No guard: a batch without valid tokens gives 0/0 = NaN, as in the source.
Written as explicit loops over rows and tokens, independent of
``jaxnorm.rl``.
"""

from __future__ import annotations

import numpy as np

MODES = (
  "token-mean",
  "token-sum",
  "seq-mean-token-sum",
  "seq-mean-token-sum-norm",
  "seq-mean-token-mean",
)


def agg_loss(
  loss_mat,
  loss_mask,
  loss_agg_mode,
  *,
  dp_size=1,
  batch_num_tokens=None,
  global_batch_size=None,
  loss_scale_factor=None,
):
  """verl's aggregation of a ``(B, T)`` loss matrix into a scalar."""
  loss = np.asarray(loss_mat, np.float64)
  mask = np.asarray(loss_mask).astype(np.float64)
  rows, horizon = loss.shape
  masked = np.zeros_like(loss)
  for i in range(rows):
    for t in range(horizon):
      masked[i, t] = loss[i, t] if mask[i, t] else 0.0
  with np.errstate(divide="ignore", invalid="ignore"):
    if loss_agg_mode == "token-mean":
      if batch_num_tokens is None:
        if dp_size > 1:
          raise ValueError("batch_num_tokens is required when dp_size > 1")
        batch_num_tokens = mask.sum()
      return np.float64(masked.sum()) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
      return np.float64(masked.sum()) * dp_size
    counts = mask.sum(-1)
    keep = counts > 0  # fully masked rows are excluded
    if global_batch_size is None:
      if dp_size > 1:
        raise ValueError("global_batch_size is required when dp_size > 1")
      global_batch_size = keep.sum()
    total = 0.0
    for i in range(rows):
      row = masked[i].sum()
      if loss_agg_mode == "seq-mean-token-mean":
        row = row / (counts[i] + 1e-8)
      if keep[i]:
        total += row
    if loss_agg_mode not in MODES:
      raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    out = np.float64(total) / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
      out = out / (horizon if loss_scale_factor is None else loss_scale_factor)
    return out


def token_sum_norm_v070(loss_mat, loss_mask, *, loss_scale_factor=None):
  """``seq-mean-token-sum-norm`` as verl v0.7.0 computed it (before #5417).

  ``sum_i s_i / loss_scale_factor``: no division by the number of rows.
  Kept to document the change; jaxnorm follows the current code.
  """
  loss = np.asarray(loss_mat, np.float64)
  mask = np.asarray(loss_mask).astype(np.float64)
  factor = loss.shape[-1] if loss_scale_factor is None else loss_scale_factor
  return np.where(mask > 0, loss * mask, 0.0).sum() / factor
