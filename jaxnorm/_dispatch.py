"""`implementation=` dispatch between a pure reference and a Pallas kernel.

``"xla"`` is the reference; ``"pallas"`` is the kernel, and any
`NotImplementedError` it raises (naming the unsupported case) reaches the
caller; ``None`` picks the kernel when the program is compiled for a GPU or
a TPU and the kernel supports the case, and the reference otherwise (always
for a CPU). The target is the devices the program is compiled for, not the
machine's default backend (`jaxnorm._target.current`: the current mesh,
else the arguments' shardings, else the default backend), so a program
compiled for a deviceless H100 or TPU mesh gets the kernels it would get on
the chip.

Kernels are found through one table, `KERNEL_FAMILIES`: each family names
the `pallas_kernels` module that holds its kernels and the kernels it
provides, so every function with ``implementation=`` names its kernel by a
`KernelName`. The module is imported on the first kernel call, so jaxnorm
imports without `pallas_kernels` being usable (CPU-only jaxlib).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from jaxnorm import _checks, _target

Implementation = Literal["xla", "pallas"]
IMPLEMENTATIONS: tuple[Any, ...] = (None, "xla", "pallas")

Family = Literal["norms", "attention", "linear_attention"]
NormKernel = Literal[
  "rms_norm_pallas",
  "layer_norm_pallas",
  "add_rms_norm_pallas",
  "add_layer_norm_pallas",
  "dyt_pallas",
  "seed_norm_pallas",
]
AttentionKernel = Literal[
  "dot_product_attention_pallas",
  "sink_attention_pallas",
  "affine_scaled_attention_pallas",
]
LinearAttentionKernel = Literal["causal_linear_attention_pallas"]
KernelName = Literal[NormKernel, AttentionKernel, LinearAttentionKernel]


@dataclasses.dataclass(frozen=True)
class KernelFamily:
  """Where one family's kernels live.

  Attributes:
    module: the `pallas_kernels` module, imported on first use.
    kernels: the kernel functions it provides (attributes of ``module``).
  """

  module: str
  kernels: tuple[str, ...]


KERNEL_FAMILIES: Mapping[Family, KernelFamily] = {
  "norms": KernelFamily("pallas_kernels.norms", typing.get_args(NormKernel)),
  "attention": KernelFamily(
    "pallas_kernels.attention", typing.get_args(AttentionKernel)
  ),
  "linear_attention": KernelFamily(
    "pallas_kernels.linear_attention", typing.get_args(LinearAttentionKernel)
  ),
}


def family_of(kernel: KernelName) -> Family:
  """The family whose module provides ``kernel``.

  Raises:
    ValueError: for a kernel that is in no family, listing the known ones.
  """
  for family, spec in KERNEL_FAMILIES.items():
    if kernel in spec.kernels:
      return family
  known = tuple(k for spec in KERNEL_FAMILIES.values() for k in spec.kernels)
  raise ValueError(
    f"_dispatch: kernel {kernel!r} is in no family of KERNEL_FAMILIES; "
    f"known kernels: {known}"
  )


def check_implementation(who: str, implementation: Any) -> None:
  """Raises `ValueError` for an unknown ``implementation``."""
  _checks.check_choice(who, "implementation", implementation, IMPLEMENTATIONS)


def _kernel(name: KernelName) -> Callable[..., Any]:
  """Imports the family module of kernel ``name`` and returns the kernel."""
  module = KERNEL_FAMILIES[family_of(name)].module
  return getattr(importlib.import_module(module), name)


def kernel_or_none(
  who: str,
  implementation: Implementation | None,
  kernel: KernelName,
  call_kernel: Callable[[Callable[..., Any]], Any],
  arrays: Sequence[Any] = (),
) -> Any:
  """The kernel's result, or ``None`` when the reference should run.

  Args:
    who: public function name for error messages.
    implementation: ``"xla"``, ``"pallas"`` or ``None``.
    kernel: a kernel of `KERNEL_FAMILIES`.
    call_kernel: calls the given kernel function with the user's arguments.
    arrays: the array arguments, whose shardings name the target when no
      mesh is set (`jaxnorm._target.current`).

  Returns:
    The kernel output, or ``None`` for ``"xla"``, for ``None`` when the
    target is not a GPU or TPU, and for ``None`` on a case the kernel does
    not support.

  Raises:
    ValueError: for an unknown ``implementation``.
    NotImplementedError: for ``"pallas"`` on a case the kernel lacks; the
      message starts with ``who(implementation='pallas')`` and names the
      case.
  """
  check_implementation(who, implementation)
  if implementation == "xla":
    return None
  if implementation is None and not _target.current(*arrays).accelerator:
    return None
  fn = _kernel(kernel)
  if implementation == "pallas":
    try:
      return call_kernel(fn)
    except NotImplementedError as e:
      raise NotImplementedError(f"{who}(implementation='pallas'): {e}") from e
  try:
    return call_kernel(fn)
  except NotImplementedError:
    return None


def dispatch(
  who: str,
  implementation: Implementation | None,
  kernel: KernelName,
  call_kernel: Callable[[Callable[..., Any]], Any],
  call_reference: Callable[[], Any],
  arrays: Sequence[Any] = (),
) -> Any:
  """Runs the kernel named ``kernel`` or, per `kernel_or_none`, the reference.

  Args:
    who: public function name for error messages.
    implementation: ``"xla"``, ``"pallas"`` or ``None``.
    kernel: a kernel of `KERNEL_FAMILIES`.
    call_kernel: calls the given kernel function with the user's arguments.
    call_reference: calls the reference.
    arrays: the array arguments (see `kernel_or_none`).

  Returns:
    Whatever the chosen callable returns.

  Raises:
    ValueError: for an unknown ``implementation``.
    NotImplementedError: for ``"pallas"`` on a case the kernel lacks.
  """
  out = kernel_or_none(who, implementation, kernel, call_kernel, arrays)
  return call_reference() if out is None else out
