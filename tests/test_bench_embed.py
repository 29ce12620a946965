"""`bench embed`'s pieces: the ONNX Runtime peer gives multihead's embeddings (same tokens,
pooling and normalisation, on an exported transformers model), and the long texts have the
length they claim. No timing here (the CLI test runs the whole suite once)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers_bert import save_bert
from multihead.bench.embed import LONG_TOKENS, long_texts
from multihead.bench.onnx_peer import OnnxEncoder, missing
from multihead.pretrained import load_encoder

TEXTS = ["the cat sat on the mat", "dog", "a b c d e f g h i j k l m", "cat ! dog ?"] * 3


@pytest.mark.skipif(bool(missing()), reason="needs onnxruntime and onnxscript")
def test_onnx_peer_gives_multiheads_embeddings(tmp_path):
    save_bert(tmp_path, hidden_size=30, num_attention_heads=5, num_hidden_layers=2)
    encoder = load_encoder(tmp_path)
    peer = OnnxEncoder(encoder, threads=1)
    assert peer.threads == 1
    ours = encoder.encode(TEXTS, batch_size=5)
    theirs = peer.encode(TEXTS, batch_size=5)  # batches padded to their longest text
    np.testing.assert_allclose(theirs, ours, atol=2e-5, rtol=1e-4)
    assert theirs.shape == (len(TEXTS), encoder.dim)


def test_long_texts_reach_their_length():
    encoder = load_encoder()
    sentences = ["This sentence has a handful of words.", "Short one.", "Another, longer, one."]
    lengths = [len(x) for x in encoder.tokenize(sentences)]
    texts = long_texts(sentences, lengths, 3)
    assert len(texts) == 3
    got = [len(x) for x in encoder.tokenize(texts, max_seq_length=512)]
    assert all(LONG_TOKENS <= n <= LONG_TOKENS + max(lengths) for n in got)
