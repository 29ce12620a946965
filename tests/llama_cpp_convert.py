"""Runs llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-python sdist) on several
checkpoints in one process (its imports cost seconds; each tiny conversion a fraction of one).

    python llama_cpp_convert.py LLAMA_CPP_DIR JOBS.json

JOBS.json: a list of {"model": dir, "outfile": path, "outtype": "f32" | "q8_0" | ..., "pre":
name or null}. `pre` fixes tokenizer.ggml.pre: the converter identifies a BPE tokenizer's
pre-tokenizer by hashing its output on a fixed text, and a tiny tokenizer trained by the tests
has no known hash (the only change made to the converter's behaviour; nothing is copied)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def main() -> None:
    root, jobs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    import conversion.base as base  # the converter's package, from the sdist

    script = runpy.run_path(str(root / "convert_hf_to_gguf.py"), run_name="llama_cpp_convert")
    original = base.TextModel.get_vocab_base_pre
    for job in jobs:
        pre = job.get("pre")
        base.TextModel.get_vocab_base_pre = (
            original if pre is None else (lambda self, tokenizer, pre=pre: pre)
        )
        sys.argv = ["convert_hf_to_gguf.py", job["model"], "--outfile", job["outfile"],
                    "--outtype", job["outtype"]]  # fmt: skip
        script["main"]()


if __name__ == "__main__":
    main()
