"""RoBERTa, XLM-RoBERTa, DistilBERT, MPNet and ELECTRA checkpoints written by transformers (random weights,
trained tokenizer.json) against transformers (hidden states, attention weights) and against
sentence-transformers (embeddings with mean, CLS, max pooling and Normalize)."""

import json

import numpy as np
import pytest
import torch

from helpers_encoders import KINDS, SENTENCES, save_encoder, save_sentence_transformer
from multihead.pretrained import load_encoder

pytest.importorskip("transformers")

MODEL_TYPES = list(KINDS)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    dirs = {}

    def get(model_type):
        if model_type not in dirs:
            path = tmp_path_factory.mktemp(model_type)
            hf = save_encoder(path / "model", model_type, attn_implementation="eager")
            dirs[model_type] = (path, hf)
        return dirs[model_type]

    return get


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_hidden_states_and_weights_match_transformers(saved, model_type):
    path, hf = saved(model_type)
    enc = load_encoder(path / "model")
    assert not enc.training
    if model_type != "modernbert":  # (ModernBERT: RoPE, no position table)
        assert enc.model.config.position_style == (
            "bert" if model_type in ("distilbert", "electra") else "roberta"
        )
    ids = enc.tokenize(SENTENCES[:4])
    assert len({len(x) for x in ids}) == 4  # padding in every row but the longest
    for side in ("right", "left"):
        input_ids, mask = enc.batch(ids)
        if side == "left":  # RoBERTa's positions count real tokens: left padding must not shift
            order = torch.argsort(mask, dim=1, stable=True)
            input_ids, mask = input_ids.gather(1, order), mask.gather(1, order)
        with torch.no_grad():
            ref = hf(input_ids=input_ids, attention_mask=mask, output_attentions=True)
            ours = enc(input_ids, mask, return_weights=True)
        real = mask.bool()
        torch.testing.assert_close(
            ours.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-4
        )
        assert len(ours.attentions) == len(ref.attentions) == 2
        for w, r in zip(ours.attentions, ref.attentions, strict=True):
            # (B, H, Tq, Tk) -> real queries (n, H, Tk)
            torch.testing.assert_close(
                w.transpose(1, 2)[real], r.transpose(1, 2)[real], atol=1e-6, rtol=1e-5
            )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize(
    ("pooling", "normalize"),
    [("mean", False), ("cls", True), ("max", False), (("cls", "max", "mean"), True)],
)
def test_embeddings_match_sentence_transformers(saved, tmp_path, model_type, pooling, normalize):
    st = pytest.importorskip("sentence_transformers")
    path, _ = saved(model_type)
    save_sentence_transformer(
        tmp_path, path / "model", pooling, normalize=normalize, max_seq_length=20
    )
    reference = st.SentenceTransformer(str(tmp_path), device="cpu")
    enc = load_encoder(tmp_path)
    assert enc.max_seq_length == reference.max_seq_length == 20  # from tokenizer_config.json
    modes = (pooling,) if isinstance(pooling, str) else pooling
    assert enc.pooling == modes and enc.normalize == normalize
    texts = [*SENTENCES, "", "   ", " ".join(SENTENCES)]  # the last one is truncated
    ours, ref = enc.encode(texts), reference.encode(texts)
    assert ours.shape == ref.shape == (len(texts), 24 * len(modes))
    assert np.abs(ours - ref).max() <= 1e-5
    assert cosines(ours, ref).min() >= 0.99999
    alone = enc.encode(texts, batch_size=1)
    if model_type != "modernbert":
        # packed batches (no padding, each text's attention over its own tokens): a text's
        # embedding is the same whichever texts share its batch, up to the projections' GEMM
        # rounding (MKL blocks a GEMM by its row count: on AMD EPYC the packed batch's rows
        # differ from the lone text's by an ulp or two; same bits on the Intel machines). A
        # leak across texts would be ~1e-3.
        assert np.abs(alone - ours).max() <= 16 * np.spacing(np.abs(ours).max())
    else:
        # ModernBERT's sliding window runs packed texts as a right-padded batch: a text's
        # softmax sums run over the batch's longest length instead of its own, so the last bits
        # move (measured over 40 random vocabularies: up to 4 ulps of the largest value; the
        # WordPiece trainer's vocabulary, hence the inputs, changes from process to process).
        # A leak across padding or texts would be ~1e-3.
        assert np.abs(alone - ours).max() <= 16 * np.spacing(np.abs(ours).max())


