"""One argument builder per public pure function: ``BUILDERS``.

``BUILDERS["<package>.<name>"]`` is a `Spec` whose ``build(draw, fill)``
returns the `Case` of one call: ``fill.data`` for the fuzzed inputs (they
take the drawn dtype and value kind), ordinary parameters otherwise, and the
documented shape and dtype of the output. Where a function is defined on a
narrower domain (positive inputs, probabilities, integer labels), the
builder stays inside it and says so in ``kinds`` or in the arguments. The
builders live in one module per group of families (``_build_*.py``);
tests/fuzz/test_builders.py fails for a public function without a builder.
"""

from tests.fuzz import (
  _build_attention,
  _build_cplx,
  _build_misc,
  _build_norms,
  _cases,
)

BUILDERS: dict[str, _cases.Spec] = {
  **_build_norms.NORMS,
  **_build_norms.FUSED_NORMS,
  **_build_norms.ACTIVATIONS,
  **_build_attention.ATTENTION,
  **_build_misc.RESIDUAL,
  **_build_misc.RL,
  **_build_misc.QUANT,
  **_build_misc.LOOPED,
  **_build_misc.ANALYSIS,
  **_build_misc.GRAPH,
  **_build_misc.DEPTH_METRICS,
  **_build_cplx.CPLX,
}
