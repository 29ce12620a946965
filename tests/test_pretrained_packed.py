"""The packed (no padding) path of BERT encoders and encode's batching, against Hugging Face's
padded BertModel and against the sequential path."""

import threading

import numpy as np
import pytest
import torch

from helpers_bert import save_bert
from multihead.pretrained import load_encoder
from multihead.pretrained.batches import run_batches, token_batches


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    hf = save_bert(directory, num_hidden_layers=3)
    return hf, load_encoder(directory)


def test_packed_forward_matches_transformers_padded(bert):
    hf, enc = bert
    lengths = [9, 9, 4, 7, 1, 4]
    ids = [torch.randint(5, 40, (n,)) for n in lengths]
    flat = torch.cat(ids)
    types = torch.randint(0, 2, flat.shape)
    padded = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    padded_types = torch.zeros_like(padded)
    mask = torch.zeros_like(padded)
    for i, (x, t) in enumerate(zip(ids, types.split(lengths), strict=True)):
        padded[i, : len(x)], padded_types[i, : len(x)], mask[i, : len(x)] = x, t, 1
    with torch.no_grad():
        ref = hf(input_ids=padded, attention_mask=mask, token_type_ids=padded_types)
        ours = enc(flat, token_type_ids=types, lengths=lengths).last_hidden_state
    assert ours.shape == (sum(lengths), 24)
    torch.testing.assert_close(ours, ref.last_hidden_state[mask.bool()], atol=1e-5, rtol=1e-4)


def test_packed_forward_bad_input(bert):
    _, enc = bert
    flat = torch.randint(5, 40, (6,))
    with pytest.raises(ValueError, match="attention_mask and return_weights belong to padded"):
        enc(flat, torch.ones(6), lengths=[6])
    with pytest.raises(ValueError, match=r"input_ids must be packed tokens \(N,\), got \(1, 6\)"):
        enc(flat[None], lengths=[6])
    with pytest.raises(ValueError, match=r"input_ids has shape \(6,\), but the lengths sum to 4"):
        enc(flat, lengths=[4])
    with pytest.raises(ValueError, match=r"token_type_ids \(5,\) must match input_ids \(6,\)"):
        enc(flat, token_type_ids=flat[:5], lengths=[6])
    with pytest.raises(ValueError, match=r"sequence length 70 exceeds the position table \(64"):
        enc(torch.randint(5, 40, (70,)), lengths=[70])


def test_token_batches():
    lengths = [10, 3, 8, 8, 2, 30, 1]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # 5, 0, 2, 3, 1, 4, 6
    batches = token_batches(order, lengths, budget=16)
    assert batches == [[5], [0], [2, 3], [1, 4, 6]]  # order kept; a text over budget alone
    assert [i for b in batches for i in b] == order
    assert token_batches([], [], 16) == []


def test_run_batches_spreads_work_and_restores_threads():
    seen: dict[int, list[int]] = {}
    lock = threading.Lock()

    def work(batch):
        assert torch.is_inference_mode_enabled()
        with lock:
            seen.setdefault(threading.get_ident(), []).extend(batch)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ticks = []
        run_batches(
            work,
            [[i] for i in range(40)],
            device=torch.device("cpu"),
            progress=lambda: ticks.append(1),
        )
        assert sorted(i for items in seen.values() for i in items) == list(range(40))
        assert len(ticks) == 40
        if "OpenMP" in torch.__config__.parallel_info():
            assert threading.get_ident() not in seen  # worker threads did the work
        assert torch.get_num_threads() == 2

        def fail(batch):
            raise RuntimeError(f"batch {batch} failed")

        with pytest.raises(RuntimeError, match=r"batch \[\d+\] failed"):
            run_batches(fail, [[0], [1], [2]], device=torch.device("cpu"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_encode_same_with_one_thread_and_with_workers(bert):
    _, enc = bert
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "mat", "dog", "running", "fast", "."]
    texts = [" ".join(rng.choice(words, rng.integers(0, 40))) for _ in range(300)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        sequential = enc.encode(texts, batch_size=2)
        torch.set_num_threads(2)
        parallel = enc.encode(texts, batch_size=2)
    finally:
        torch.set_num_threads(before)
    np.testing.assert_allclose(parallel, sequential, atol=1e-6, rtol=0)
    # and each text alone, padded, through the plain forward
    ids = enc.tokenize(texts[:5])
    for i, x in enumerate(ids):
        with torch.no_grad():
            hidden = enc(torch.tensor([x])).last_hidden_state[0]
        np.testing.assert_allclose(sequential[i], hidden.mean(0).numpy(), atol=1e-5)


@pytest.mark.gpu
def test_encode_on_cuda_matches_cpu(bert):
    _, enc = bert
    texts = ["the cat sat", "dog", "", "running fast on the mat ."]
    on_cpu = enc.encode(texts)
    enc.to("cuda")
    try:
        on_gpu = enc.encode(texts)
    finally:
        enc.to("cpu")
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-5)


def test_concurrent_encode_calls_do_not_truncate_each_other(bert):
    """encode(max_seq_length=...) in one thread must not change another thread's truncation
    (it used to set the shared tokenizer's)."""
    _, enc = bert
    texts = ["the cat sat on the mat and the dog runs fast . " * 3] * 4
    full, short = enc.encode(texts), enc.encode(texts, max_seq_length=5)
    assert len(enc.tokenize(texts[:1])[0]) > 20 and len(enc.tokenize(texts[:1], 5)[0]) == 5
    assert np.abs(full - short).max() > 1e-2  # truncation shows in the embedding
    failures = []
    start = threading.Barrier(2)

    def run(limit, expected):
        start.wait()
        for _ in range(30):
            got = enc.encode(texts, max_seq_length=limit)
            if np.abs(got - expected).max() > 1e-6:
                failures.append(limit)

    threads = [
        threading.Thread(target=run, args=(None, full)),
        threading.Thread(target=run, args=(5, short)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_max_seq_length_shorter_than_the_special_tokens(bert):
    _, enc = bert
    assert enc.tokenize(["the cat sat"], 2) == [[2, 3]]  # [CLS] [SEP]
    with pytest.raises(ValueError, match="max_seq_length 1 is shorter than the 2 special tokens"):
        enc.encode(["the cat"], max_seq_length=1)
    with pytest.raises(ValueError, match=r"max_seq_length must be an int in \[1, 64\], got 0"):
        enc.encode(["the cat"], max_seq_length=0)
