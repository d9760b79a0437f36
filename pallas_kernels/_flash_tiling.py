"""`AttentionTiling`: the static tiling of the flash attention kernels.

Its own module so that `pallas_kernels.attention` (which chooses the tiles,
`attention_block_heuristic`) and the lowerings that read them
(`pallas_kernels._flash_blocked`) both import it and neither imports the
other back; `pallas_kernels.attention.AttentionTiling` is this class.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels import mosaic_gpu_attention as mga


@dataclasses.dataclass(frozen=True)
class AttentionTiling:
  """Static tiling of the flash kernels.

  Attributes:
    lowering: ``"mosaic_gpu"``, ``"triton"`` or ``"tpu"``.
    block_q: query rows per program.
    block_k: keys per inner-loop step.
    q_len: padded query length (a multiple of ``block_q``).
    kv_len: padded key length (a multiple of ``block_k``).
  """

  lowering: str
  block_q: int
  block_k: int
  q_len: int
  kv_len: int

  def __post_init__(self):
    for name in ("block_q", "block_k"):
      v = getattr(self, name)
      if v < 1:
        raise ValueError(f"AttentionTiling: {name} must be >= 1, got {v}")
      if self.lowering == "triton" and (v & (v - 1) or v < 16):
        raise ValueError(
          f"AttentionTiling: the triton lowering needs "
          f"a power-of-two {name} >= 16, got {name}={v}"
        )
      if self.lowering == "mosaic_gpu" and v not in mga.BLOCKS:
        raise ValueError(
          f"AttentionTiling: the mosaic_gpu lowering needs {name} in "
          f"{mga.BLOCKS}, got {name}={v}"
        )
    if self.lowering == "tpu":
      if self.block_q % 8:
        raise ValueError(
          f"AttentionTiling: the tpu lowering needs block_q "
          f"to be a multiple of 8, got {self.block_q}"
        )
      if self.block_k % 128:
        raise ValueError(
          f"AttentionTiling: the tpu lowering needs block_k "
          f"to be a multiple of 128 (a lane tile), got "
          f"{self.block_k}"
        )
    if self.q_len % self.block_q or self.kv_len % self.block_k:
      raise ValueError(
        "AttentionTiling: padded lengths must be multiples of the blocks"
      )
