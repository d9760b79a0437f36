"""The one harness every claims script runs on.

* `tiers`: the flags and the three tiers (quick, default, full), seeds;
* `grid`: a grid of runner variants x seeds trained by the runner
  (`jaxnorm.training.trainer.train`, what ``jaxnorm-train`` runs) into a
  resumable JSON-lines table; cells, seed pairing and claim records
  (`jaxnorm.training.claims`: paired intervals, kinds, margins);
* `runs`: what the scripts read back from a finished grid: a run's
  trained model (restored by the runner's resume), probes cached by run,
  the trivial predictor's loss and whether a baseline trained;
* `report`: a script's result files (JSON with its ``claims`` and ``run``
  provenance; Markdown with the title, command, the script's tables, then
  every claim's verdict and why; figure) and the one spread convention
  (mean and sample standard deviation, ``ddof=1``);
* `study`: the whole ``main`` of the plain claims script (one tuned grid,
  its claims, the standard tables);
* `results`: RESULTS.md and the README's headline table, made from every
  script's records with Holm-Bonferroni across the table.
"""
