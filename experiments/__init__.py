"""Runnable experiments: ``python -m experiments.<name> --help``.

* `experiments.convert_prenorm`: Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm on
  a trained LM (maximum logit difference, validation losses).
* `experiments.remove_layernorm`: LayerNorm removal by FakeLN fine-tuning
  (validation loss before and after, plot over the removal schedule).

Results of the recorded runs are in ``experiments/RESULTS.md``.
"""
