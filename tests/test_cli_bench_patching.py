"""`multihead bench patching --model DIR`: the loop and batched engines timed side by side on a
checkpoint, and their fractions agree (the table's last column)."""

import re

import pytest

from multihead.cli import main

transformers = pytest.importorskip("transformers")


def test_bench_patching_on_a_checkpoint(tmp_path, capsys):
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=50, hidden_size=24, intermediate_size=20, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    code = main(
        ["bench", "patching", "--model", str(tmp_path), "--tokens", "4", "--repeats", "1",
         "--samples", "4", "--full-loop"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "2 layers x 3 heads x 4 positions = 24 patches" in out
    batched = next(line for line in out.splitlines() if line.startswith("batched"))
    assert float(batched.split()[-1]) < 1e-5  # the engines agree on every entry
    assert re.search(r"Pearson r = -?[0-9.]+ over all 24 entries", out)
