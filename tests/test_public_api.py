"""The public API, as a committed snapshot (tests/public_api.txt: one `module name` a line): a
name that disappears fails here unless a deprecation covers it, and a new public name fails
until the snapshot records it (`python tests/test_public_api.py --update` rewrites it). Import
paths that 0.2 documented still import, the moved ones with a DeprecationWarning naming the
new path (for one minor release: they go in 0.4)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

SNAPSHOT = Path(__file__).with_name("public_api.txt")

# The modules whose names are the public API: their __all__ (or, without one, the functions and
# classes they define).
PUBLIC_MODULES = (
    "multihead",
    "multihead.compat",
    "multihead.functional",
    "multihead.functional.masks",
    "multihead.interpret",
    "multihead.models",
    "multihead.modules",
    "multihead.parallel",
    "multihead.positional",
    "multihead.pretrained",
)

# old module path -> where it went (the old path warns and is the new module)
MOVED_MODULES = {
    "multihead.cache": "multihead.modules.cache",
    "multihead.static_cache": "multihead.modules.static_cache",
    "multihead.parallel.tiles": "multihead.functional.tiles",
    "multihead.parallel.dropout": "multihead.functional.dropout_mask",
    "multihead.interpret.hooks": "multihead.hooked.hooks",
    "multihead.interpret.ablation": "multihead.hooked.ablation",
    "multihead.interpret.patching": "multihead.hooked.patching",
    "multihead.interpret.scope": "multihead.hooked.scope",
    "multihead.interpret.steps": "multihead.hooked.steps",
    "multihead.interpret.activation_cache": "multihead.hooked.activation_cache",
    "multihead.interpret.cache_algebra": "multihead.hooked.cache_algebra",
    "multihead.interpret.patch_batched": "multihead.hooked.patch_batched",
    "multihead.interpret.metric_checks": "multihead.hooked.metric_checks",
}

# Every import that 0.2's README and docs showed (module, names).
DOCUMENTED_IN_0_2 = [
    ("multihead", ["MultiHeadAttention", "attention", "scaled_dot_product_attention"]),
    ("multihead.cache", ["KVCache", "CrossKVCache"]),
    ("multihead.static_cache", ["StaticKVCache"]),
    ("multihead.compat", ["MultiheadAttention", "replace_attention"]),
    ("multihead.functional", ["masks", "explain", "register_backend"]),
    (
        "multihead.interpret",
        [
            "ablate",
            "direct_logit_attribution",
            "logit_lens",
            "patch",
            "run_with_cache",
            "run_with_hooks",
            "zero_ablation",
            "capture",
            "head_gates",
        ],
    ),
    ("multihead.interpret.analysis", ["analyze"]),
    ("multihead.interpret.subject", ["CausalLMSubject", "load_subject"]),
    ("multihead.interpret.metrics", []),
    ("multihead.interpret.report_html", []),
    ("multihead.models", ["load_causal_lm"]),
    ("multihead.modules", ["CausalLM", "LMConfig", "TransformerBlock", "EncoderDecoder"]),
    ("multihead.modules", ["StackConfig"]),
    ("multihead.modules.init", ["init_weights"]),
    (
        "multihead.parallel",
        [
            "full_state_dict",
            "full_grads",
            "tensor_parallel",
            "ring_attention",
            "shard_sequence",
            "unshard_sequence",
            "gather_sequence",
            "sequence_parallel",
            "sequence_positions",
            "dropout_keep_mask",
            "tensor_parallel_plan",
            "HeadParallel",
        ],
    ),
    ("multihead.positional", ["RotaryEmbedding", "ALiBi"]),
    ("multihead.pretrained", ["load_encoder"]),
]


def public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and (inspect.isfunction(value) or inspect.isclass(value))
            and value.__module__ == module_name
        ]
    return sorted(names)


def current() -> set[tuple[str, str]]:
    return {(m, n) for m in PUBLIC_MODULES for n in public_names(m)}


def recorded() -> set[tuple[str, str]]:
    lines = SNAPSHOT.read_text().splitlines()
    return {tuple(line.split()) for line in lines if line and not line.startswith("#")}  # type: ignore[misc]


def covered_by_deprecation(module_name: str, name: str) -> bool:
    """A name that left `module_name` with an old path still serving it (a moved module)."""
    return module_name in MOVED_MODULES


def test_no_public_name_disappears_without_a_deprecation():
    gone = sorted(
        (m, n)
        for m, n in recorded() - current()
        if not covered_by_deprecation(m, n)
        and not hasattr(importlib.import_module(m), n)  # still there, only off __all__
    )
    assert not gone, (
        "public names disappeared without a deprecation (keep them, or leave a shim that warns "
        "and names the new path, and record it in MOVED_MODULES):\n"
        + "\n".join(f"  {m} {n}" for m, n in gone)
    )


def test_new_public_names_are_recorded():
    new = sorted(current() - recorded())
    assert not new, (
        "public names that tests/public_api.txt does not list (check they are meant to be "
        "public, then run `python tests/test_public_api.py --update`):\n"
        + "\n".join(f"  {m} {n}" for m, n in new)
    )


def test_every_recorded_name_imports():
    for module_name, name in sorted(recorded()):
        module = importlib.import_module(module_name)
        assert hasattr(module, name), f"{module_name}.{name}"


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_moved_modules_warn_and_are_the_new_module(old, new):
    for name in [old, *[m for m in sys.modules if m.startswith(old + ".")]]:
        sys.modules.pop(name, None)  # a fresh import of the old path, which warns
    parent, _, child = old.rpartition(".")
    package = importlib.import_module(parent)
    # (no getattr: multihead's imports) put back afterwards: `multihead.interpret.hooks` is
    # also the exported function, which later tests import
    saved = vars(package).pop(child, None)
    try:
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}") as caught:
            module = importlib.import_module(old)
    finally:
        if saved is not None:
            setattr(package, child, saved)
    assert module is importlib.import_module(new)
    assert all(w.filename == __file__ or "importlib" in w.filename for w in caught)


@pytest.mark.parametrize(("module_name", "names"), DOCUMENTED_IN_0_2)
def test_imports_that_0_2_documented_still_work(module_name, names):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (the moved ones: tested above)
        module = importlib.import_module(module_name)
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"from {module_name} import {', '.join(missing)} fails"


def test_a_warning_names_the_line_that_imported_the_old_path(tmp_path):
    """Python shows DeprecationWarnings in __main__ by default: the warning must point at the
    user's import, not at multihead's shim or the import system."""
    import subprocess

    script = tmp_path / "old.py"
    script.write_text("from multihead.cache import KVCache\n")
    src = str(Path(importlib.import_module("multihead").__file__).parents[1])
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": ""},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"{script}:1: DeprecationWarning: multihead.cache moved to multihead.modules.cache" in (
        run.stderr
    )


def test_one_version_everywhere(capsys):
    """`multihead.__version__` is the one source: pyproject.toml reads it, the command prints it."""
    import re

    import multihead
    from multihead.cli import main

    pyproject = (SNAPSHOT.parents[1] / "pyproject.toml").read_text()
    project = pyproject.split("[project]")[1].split("\n[")[0]  # (no tomllib on Python 3.10)
    assert re.search(r'^dynamic = \["version"\]', project, re.M)
    assert not re.search(r"^version =", project, re.M)
    assert 'version = { attr = "multihead.__version__" }' in pyproject
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"multihead {multihead.__version__}\n"
    assert multihead.__version__ == "0.3.0"


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    header = (
        "# The public API (tests/test_public_api.py): `module name`, one a line, sorted.\n"
        "# Regenerate with: python tests/test_public_api.py --update\n"
    )
    SNAPSHOT.write_text(header + "".join(f"{m} {n}\n" for m, n in sorted(current())))
    print(f"wrote {SNAPSHOT} ({len(current())} names)")


def test_importing_an_old_module_path_keeps_the_same_named_function():
    """`multihead.interpret.hooks` is the old module path (a shim) and the exported function;
    importing the shim must not bind the module over the function (it did: a later
    `from multihead.interpret import hooks` gave a module, 'module' object is not callable).
    As in 0.2, `import multihead.interpret.hooks as m` then names the function (Python reads the
    package's attribute first); importlib.import_module gives the module."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import importlib\n"
        "old = importlib.import_module('multihead.interpret.hooks')\n"
        "import multihead.hooked.hooks as new\n"
        "from multihead.interpret import hooks\n"
        "assert old is new, old\n"
        "assert callable(hooks) and hooks is new.hooks, hooks\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
