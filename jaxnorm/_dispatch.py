"""`implementation=` dispatch between a pure reference and a Pallas kernel.

``"xla"`` is the reference; ``"pallas"`` is the kernel of the same name plus
``_pallas`` in `pallas_kernels.norms`, and any `NotImplementedError` it raises
(naming the unsupported case) reaches the caller; ``None`` picks the kernel
on GPU/TPU when it supports the case and the reference otherwise (always on
CPU). `pallas_kernels` is imported lazily, so jaxnorm imports without it
being usable (CPU-only jaxlib).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

import jax

from jaxnorm import _checks

Implementation = Literal["xla", "pallas"]
IMPLEMENTATIONS: tuple[Any, ...] = (None, "xla", "pallas")
_ACCELERATORS = ("gpu", "cuda", "rocm", "tpu")


def check_implementation(who: str, implementation: Any) -> None:
  """Raises `ValueError` for an unknown ``implementation``."""
  _checks.check_choice(who, "implementation", implementation, IMPLEMENTATIONS)


def _backend() -> str:
  """The default backend's platform name (a seam for dispatch tests)."""
  return jax.default_backend()


def _kernel(name: str) -> Callable[..., Any]:
  return getattr(importlib.import_module("pallas_kernels.norms"), name)


def kernel_or_none(
  who: str,
  implementation: Implementation | None,
  kernel: str,
  call_kernel: Callable[[Callable[..., Any]], Any],
) -> Any:
  """The kernel's result, or ``None`` when the reference should run.

  Args:
    who: public function name for error messages.
    implementation: ``"xla"``, ``"pallas"`` or ``None``.
    kernel: attribute of `pallas_kernels.norms`.
    call_kernel: calls the given kernel function with the user's arguments.

  Returns:
    The kernel output, or ``None`` for ``"xla"``, for ``None`` on CPU and for
    ``None`` on a case the kernel does not support.

  Raises:
    ValueError: for an unknown ``implementation``.
    NotImplementedError: for ``"pallas"`` on a case the kernel lacks; the
      message starts with ``who(implementation='pallas')`` and names the
      case.
  """
  check_implementation(who, implementation)
  if implementation == "xla":
    return None
  if implementation is None and _backend() not in _ACCELERATORS:
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
  kernel: str,
  call_kernel: Callable[[Callable[..., Any]], Any],
  call_reference: Callable[[], Any],
) -> Any:
  """Runs the kernel named ``kernel`` or, per `kernel_or_none`, the reference.

  Args:
    who: public function name for error messages.
    implementation: ``"xla"``, ``"pallas"`` or ``None``.
    kernel: attribute of `pallas_kernels.norms`.
    call_kernel: calls the given kernel function with the user's arguments.
    call_reference: calls the reference.

  Returns:
    Whatever the chosen callable returns.

  Raises:
    ValueError: for an unknown ``implementation``.
    NotImplementedError: for ``"pallas"`` on a case the kernel lacks.
  """
  out = kernel_or_none(who, implementation, kernel, call_kernel)
  return call_reference() if out is None else out
