"""The experiment engine: data, optimizers by name, training, metrics, CLI.

This is the only package that touches files, data sources, checkpoints,
logging and plotting.
"""
