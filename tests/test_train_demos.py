"""`multihead train induction|reverse`, shortened to seconds: the pipeline, the files, the summary's
fields and invariants, determinism, and errors. The full defaults are benchmarks (docs/training.md),
not unit tests."""

import json
import math

import pytest
import torch

from multihead.cli import main
from multihead.interpret.metrics import INDUCTION_OFFSETS, PREVIOUS_DISTANCES
from multihead.train import InductionConfig, ReverseConfig, train_induction, train_reverse
from multihead.train.summary import induction_summary

pytest.importorskip("matplotlib")

SHORT = ["--steps", "12", "--eval-every", "4", "--no-progress", "--threads", "1"]


@pytest.fixture(autouse=True)
def one_thread():
    """Train in-process on one thread, as the command does: tiny matrices, and a second
    thread's spin-waits make steps many times slower when other jobs load the machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def read(path):
    return json.loads(path.read_text(encoding="utf-8"))


def check_induction_summary(s, c: InductionConfig):
    """Fields and invariants every induction summary must satisfy."""
    L, H = c.num_layers, c.num_heads
    for key in ("phase_change_step", "loss_first_copy", "loss_second_copy", "seconds"):
        assert key in s
    assert s["config"]["position"] == c.position and s["config"]["steps"] == c.steps
    assert [(h["layer"], h["head"]) for h in s["heads"]] == [
        (i, j) for i in range(L) for j in range(H)
    ]
    for h in s["heads"]:
        for k in ("previous_token", "induction", "duplicate", "bos"):
            assert 0.0 <= h[k] <= 1.0
        assert h["induction_offset"] in INDUCTION_OFFSETS
        assert h["previous_token_offset"] in PREVIOUS_DISTANCES
    assert [(a["layer"], a["head"]) for a in s["ablation"]] == [
        (h["layer"], h["head"]) for h in s["heads"]
    ]
    for a in s["ablation"]:
        assert math.isfinite(a["zero"]) and math.isfinite(a["mean"]) and a["zero"] > 0
    curves = s["curves"]
    evals = list(range(0, c.steps + 1, c.eval_every))
    assert curves["step"] == evals
    assert curves["loss_second_copy"][-1] == s["loss_second_copy"]
    assert [len(x) for x in curves["induction"]] == [L * H] * len(evals)
    assert curves["induction"][-1] == [h["induction"] for h in s["heads"]]
    # so few steps cannot form the circuit: the summary says so
    assert s["circuit_formed"] is False and s["phase_change_step"] is None
    assert not s["phase_change_coincides"]
    # the model starts near ln(vocab) (the initialisation)
    assert abs(s["loss_second_copy_at_start"] - math.log(c.vocab_size)) < 1.0


def test_induction_command_writes_the_files(tmp_path, capsys):
    code, out, err = run_cli(["train", "induction", *SHORT, "--out", str(tmp_path)], capsys)
    assert code == 0, err
    written = {p.name for p in tmp_path.iterdir()}
    assert written == {"summary.json", "induction.png", "report.html", "checkpoint.pt"}
    assert (tmp_path / "induction.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    # the payload is JSON with "<" and ">" escaped for the <script> it sits in
    assert "MultiheadReport.render" in html and r'"tokens":["\u003cs\u003e"' in html
    s = read(tmp_path / "summary.json")
    check_induction_summary(s, InductionConfig(steps=12, eval_every=4))
    assert s["threads"] == 1
    assert "NO phase change" in out and "alibi" in out and "L1 H3" in out


SMALL = dict(steps=6, eval_every=3, probe_layouts=3, probe_per_layout=4)


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_induction_summary_for_each_position(position):
    config = InductionConfig(position=position, **SMALL)
    check_induction_summary(induction_summary(train_induction(config)), config)


def test_training_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    train_induction(InductionConfig(**SMALL))
    train_reverse(ReverseConfig(steps=2, eval_every=2, held_out=8))
    assert torch.equal(torch.get_rng_state(), state)


def test_same_seed_same_summary():
    def summary(seed):
        s = induction_summary(train_induction(InductionConfig(seed=seed, **SMALL)))
        s.pop("seconds")
        return json.dumps(s)

    assert summary(3) == summary(3)
    assert summary(3) != summary(4)


def test_the_induction_loop_measures_what_it_trains():
    """In-process: the recorded curves are measurements of the model as it was at that step."""
    torch.manual_seed(0)
    run = train_induction(
        InductionConfig(steps=6, eval_every=3, probe_layouts=2, probe_per_layout=4)
    )
    from multihead.train.probe import measure

    again = measure(run.model, run.held_out, run.config.num_layers)
    assert again.loss_second == run.final.loss_second
    assert torch.equal(again.induction, run.final.induction)
    assert run.history.steps == [0, 3, 6]
    assert not run.model.training


def test_reverse_command(tmp_path, capsys):
    code, out, err = run_cli(
        [
            "train",
            "reverse",
            "--steps",
            "8",
            "--eval-every",
            "4",
            "--no-progress",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    assert {p.name for p in tmp_path.iterdir()} == {"summary.json", "reverse.png", "checkpoint.pt"}
    s = read(tmp_path / "summary.json")
    c = ReverseConfig()
    assert 0.0 <= s["accuracy"] <= 1.0 and 0.0 <= s["sequence_accuracy"] <= s["accuracy"]
    assert [(h["layer"], h["head"]) for h in s["heads"]] == [
        (i, j) for i in range(c.num_layers) for j in range(c.num_heads)
    ]
    assert all(0.0 <= h["alignment"] <= 1.0 for h in s["heads"])
    assert s["curves"]["step"] == [0, 4, 8] and "seconds" in s
    assert "token accuracy" in out


def test_reverse_alignment_of_an_untrained_model_is_about_uniform():
    """Before training, cross-attention is near uniform: the aligned token gets about the mean
    of 1 / length over the held-out lengths."""
    run = train_reverse(ReverseConfig(steps=1, eval_every=1, held_out=256))
    first = run.scores[0]
    lengths = run.held_out.lengths.double()
    # uniform over n real keys puts 1/n on the aligned one; weighted by n queries per sequence
    expected = float(lengths.numel() / lengths.sum())
    torch.testing.assert_close(
        first.alignment, torch.full_like(first.alignment, expected), atol=0.02, rtol=0
    )


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["induction", "--positions", "sinusoidal"], "argument --positions: invalid choice"),
        (["induction", "--steps", "0"], "argument --steps: expected a positive integer, got 0"),
        (["induction", "--eval-every", "-2"], "argument --eval-every: expected a positive integer"),
        (["reverse", "--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
        (["reverse", "--threads", "0"], "argument --threads: expected a positive integer"),
    ],
)
def test_bad_flags_are_one_line_errors(args, pattern, capsys, tmp_path):
    code, out, err = run_cli(["train", *args, "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and out == ""
    assert err.startswith("multihead: error: ") and err.count("\n") == 1
    assert pattern in err
    assert not (tmp_path / "x").exists()  # nothing written before the flags are checked


def test_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = run_cli(["train", "reverse", "--steps", "1", "--out", str(f)], capsys)
    assert code == 2 and "--out" in err and "is not a directory" in err


def test_the_cli_and_the_library_share_the_induction_threshold():
    from multihead.cli import train_induction
    from multihead.train.phase import INDUCTION_THRESHOLD

    assert train_induction.INDUCTION_THRESHOLD == INDUCTION_THRESHOLD
