"""Run PyTorch's own MHA / SDPA test files against multihead's drop-ins.

    python tools/run_torch_tests.py /tmp/torch-tests/test_transformers.py [more files] [-k EXPR]

Each file runs twice under pytest, in fresh processes: once on plain torch, once with the drop-ins
patched in (`torch.nn.MultiheadAttention` everywhere torch's modules look it up, and
`torch.nn.functional.scaled_dot_product_attention`). The table compares the two runs test by test.
A test that passes on plain torch and fails with the drop-ins is classified by its traceback:

- error type: the drop-in raised ValueError/TypeError where the test expects torch's
  AssertionError/RuntimeError (a documented, deliberate difference);
- TorchScript: the test scripts the module (the drop-in's forward is not scriptable);
- torch internals: the test mocks a private torch kernel (`torch._native_multi_head_attention`,
  `torch._transformer_encoder_layer_fwd`) that the drop-in does not call;
- unexplained: anything else, which is a parity bug to fix.

PyTorch's test files are not part of the torch wheel and are not committed here; fetch the ones
matching your torch version (test/test_transformers.py, test/nn/test_multihead_attention.py) into
a directory outside the repository. `torch.testing._internal` needs `expecttest` (in the `test`
extra).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# Traceback text -> the allowed difference it shows. First match wins.
ALLOWED = [
    (re.compile(r"torch\.jit|jit\.script|ScriptModule|torchscript", re.I), "TorchScript"),
    (
        re.compile(
            r"_native_multi_head_attention|_transformer_encoder_layer_fwd|fastpath_mock|MagicMock"
        ),
        "torch internals (mocked private kernel)",
    ),
    (
        re.compile(
            r"(AssertionError|RuntimeError)( not raised|.*but (ValueError|TypeError))|"
            r"^(ValueError|TypeError): ",
            re.M,
        ),
        "error type (ValueError/TypeError for torch's AssertionError/RuntimeError)",
    ),
]


def patch_torch() -> None:
    """Swap the drop-ins into every name torch's modules and the test files look them up by."""
    import torch
    import torch.nn.functional as F
    import torch.nn.modules as modules
    import torch.nn.modules.activation as activation
    import torch.nn.modules.transformer as transformer

    import multihead
    from multihead.compat import MultiheadAttention

    F.scaled_dot_product_attention = multihead.scaled_dot_product_attention
    for namespace in (torch.nn, modules, activation, transformer):
        namespace.MultiheadAttention = MultiheadAttention  # type: ignore[attr-defined,misc]


def _inner(argv: list[str]) -> int:
    """In the child process: optionally patch, then run pytest."""
    patched, junit, *pytest_args = argv
    if patched == "1":
        patch_torch()
    import pytest

    return pytest.main(["-q", "-p", "no:cacheprovider", "--junitxml", junit, *pytest_args])


def _results(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, message) from a JUnit XML report."""
    out: dict[str, tuple[str, str]] = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "failed" if tag in ("failure", "error") else "skipped"
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        out[test_id] = (outcome, message)
    return out


def _run(path: str, patched: bool, extra: list[str]) -> dict[str, tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "report.xml"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(path).parent), *sys.path]))
        subprocess.run(
            [sys.executable, __file__, "--inner", str(int(patched)), str(junit), path, *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return _results(junit)


def _classify(message: str) -> str:
    for pattern, reason in ALLOWED:
        if pattern.search(message):
            return reason
    return "unexplained"


def _skip_reason(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else "skipped"
    return re.sub(r"^.*?Skipped: ", "", first)[:90]


def report(path: str, plain: dict, dropin: dict) -> dict:
    """Print one file's table; return its counts."""
    print(f"\n## {path}\n")
    counts: Counter[str] = Counter()
    failures: list[tuple[str, str]] = []
    plain_only: list[tuple[str, str]] = []  # fail on plain torch, not with the drop-ins
    skips: Counter[str] = Counter()
    for test_id in sorted(set(plain) | set(dropin)):
        before = plain.get(test_id, ("missing", ""))[0]
        after, message = dropin.get(test_id, ("missing", ""))
        counts[f"plain {before}"] += 1
        counts[f"drop-ins {after}"] += 1
        if after == "skipped":
            skips[_skip_reason(message)] += 1
        if before == "passed" and after != "passed":
            reason = _classify(message)
            counts[reason] += 1
            failures.append((test_id, reason))
        if before == "failed" and after != "failed":
            counts["fails on plain torch only"] += 1
            plain_only.append((test_id, after))
    print("| run | passed | failed | skipped |")
    print("|---|---|---|---|")
    for run in ("plain", "drop-ins"):
        row = [counts[f"{run} {o}"] for o in ("passed", "failed", "skipped")]
        label = "plain torch" if run == "plain" else run
        print(f"| {label} |", " | ".join(map(str, row)), "|")
    if failures:
        print("\nPass on plain torch, fail with the drop-ins:\n")
        for test_id, reason in failures:
            print(f"- `{test_id}`: {reason}")
    if plain_only:
        print("\nFail on plain torch, not with the drop-ins:\n")
        for test_id, after in plain_only:
            print(f"- `{test_id}`: {after} with the drop-ins")
    if skips:
        print("\nSkipped with the drop-ins (reason: count):\n")
        for reason, n in skips.most_common():
            print(f"- {reason}: {n}")
    return dict(counts)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        return _inner(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="PyTorch test files")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--json", default=None, help="also write the counts as JSON here")
    args = parser.parse_args()
    extra = ["-k", args.k] if args.k else []
    totals = {}
    unexplained = 0
    for path in args.files:
        plain = _run(path, patched=False, extra=extra)
        dropin = _run(path, patched=True, extra=extra)
        totals[path] = report(path, plain, dropin)
        unexplained += totals[path].get("unexplained", 0)
    if args.json:
        Path(args.json).write_text(json.dumps(totals, indent=2))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
