"""The interpret toolkit on a bridged model, as on a native one: hook names, caches, hook_result,
ablation, patching (heads, positions, residual), attribution patching, the logit lens, capture,
head gates; loading a saved checkpoint through `multihead.load`, its tokenizer, and
`multihead inspect --model DIR`."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

import multihead
from helpers_bridge import save_tiny, tiny, tiny_tokenizer
from multihead.bridge import BridgedModel, wrap
from multihead.interpret import (
    ablate,
    attribution_patch,
    capture,
    head_gates,
    hook_names,
    hooks,
    logit_lens,
    patch,
    run_with_cache,
    run_with_hooks,
)

LLAMA_BLOCK = [
    "hook_resid_pre",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "attn.hook_result",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_out",
    "hook_resid_post",
]


@pytest.fixture(scope="module")
def llama():
    return wrap(tiny("llama"), tiny_tokenizer())


def ids_of(seed, T=7):
    return torch.randint(4, 96, (1, T), generator=torch.Generator().manual_seed(seed))


def test_hook_names_are_the_native_ones(llama):
    blocks = [f"blocks.{i}.{p}" for i in range(2) for p in LLAMA_BLOCK]
    assert hook_names(llama) == ["hook_embed", *blocks, "hook_logits"]


def test_cache_shapes_and_the_stream_adds_up(llama):
    ids = ids_of(0)
    with torch.no_grad():
        logits, cache = run_with_cache(llama, ids, names=lambda n: True)
        _, result = run_with_cache(llama, ids, names=["blocks.0.attn.hook_result"])
    assert cache["blocks.0.attn.hook_q"].shape == (1, 7, 4, 8)  # (B, T, H, D), after RoPE
    assert cache["blocks.0.attn.hook_k"].shape == (1, 7, 2, 8)  # grouped: Hkv = 2
    assert cache["pattern", 0].shape == (1, 4, 7, 7)
    assert cache["z", 0].shape == (1, 7, 4, 8)
    torch.testing.assert_close(cache["hook_logits"], logits)
    for i in range(2):  # a Llama block: resid_pre + attn_out = resid_mid; + mlp_out = resid_post
        torch.testing.assert_close(
            cache["resid_pre", i] + cache["attn_out", i], cache["resid_mid", i]
        )
        torch.testing.assert_close(
            cache["resid_mid", i] + cache["mlp_out", i], cache["resid_post", i]
        )
    torch.testing.assert_close(cache["resid_post", 0], cache["resid_pre", 1])
    # hook_result: each head's share of the output projection, summing to hook_attn_out
    torch.testing.assert_close(result["result", 0].sum(2), cache["attn_out", 0], atol=1e-5, rtol=0)


def test_replacing_result_equals_replacing_z(llama):
    ids = ids_of(1)

    def zero(head):
        def fn(x, name):
            x = x.clone()
            x[:, :, head] = 0
            return x

        return fn

    with torch.no_grad():
        by_z = run_with_hooks(llama, ids, fwd_hooks=[("blocks.1.attn.hook_z", zero(3))])
        by_result = run_with_hooks(llama, ids, fwd_hooks=[("blocks.1.attn.hook_result", zero(3))])
        with ablate(llama, [(1, 3)]):
            ablated = llama(ids)
    torch.testing.assert_close(by_result, by_z, atol=1e-5, rtol=0)
    torch.testing.assert_close(ablated, by_z)


def test_patching_and_attribution_patching(llama):
    clean, corrupted = ids_of(3), ids_of(4)
    target = int(clean[0, -1])

    def metric(logits):
        return logits[0, -1, target] - logits[0, -1].mean()

    with torch.no_grad():
        result = patch(llama, clean, corrupted, metric, resid=("resid_pre", "resid_post"))
    assert result.heads.shape == (2, 4)
    # the last block's stream at the last position carries everything the metric reads
    assert result.resid["resid_post"][1, -1] == pytest.approx(1.0, abs=1e-4)
    # after the last block nothing mixes positions: its other positions carry nothing
    assert result.resid["resid_post"][1, :-1].abs().max() < 1e-4
    assert result.resid["resid_pre"].shape == (2, 7)
    estimate = attribution_patch(llama, clean, corrupted, metric, resid="resid_post")
    assert estimate.heads.shape == (2, 4) and torch.isfinite(estimate.heads).all()
    # at the last block's last position, the estimate is the metric's gradient through the
    # final norm and head (computed here by hand) times the clean - corrupted difference
    with torch.no_grad():
        _, clean_cache = run_with_cache(llama, clean, names=["blocks.1.hook_resid_post"])
        _, corrupt_cache = run_with_cache(llama, corrupted, names=["blocks.1.hook_resid_post"])
    x = corrupt_cache["resid_post", 1].clone().requires_grad_(True)
    metric(llama.logits(llama.norm_f(x))).backward()
    delta = clean_cache["resid_post", 1] - corrupt_cache["resid_post", 1]
    by_hand = float((x.grad[0, -1] * delta[0, -1]).sum()) / (result.clean - result.corrupted)
    assert float(estimate.resid["resid_post"][1, -1]) == pytest.approx(by_hand, rel=1e-4)
    assert estimate.resid["resid_post"][1, :-1].abs().max() < 1e-6


def test_logit_lens_last_block_is_the_models_own_loss(llama):
    ids = ids_of(5, 9)
    lens = logit_lens(llama, ids)
    with torch.no_grad():
        logits = llama(ids)
    own = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert lens.loss[-1] == pytest.approx(float(own), abs=1e-5)


def test_capture_and_head_gates(llama):
    ids = ids_of(6)
    with torch.no_grad():
        _, cache = run_with_cache(llama, ids)
        with capture(llama) as records:
            llama(ids)
        gates = torch.ones(2, 4)
        gates[0, 1] = 0
        with head_gates(llama, gates):
            gated = llama(ids)
        with ablate(llama, [(0, 1)]):
            ablated = llama(ids)
    assert len(records) == 2
    torch.testing.assert_close(records[0].weights, cache["pattern", 0])
    torch.testing.assert_close(gated, ablated)


def test_tokenizer_methods(llama):
    ids = llama.to_tokens("w1 w2 w3")
    assert ids.tolist() == [[1, 5, 6, 7]]  # BOS, then the words
    assert llama.to_str_tokens("w1 w2") == ["<s>", "w1", "w2"]
    text = llama.generate("w1 w2", max_new_tokens=3)
    reference = tiny("llama").generate(
        llama.to_tokens("w1 w2"), max_new_tokens=3, do_sample=False, pad_token_id=0
    )  # transformers' own greedy generation, eager attention, same weights
    assert text == tiny_tokenizer().decode(reference[0], skip_special_tokens=True)
    assert text.startswith("w1 w2")
    with torch.no_grad():
        torch.testing.assert_close(llama("w1 w2 w3"), llama(ids))


def test_load_a_saved_checkpoint_through_the_one_resolver(tmp_path):
    path = save_tiny(tmp_path / "sc2")
    model = multihead.load(path)
    assert isinstance(model, BridgedModel) and not model.training
    reference = tiny("starcoder2")
    ids = model.to_tokens("w1 w5 w9 w2")
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids).logits, atol=1e-5, rtol=1e-4)
    assert isinstance(model.generate("w1 w2", max_new_tokens=2), str)


CONLLU = "".join(
    f"# text = {a} {b} {c}\n1\t{a}\t{a}\tNOUN\t_\t_\t2\tnsubj\t_\t_\n"
    f"2\t{b}\t{b}\tVERB\t_\t_\t0\troot\t_\t_\n3\t{c}\t{c}\tNOUN\t_\t_\t2\tobj\t_\t_\n\n"
    for a, b, c in (("w1", "w2", "w3"), ("w4", "w5", "w6"))
)


def test_inspect_heads_and_syntax_cli_on_a_bridged_checkpoint(tmp_path, capsys):
    from multihead.cli import main

    path = str(save_tiny(tmp_path / "sc2"))
    out = tmp_path / "report.json"
    assert main(["inspect", "w1 w2 w3 w1 w2 w3", "--model", path, "-o", str(out)]) == 0
    assert out.is_file() and out.stat().st_size > 0
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w1 w2 w3 w4\nw5 w6 w7 w8 w9\n")
    assert main(["heads", "--corpus", str(corpus), "--model", path]) == 0
    assert "L1 H3" in capsys.readouterr().out
    treebank = tmp_path / "t.conllu"
    treebank.write_text(CONLLU)
    assert main(["syntax", str(treebank), "--model", path, "--min-count", "1"]) == 0
    assert "2 layers x 4 heads, 2 sentences" in capsys.readouterr().out


def test_show_on_a_bridged_subject(tmp_path):
    from multihead.interpret.subject import load_subject

    subject = load_subject(save_tiny(tmp_path / "sc2"))
    view = multihead.show(subject, "w1 w2 w3 w4", probe=False)
    assert type(view).__name__ == "HeadView"


def test_multihead_wrap_is_the_bridges_and_import_stays_light():
    import os
    import subprocess
    import sys
    from pathlib import Path

    assert multihead.wrap is wrap
    code = "import sys, multihead; multihead.load; print('transformers' in sys.modules)"
    src = str(Path(multihead.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.strip() == "False", done.stderr


def test_wrapping_leaves_the_weights_and_state_dict(llama):
    fresh = tiny("llama")
    assert set(llama.state_dict()) == {f"hf.{k}" for k in fresh.state_dict()}


def test_a_copy_has_hooks_of_its_own(llama):
    """deepcopy of a bridged model: its hook points serve its own sessions, not the original's."""
    twin = copy.deepcopy(llama)
    ids = ids_of(8)
    seen = []
    with torch.no_grad():
        _, mine = run_with_cache(llama, ids)
        _, theirs = run_with_cache(twin, ids)
        with hooks(llama, [(lambda n: True, lambda x, n: seen.append(n))]):
            twin(ids)
    assert seen == []
    assert set(mine) == set(theirs)
    for name in mine:
        torch.testing.assert_close(theirs[name], mine[name])


def test_bench_bridge_prints_its_table(capsys):
    from multihead.cli import main

    argv = ["bench", "bridge", "--dim", "32", "--layers", "1", "--heads", "4", "--tokens", "8"]
    assert main([*argv, "--repeats", "1", "--arch", "qwen2"]) == 0
    out = capsys.readouterr().out
    assert "bridged/sdpa" in out and "qwen2" in out
