"""Complex-valued networks as pure functions (complex in, complex out).

Conventions shared by every function here:

* Arrays are complex with features last; the real layout of a complex array
  is split halves ``[Re | Im]`` (`to_complex` / `to_real`).
* Statistics and compute in complex64 / float32; complex128 / float64
  inputs stay 64-bit. There is no complex bfloat16: real half-precision
  pairs are upcast by `to_complex`. Outputs keep the input dtype.
* Every non-holomorphic kink (``|z|``, ``arg z``, ``z/|z|``) has a finite
  gradient at 0 (`modulus`, `phase`, `unit_phasor`).
* JAX's gradient of a real loss is ``conj(2 dL/dz̄)``: descend along its
  conjugate (`jaxnorm.optim.complex.conjugate_complex`).
* Pallas has no complex support, so there are no kernels.

Modules, one per paper or family: `basics` (layout and safe kinks),
`norms` (Deep Complex Networks whitening, CNet TokenNorm, the PCT's RMS
norm, block L2 norm),
`activations`, `layers` (dense, conv, complex RoPE, widely-linear
conversion), `born` (CNet's Born rule: probabilities, cross-entropy,
attention), `cnet` (CNet's causal Fourier mixing, FFT-Hadamard
convolution, Pad and MeanPool), `complexformer`
(ComplexFormer attention), `pct` (Phase-Coherent Transformer attention and
gates), `softmax` (complex softmax attention) and `fairy2i` (PhaseQuant).
``__all__`` holds the functions, the state of `complex_batch_norm` and two
name tables: `ACTIVATIONS` (name -> activation) and `PCT_GATES` (the
``gate`` names of `pct_attention`).

Examples:
  Every example in this package assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import cplx
  >>> z = cplx.to_complex(jnp.array([3.0, 0.0, 4.0, 1.0]))  # [Re | Im]
  >>> print(np.asarray(z), np.asarray(cplx.modulus(z)))
  [3.+4.j 0.+1.j] [5. 1.]
"""

from jaxnorm.cplx.activations import (
  ACTIVATIONS,
  cardioid,
  crelu,
  modrelu,
  split_gelu,
  zrelu,
)
from jaxnorm.cplx.basics import (
  complex_power,
  modulus,
  modulus_squared,
  phase,
  to_complex,
  to_real,
  unit_phasor,
)
from jaxnorm.cplx.born import (
  born_attention,
  born_attention_weights,
  born_cross_entropy,
  born_probs,
)
from jaxnorm.cplx.cnet import (
  causal_fourier_mix,
  fourier_hadamard_conv,
  local_kernel_index,
  mean_pool,
  pad_kernel,
)
from jaxnorm.cplx.complexformer import (
  complexformer_attention,
  complexformer_logits,
)
from jaxnorm.cplx.fairy2i import (
  binary_quantize_kernel,
  fairy2i_quantize_kernel,
  phase_codes,
  phase_quantize,
  ternary_quantize_kernel,
)
from jaxnorm.cplx.layers import (
  complex_conv,
  complex_dense,
  complex_rope,
  real_from_widely_linear,
  widely_linear,
  widely_linear_from_real,
)
from jaxnorm.cplx.norms import (
  ComplexBatchNormState,
  complex_batch_norm,
  complex_l2_normalize,
  complex_layer_norm,
  complex_rms_norm,
  init_complex_batch_norm_state,
  init_whitening_scale,
  pct_rms_norm,
)
from jaxnorm.cplx.pct import PCT_GATES, pct_attention
from jaxnorm.cplx.softmax import complex_softmax_attention

__all__ = [
  "ACTIVATIONS",
  "PCT_GATES",
  "ComplexBatchNormState",
  "binary_quantize_kernel",
  "born_attention",
  "born_attention_weights",
  "born_cross_entropy",
  "born_probs",
  "cardioid",
  "causal_fourier_mix",
  "complex_batch_norm",
  "complex_conv",
  "complex_dense",
  "complex_l2_normalize",
  "complex_layer_norm",
  "complex_power",
  "complex_rms_norm",
  "complex_rope",
  "complex_softmax_attention",
  "complexformer_attention",
  "complexformer_logits",
  "crelu",
  "fairy2i_quantize_kernel",
  "fourier_hadamard_conv",
  "init_complex_batch_norm_state",
  "init_whitening_scale",
  "local_kernel_index",
  "mean_pool",
  "modrelu",
  "modulus",
  "modulus_squared",
  "pad_kernel",
  "pct_attention",
  "pct_rms_norm",
  "phase",
  "phase_codes",
  "phase_quantize",
  "real_from_widely_linear",
  "split_gelu",
  "ternary_quantize_kernel",
  "to_complex",
  "to_real",
  "unit_phasor",
  "widely_linear",
  "widely_linear_from_real",
  "zrelu",
]
