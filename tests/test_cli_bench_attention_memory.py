"""`multihead bench attention-memory`: runs each case in a child process and reports peak
memory; a key mask together with causal stays far below one (T, T) mask."""

from multihead.bench import attention_memory
from multihead.cli import main


def test_both_masks_stay_far_below_quadratic():
    """A (T, T) approach needs H * T * T * 4 bytes of scores (4 GiB here); the chunked call
    adds a bounded amount over the key mask alone (query chunks of 2**24 mask elements)."""
    T, H = 16384, 4
    both = attention_memory.measure(T, 64, H, "key mask + causal", "cpu", "fp32")
    alone = attention_memory.measure(T, 64, H, "key mask", "cpu", "fp32")
    assert both["finite"] and alone["finite"]
    assert both["bytes"] - alone["bytes"] < H * T * T * 4 / 8


def test_the_table_and_its_errors(capsys):
    assert (
        main(["bench", "attention-memory", "--lengths", "256", "--dim", "32", "--heads", "4"]) == 0
    )
    out = capsys.readouterr().out
    assert "key mask + causal GiB" in out and "\n256 " in out
    assert main(["bench", "attention-memory", "--dim", "30", "--heads", "4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["multihead: error: --dim 30 must be divisible by --heads 4"]
