"""MPNet checkpoints written by transformers (random weights, a trained tokenizer.json): what
tests/test_models_encoders.py checks for every encoder type (hidden states and attention
weights, padded left and right; embeddings against sentence-transformers) plus what is MPNet's
own: sequences longer than the bias's max_distance, packed sequences, the one shared table,
its config fields, hooks, torch.compile and bf16."""

import json
import shutil

import pytest
import torch

from helpers_encoders import SENTENCES, save_encoder
from multihead.cli import main
from multihead.interpret import run_with_cache
from multihead.models.mpnet import MPNET, MPNetEncoder, mpnet_key_map
from multihead.positional import RelativePositionBias, SharedPosition
from multihead.pretrained import load_encoder

pytest.importorskip("transformers")

POSITIONS = 300  # room for sequences past the bias's max_distance (128)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpnet") / "model"
    hf = save_encoder(path, "mpnet", attn_implementation="eager", max_position_embeddings=POSITIONS)
    return path, hf


def _random_batch(vocab, T, seed):
    """(3, T) ids with right padding in row 0, left padding in row 1 (pad id 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, T - T // 3 :] = 0
    mask[1, : T // 4] = 0
    return torch.where(mask.bool(), ids, 1), mask


@pytest.mark.parametrize("T", [20, 140, 290])
def test_long_sequences_match_transformers(saved, T):
    """Past 128 slots every distance shares the last bucket; transformers' positions and
    buckets are followed on both sides of it, padded left and right, weights or not."""
    path, hf = saved
    enc = load_encoder(path)
    ids, mask = _random_batch(enc.model.config.vocab_size, T, seed=T)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
        ours = enc(ids, mask, return_weights=True)
        fused = enc(ids, mask)  # the default backend, no weights
    real = mask.bool()
    for states in (ours.last_hidden_state, fused.last_hidden_state):
        torch.testing.assert_close(states[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-4)
    for w, r in zip(ours.attentions, ref.attentions, strict=True):
        # (B, H, Tq, Tk) -> real queries (n, H, Tk)
        torch.testing.assert_close(
            w.transpose(1, 2)[real], r.transpose(1, 2)[real], atol=1e-6, rtol=1e-5
        )


def test_packed_sequences_match_transformers_one_by_one(saved):
    """Packed input (lengths=): positions and bias slots restart in each sequence."""
    path, hf = saved
    enc = load_encoder(path)
    lengths = [7, 150, 3, 40]
    g = torch.Generator().manual_seed(5)
    flat = torch.randint(5, enc.model.config.vocab_size, (sum(lengths),), generator=g)
    with torch.no_grad():
        packed = enc(flat, lengths=lengths).last_hidden_state  # (N, C)
        alone = torch.cat(
            [hf(input_ids=part[None]).last_hidden_state[0] for part in flat.split(lengths)]
        )
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-4)


def test_the_shared_table_is_one_parameter(saved):
    path, hf = saved
    model = load_encoder(path).model
    assert isinstance(model, MPNetEncoder)
    table = model.relative_attention_bias
    assert isinstance(table, RelativePositionBias) and table.weight.shape == (32, 3)
    keys = list(model.state_dict())
    assert [k for k in keys if "relative" in k or ".position." in k] == [
        "relative_attention_bias.weight"
    ]
    for layer in model.layers:  # each layer holds a view of the one table
        assert isinstance(layer.attn.position, SharedPosition)
        assert layer.attn.position.scheme is table
    # as many parameters as transformers' MPNetModel (no pooler): nothing duplicated
    ours = sum(p.numel() for p in model.parameters())
    assert ours == sum(p.numel() for p in hf.parameters())
    rules = [r for r in mpnet_key_map(model.config) if "relative" in r.target]
    assert [(r.target, r.sources) for r in rules] == [
        ("relative_attention_bias.weight", ("encoder.relative_attention_bias.weight",))
    ]
    torch.testing.assert_close(
        table.weight, hf.encoder.relative_attention_bias.weight, rtol=0, atol=0
    )


def test_the_relative_bias_is_used(saved):
    """Without the table the states differ: parity cannot pass by ignoring it."""
    path, hf = saved
    enc = load_encoder(path)
    ids, mask = _random_batch(enc.model.config.vocab_size, 30, seed=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        enc.model.relative_attention_bias.weight.zero_()
        ours = enc(ids, mask).last_hidden_state
    assert (ours - ref)[mask.bool()].abs().max() > 1e-2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("pad_token_id", 0, "pad_token_id = 0 is not supported: transformers' MPNet counts"),
        ("relative_attention_num_buckets", 64, "relative_attention_num_buckets = 64 is not"),
        ("quantization_config", {"bits": 4}, "quantized weights are not supported"),
        ("hidden_act", "swish2", "hidden_act = 'swish2' is not supported"),
        ("max_position_embeddings", 2, "leaves no position"),
    ],
)
def test_config_fields_are_refused_by_name(saved, tmp_path, field, value, message):
    path, _ = saved
    shutil.copytree(path, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=message):
        load_encoder(tmp_path / "m")


def test_checkpoint_prefix_and_heads_are_recognised(saved, tmp_path):
    """MPNetForMaskedLM's checkpoint: 'mpnet.' prefix and the lm_head are handled."""
    import transformers

    path, hf = saved
    masked = transformers.MPNetForMaskedLM(hf.config)
    masked.mpnet.load_state_dict(hf.state_dict(), strict=False)
    masked.save_pretrained(tmp_path)
    shutil.copy(path / "tokenizer.json", tmp_path)
    model = load_encoder(tmp_path).model
    torch.testing.assert_close(
        model.relative_attention_bias.weight, hf.encoder.relative_attention_bias.weight
    )


