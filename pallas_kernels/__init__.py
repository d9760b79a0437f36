"""Pallas kernels for jaxnorm's hot loops (GPU and TPU lowerings).

Each kernel has the signature of its pure-jnp reference in `jaxnorm` and is
tested against it in interpret mode on CPU.
"""
