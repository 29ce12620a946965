"""Old import paths that still work for one minor release: a module moved in 0.3 leaves a shim
at its old path that warns (DeprecationWarning, naming the new path) and then IS the new module
(`sys.modules` maps the old name to it, so `import old as m; m is new` and monkeypatching either
name reaches the same objects). The shims go in 0.4.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

REMOVED_IN = "0.4"


def moved(old: str, new: ModuleType) -> None:
    """Make module `old` an alias of `new`, warning (at the line that imported the old path:
    Python shows a DeprecationWarning by default when that is in __main__) the first time it
    is imported."""
    warnings.warn(
        f"{old} moved to {new.__name__} in multihead 0.3; import {new.__name__} instead "
        f"({old} goes in {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=3,  # the importing line (warnings skips the import system's frames)
    )
    sys.modules[old] = new
