"""Run llama.cpp's convert_hf_to_gguf.py on a tiny test checkpoint whose BPE tokenizer the
converter cannot recognise (it identifies pre-tokenizers by hashing known models' outputs, and a
tokenizer trained for a test matches none): its `get_vocab_base_pre` is replaced by one that
returns the name given, then the converter runs unchanged.

usage: python convert_with_known_pre.py LLAMA_CPP_DIR PRE_NAME [convert_hf_to_gguf arguments]
(run with the converter's own Python environment; used by tools/make_family_fixtures.py)
"""

import runpy
import sys
from pathlib import Path

root, pre, *args = sys.argv[1:]
sys.path.insert(0, str(Path(root) / "gguf-py"))
sys.path.insert(0, root)

import conversion.base  # noqa: E402  (the converter's package, from LLAMA_CPP_DIR)

conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [str(Path(root) / "convert_hf_to_gguf.py"), *args]
runpy.run_path(sys.argv[0], run_name="__main__")
