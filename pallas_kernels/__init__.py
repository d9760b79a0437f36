"""Pallas kernels for jaxnorm's hot loops (GPU and TPU lowerings).

Each kernel has the signature of its pure-jnp reference in `jaxnorm` plus
keyword-only knobs (``block_rows`` or ``block_q``/``block_k``/``chunk_size``,
and ``interpret``), and is tested against it in interpret mode on CPU and by
cross-lowering to Triton and Mosaic with `jax.export`:

* `pallas_kernels.norms`: RMSNorm, LayerNorm, fused residual-add + RMSNorm /
  LayerNorm, DyT, SeeDNorm; forward and backward kernels.
* `pallas_kernels.attention`: flash attention (causal and boolean masks, GQA,
  learned sinks) forward and backward; affine-scaled attention on top.
* `pallas_kernels.linear_attention`: chunked causal linear attention
  (forward kernel; backward is the reference's VJP).
* `pallas_kernels.sharding`: `shard_rows` / `shard_heads`, running the
  kernels inside `jax.shard_map` on a (data, tensor) mesh.

The jaxnorm functions reach these kernels through ``implementation=``
(``"pallas"``, or None on GPU/TPU) and one table, `jaxnorm._dispatch.
KERNEL_FAMILIES`, mapping each family to its module here. Kernels import
their reference's tables (feature maps, masked-logit constant, running
estimate) instead of copying them. Submodules are imported on use; this
package imports on a CPU-only jaxlib.
"""