def test_legacy_sentence_transformers_files(saved, tmp_path):
    """Pooling flags (pooling_mode_cls_token ...) and sentence_bert_config.json's max_seq_length
    and do_lower_case, as sentence-transformers 2-5 wrote them."""
    st = pytest.importorskip("sentence_transformers")
    path, _ = saved("roberta")  # a cased BPE tokenizer: lowercasing changes the ids
    save_sentence_transformer(tmp_path, path / "model", "max", normalize=False)
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 24, "pooling_mode_max_tokens": True})
    )
    (tmp_path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 12, "do_lower_case": True})
    )
    reference = st.SentenceTransformer(str(tmp_path), device="cpu")
    enc = load_encoder(tmp_path)
    assert enc.max_seq_length == reference.max_seq_length == 12 and enc.pooling == ("max",)
    texts = ["THE CAT SAT ON THE MAT.", "Hello World", "A Dog Runs Fast In The Park, Chasing!"]
    ours = enc.encode(texts)
    assert np.abs(ours - reference.encode(texts)).max() <= 1e-5
    assert np.abs(ours - enc.encode([t.lower() for t in texts])).max() == 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: _module(d, "sentence_transformers.models.Dense", "2_Dense"),
            r"Dense \(2_Dense\)",
        ),
        (
            lambda d: _pooling(d, {"pooling_mode": "lasttoken"}),
            "pooling mode lasttoken is not supported",
        ),
        (
            lambda d: _pooling(d, {"pooling_mode": "mean", "embedding_dimension": 7}),
            "embedding_dimension 7",
        ),
        (
            lambda d: _json(
                d / "config_sentence_transformers.json",
                {"default_prompt_name": "query", "prompts": {"query": "q: "}},
            ),
            "default_prompt_name 'query'",
        ),
        (
            lambda d: _json(d / "sentence_bert_config.json", {"max_seq_length": 0}),
            "max_seq_length must be a positive int, got 0",
        ),
        (
            lambda d: _json(d / "sentence_bert_config.json", {"max_seq_length": -3}),
            "max_seq_length must be a positive int",
        ),
        (
            lambda d: _json(
                d / "config.json",
                {**json.loads((d / "config.json").read_text()), "layer_norm_eps": 0},
            ),
            "layer_norm_eps must be a positive number, got 0",
        ),
        (
            lambda d: _json(
                d / "config.json", {**json.loads((d / "config.json").read_text()), "hidden_size": 0}
            ),
            "hidden_size must be a positive int, got 0",
        ),
        (
            lambda d: _json(
                d / "config.json",
                {**json.loads((d / "config.json").read_text()), "is_decoder": True},
            ),
            "is_decoder = True is not supported",
        ),
    ],
)
def test_unsupported_settings_are_refused_by_name(saved, tmp_path, edit, message):
    path, _ = saved("roberta")
    save_sentence_transformer(tmp_path, path / "model", "mean", normalize=True)
    edit(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_encoder(tmp_path)


def _json(path, data):
    path.write_text(json.dumps(data))


def _pooling(directory, config):
    _json(directory / "1_Pooling" / "config.json", config)


def _module(directory, kind, sub):
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": sub, "type": kind})
    _json(directory / "modules.json", modules)


def test_roberta_position_table_limit(saved):
    enc = load_encoder(saved("roberta")[0] / "model")
    assert enc.max_position_limit == 38  # 40 positions, the first two (0, pad) never used
    with pytest.raises(ValueError, match=r"sequence length 39 exceeds the position table \(38"):
        enc(torch.full((1, 39), 7))
    assert enc(torch.full((1, 38), 7)).last_hidden_state.shape == (1, 38, 24)


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_token_ids_are_checked(saved, model_type):
    enc = load_encoder(saved(model_type)[0] / "model")
    vocab = enc.model.config.vocab_size
    ids = torch.full((2, 5), 7)
    with pytest.raises(
        TypeError,
        match=r"input_ids must be an integer tensor \(torch.long\), got dtype torch\.float32",
    ):
        enc(ids.float())
    with pytest.raises(
        ValueError,
        match=rf"input_ids holds {vocab}, outside the vocabulary \(ids 0 .. {vocab - 1}\)",
    ):
        enc(torch.cat([ids, torch.full((2, 1), vocab)], 1))
    with pytest.raises(ValueError, match=r"input_ids holds -1, outside the vocabulary"):
        enc(ids.flatten() - 8, lengths=[5, 5])
    if model_type == "distilbert":
        with pytest.raises(ValueError, match="this model has no token types"):
            enc(ids, token_type_ids=torch.zeros_like(ids))
    else:
        with pytest.raises(
            ValueError, match=r"token_type_ids holds 2, outside the types \(ids 0 .. 1\)"
        ):
            enc(ids, token_type_ids=torch.full_like(ids, 2))


def test_tokenizer_beyond_the_vocabulary_is_refused(saved, tmp_path):
    path, _ = saved("roberta")
    config = json.loads((path / "model" / "config.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((path / "model" / name).read_bytes())
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "model.safetensors")
    weights["embeddings.word_embeddings.weight"] = weights["embeddings.word_embeddings.weight"][:50]
    save_file(weights, tmp_path / "model.safetensors")
    _json(tmp_path / "config.json", {**config, "vocab_size": 50})
    enc = load_encoder(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"tokenizer produced token id \d+, outside the model's vocabulary \(50 ids\)",
    ):
        enc.encode(["the quick brown fox jumps over the lazy dog"])


def test_special_ids(saved):
    for model_type, expected in (("roberta", ([0], [2])), ("distilbert", ([2], [3]))):
        enc = load_encoder(saved(model_type)[0] / "model")
        assert enc.special_ids == expected
        before, after = expected
        ids = enc.tokenize(["the cat"])[0]
        assert ids[:1] == before and ids[-1:] == after
