"""Runnable experiments: ``python -m experiments.<name> --help``.

Each module reproduces one paper's headline claims (``*_claims``, and the
named studies such as `experiments.convert_prenorm` or
`experiments.depthbench`): it trains the arms through the runner, states
each claim's kind and margin before running, and writes a ``claims`` record
to ``experiments/results/<name>.json`` beside its report. The shared
machinery (tiers, grids, the paired statistics, provenance) is
`experiments._harness`. ``python -m experiments._harness.results``
collects the records into ``experiments/RESULTS.md`` and the README's
headline table.
"""