def test_hooks_see_the_biased_pattern(saved):
    path, hf = saved
    enc = load_encoder(path)
    ids, mask = _random_batch(enc.model.config.vocab_size, 12, seed=3)
    _, cache = run_with_cache(enc, ids, mask)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    real = mask.bool()
    for i, r in enumerate(ref):
        pattern = cache[f"blocks.{i}.attn.hook_pattern"]
        torch.testing.assert_close(
            pattern.transpose(1, 2)[real], r.transpose(1, 2)[real], atol=1e-6, rtol=1e-5
        )
        scores = cache[f"blocks.{i}.attn.hook_attn_scores"]  # scaled scores + bias, masked
        torch.testing.assert_close(scores.softmax(-1), pattern, atol=1e-6, rtol=1e-5)


def test_traces_as_one_graph(saved):
    """The shared bias (a view, bucket arithmetic, a table lookup) traces without a break.
    Unpadded input: BertEncoder's attention_mask check (from_hf_padding) reads values."""
    path, _ = saved
    model = load_encoder(path).model
    ids, _ = _random_batch(model.config.vocab_size, 16, seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = model(ids).last_hidden_state
        torch.testing.assert_close(compiled(ids).last_hidden_state, expected)


def test_bfloat16_weights_stay_bfloat16(saved):
    path, _ = saved
    enc32, enc16 = load_encoder(path), load_encoder(path, dtype=torch.bfloat16)
    assert enc16.model.relative_attention_bias.weight.dtype == torch.bfloat16
    ours = enc16.encode(SENTENCES)
    assert abs(ours - enc32.encode(SENTENCES)).max() < 0.1


def test_commands_read_mpnet_directories(saved, capsys):
    path, _ = saved
    assert main(["similarity", "--model", str(path), SENTENCES[0], SENTENCES[1]]) == 0
    reference = load_encoder(path).encode(SENTENCES[:2])
    cosine = float(reference[0] @ reference[1]) / float(
        (reference[0] ** 2).sum() ** 0.5 * (reference[1] ** 2).sum() ** 0.5
    )
    out = capsys.readouterr().out
    assert f"{cosine:.4f}" in out


def test_family_is_registered():
    from multihead.models import ENCODER_FAMILIES

    assert ENCODER_FAMILIES["mpnet"] is MPNET
