"""See what every head does: hook points, caches, ablation, patching, the logit lens, direct
logit attribution, capture, head gates, metrics, importance and reports."""

import sys
from types import ModuleType

from ..hooked.ablation import ablate, mean_ablation, resample_ablation, zero_ablation
from ..hooked.hooks import (
    ActivationCache,
    act_name,
    hook_names,
    hooks,
    run_with_cache,
    run_with_hooks,
)
from ..hooked.patching import PatchResult, patch
from ..hooked.scope import attention_modules
from .attribution import Attribution, direct_logit_attribution
from .capture import AttentionRecord, Records, capture
from .detect import (
    TEMPLATES,
    detect_head,
    duplicate_token_pattern,
    head_scores,
    induction_pattern,
    previous_token_pattern,
    sink_pattern,
)
from .gates import head_gates
from .lens import LensResult, logit_lens
from .patch_attribution import attribution_patch

__all__ = [
    "TEMPLATES",
    "ActivationCache",
    "AttentionRecord",
    "Attribution",
    "LensResult",
    "PatchResult",
    "Records",
    "ablate",
    "act_name",
    "attention_modules",
    "attribution_patch",
    "capture",
    "detect_head",
    "direct_logit_attribution",
    "duplicate_token_pattern",
    "head_gates",
    "head_scores",
    "hook_names",
    "hooks",
    "induction_pattern",
    "logit_lens",
    "mean_ablation",
    "patch",
    "previous_token_pattern",
    "resample_ablation",
    "run_with_cache",
    "run_with_hooks",
    "sink_pattern",
    "zero_ablation",
]


class _Package(ModuleType):
    """This package, keeping its exported functions when a same-named old submodule path is
    imported. `multihead.interpret.hooks` is both the function `hooks` (exported above) and the
    0.2 module path, now a shim (`multihead.moved`); importing the shim makes the import system
    bind the module over the package's attribute, so `from multihead.interpret import hooks`
    would then give a module. A submodule never replaces an exported non-module here."""

    def __setattr__(self, name: str, value: object) -> None:
        current = self.__dict__.get(name)
        keep = name in __all__ and not isinstance(current, ModuleType)
        if isinstance(value, ModuleType) and keep:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
