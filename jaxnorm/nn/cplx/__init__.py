"""Complex-valued nnx modules: layers, norms, attention cores and models.

Every module declares its parameters (complex ones in ``param_dtype``
complex64 unless stated) and calls one pure function of `jaxnorm.cplx`; the
maths and references live there. One module per family:

* `jaxnorm.nn.cplx.layers`: `ComplexDense`, `ComplexConv`, `ModReLU` and
  the complex inits `complex_glorot`, `complex_he`, `cnet_input_init`
  (CNet's ``CInput``) and `torch_linear_init` (PyTorch's ``nn.Linear``).
* `jaxnorm.nn.cplx.norms`: `ComplexBatchNorm`, `ComplexLayerNorm`,
  `ComplexRMSNorm`, `PCTRMSNorm` (complex-native, or real pairs with
  ``real_pairs=True``) and their registry entries `NORM_SPECS`.
* `jaxnorm.nn.cplx.cnet`: `FourierHadamardConv` (CNet's padded
  FFT-Hadamard convolution).
* `jaxnorm.nn.cplx.born`, `jaxnorm.nn.cplx.complexformer`,
  `jaxnorm.nn.cplx.pct`, `jaxnorm.nn.cplx.softmax`: the cores
  `BornAttention`, `ComplexFormerAttention`, `PCTAttention`,
  `ComplexSoftmaxAttention` for `MultiHeadAttention`; their registry
  entries `ATTENTION_SPECS` are in `jaxnorm.nn.cplx._registry`.
* `jaxnorm.nn.cplx.multihead`: `ComplexMultiHeadAttention` (complex
  projections and RoPE around a complex core of the attention registry).
* `jaxnorm.nn.cplx.models`: `ComplexLM` (CNet / PCT style language model,
  built from the complex norms and cores of the registries by name, or
  CNet's causal Fourier mixing, `FOURIER`; `ComplexLMConfig.cnet_official`
  and `ComplexLMConfig.pct_official` are the official stacks) and `CVCNN`
  (the CV-CNN of the CNN vs CV-CNN study).

Complex parameters need conjugated gradients: train them with
`jaxnorm.optim.complex.complex_adam` (plain optax climbs the loss in every
imaginary part).

Examples:
  >>> from flax import nnx
  >>> norm = ComplexRMSNorm(4, rngs=nnx.Rngs(0))  # complex-native
  >>> norm.scale[...].dtype, NORM_SPECS["complexrmsnorm"].dtype_kind
  (dtype('complex64'), 'complex')
"""

from jaxnorm.nn.cplx._registry import ATTENTION_SPECS
from jaxnorm.nn.cplx.born import BornAttention
from jaxnorm.nn.cplx.cnet import FourierHadamardConv
from jaxnorm.nn.cplx.complexformer import ComplexFormerAttention
from jaxnorm.nn.cplx.layers import (
  ComplexConv,
  ComplexDense,
  ModReLU,
  Names,
  cnet_input_init,
  complex_glorot,
  complex_he,
  torch_linear_init,
)
from jaxnorm.nn.cplx.models import (
  CVCNN,
  FOURIER,
  ComplexBlock,
  ComplexLM,
  ComplexLMConfig,
  CVCNNConfig,
  count_real_parameters,
)
from jaxnorm.nn.cplx.multihead import ComplexMultiHeadAttention
from jaxnorm.nn.cplx.norms import (
  NORM_SPECS,
  ComplexBatchNorm,
  ComplexLayerNorm,
  ComplexRMSNorm,
  PCTRMSNorm,
)
from jaxnorm.nn.cplx.pct import PCTAttention
from jaxnorm.nn.cplx.softmax import ComplexSoftmaxAttention

__all__ = [
  "ATTENTION_SPECS",
  "CVCNN",
  "FOURIER",
  "NORM_SPECS",
  "BornAttention",
  "CVCNNConfig",
  "ComplexBatchNorm",
  "ComplexBlock",
  "ComplexConv",
  "ComplexDense",
  "ComplexFormerAttention",
  "ComplexLM",
  "ComplexLMConfig",
  "ComplexLayerNorm",
  "ComplexMultiHeadAttention",
  "ComplexRMSNorm",
  "ComplexSoftmaxAttention",
  "FourierHadamardConv",
  "ModReLU",
  "Names",
  "PCTAttention",
  "PCTRMSNorm",
  "cnet_input_init",
  "complex_glorot",
  "complex_he",
  "count_real_parameters",
  "torch_linear_init",
]
