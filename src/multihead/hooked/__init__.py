"""Running a model with hooks: the part of the interpretability toolkit that a model's own
methods call (`model.run_with_cache`, `model.run_with_hooks`, `model.ablate`, `model.patch`),
so it sits below `models/` and above `modules/` (the network it hooks).

  hooks.py           run_with_cache, run_with_hooks, hooks, hook_names, act_name
  activation_cache.py + cache_algebra.py   ActivationCache (TransformerLens' methods)
  steps.py           caches of calls that run the model several times (generate, encode)
  scope.py           which hook points belong to attention
  ablation.py        ablate: zero, mean, resample
  patching.py + patch_batched.py   activation patching; metric_checks.py

`multihead.interpret` re-exports all of it; analyses, reports and importance that load or
wrap whole models live there, above `models/`.
"""
