"""Training outputs survive kills: --out is checked before any step runs; a run killed with
SIGKILL mid-way resumes from its last (atomically written) checkpoint and ends with the same
weights and summary as an uninterrupted run with the same seed."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from multihead.cli import main

pytest.importorskip("matplotlib")

STEPS, EVERY = ["--steps", "30"], ["--eval-every", "10"]
ARGS = ["train", "induction", *STEPS, *EVERY, "--no-progress", "--seed", "3"]


def command(out, *extra):
    return [sys.executable, "-m", "multihead.cli", *ARGS, "--out", str(out), *extra]


def one_error(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: "), err
    for fragment in fragments:
        assert fragment in err[0], err[0]


def refuse_training(monkeypatch):
    def never(*a, **k):
        raise AssertionError("training started before --out was checked")

    monkeypatch.setattr("multihead.train.induction.train_induction", never)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_unwritable_out_is_refused_before_training(capsys, monkeypatch):
    refuse_training(monkeypatch)
    one_error(capsys, [*ARGS, "--out", "/proc/self"], "--out '/proc/self'", "cannot write there")


def test_out_under_a_file_is_refused_before_training(capsys, monkeypatch, tmp_path):
    refuse_training(monkeypatch)
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "run"
    one_error(capsys, [*ARGS, "--out", str(out)], "cannot create the directory")


def test_resume_without_checkpoint_is_refused(capsys, monkeypatch, tmp_path):
    refuse_training(monkeypatch)
    one_error(capsys, [*ARGS, "--out", str(tmp_path), "--resume"], "no checkpoint.pt")


def comparable(summary_path):
    summary = json.loads(summary_path.read_text())
    for timing in ("seconds", "threads"):
        summary.pop(timing, None)
    return summary


def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, capsys):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    proc = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoint = killed / "checkpoint.pt"
    deadline = time.monotonic() + 300
    step = -1
    while proc.poll() is None and time.monotonic() < deadline:
        if checkpoint.exists():
            step = torch.load(checkpoint, weights_only=True)["step"]  # whole: written atomically
            if step >= 10:
                os.kill(proc.pid, signal.SIGKILL)
                break
        time.sleep(0.02)
    assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert 10 <= step < 30
    assert not (killed / "summary.json").exists()  # killed before the end
    leftovers = [p.name for p in killed.iterdir() if p.name.endswith(".tmp")]
    resumed = subprocess.run(command(killed, "--resume"), capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    done = subprocess.run(command(whole), capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert comparable(killed / "summary.json") == comparable(whole / "summary.json")
    a = torch.load(killed / "checkpoint.pt", weights_only=True)
    b = torch.load(whole / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 30
    for name, tensor in b["model"].items():
        assert torch.equal(a["model"][name], tensor), name
    # a kill can leave a temporary file behind (never a torn checkpoint); nothing else
    assert all(name.startswith(".checkpoint.pt.") for name in leftovers)
    # resuming with other settings is refused, naming what differs
    argv = ["train", "induction", *STEPS, *EVERY, "--no-progress", "--seed", "4"]
    one_error(capsys, [*argv, "--out", str(whole), "--resume"], "seed: 3 there, 4 now")


def test_failed_write_leaves_the_old_file(tmp_path):
    from multihead.atomic import write_atomic

    target = tmp_path / "summary.json"
    target.write_text("old")

    def half_then_fail(f):
        f.write(b'{"half": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_sigkill_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("old")
    child = (
        "import sys, time\n"
        "from multihead.atomic import write_atomic\n"
        "def slow(f):\n"
        "    f.write(b'<html>half'); f.flush(); print('writing', flush=True); time.sleep(60)\n"
        f"write_atomic({str(target)!r}, slow)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"writing"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert target.read_text() == "old"  # the half-written bytes are in a temporary file only


# Damaged checkpoints (issue 40): each refused before training resumes, one line, exit 2.
SHORT = ["train", "induction", "--steps", "4", "--eval-every", "2", "--no-progress"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    assert main([*SHORT, "--out", str(out)]) == 0
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


def resign(path, damage):
    """`damage(state)` applied to the checkpoint, then its digest written anew: a checkpoint
    that is whole but does not fit the run (another version, another model)."""
    from multihead.train.checkpoints import state_digest

    state = torch.load(path, weights_only=True)
    damage(state)
    if isinstance(state, dict) and "sha256" in state:
        state["sha256"] = state_digest(state)
    torch.save(state, path)


def refused_resume(capsys, out, *fragments, extra=("--steps", "6", "--extend")):
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    one_error(capsys, [*SHORT[:2], *SHORT[4:], *extra, "--out", str(out), "--resume"],
              "--resume: checkpoint", *fragments)  # fmt: skip
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing rewritten


def test_flipped_bytes_in_a_checkpoint_are_refused(run_copy, capsys):
    path = run_copy / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    # 64 bytes of the Adam moments changed (the finding: the run resumed with moments off by
    # up to 3.6e8), the file otherwise whole
    moments = state["optimizer"]["state"][0]["exp_avg_sq"]
    data = bytearray(path.read_bytes())
    raw = moments.reshape(-1)[:16].numpy().tobytes()
    at = data.index(raw)
    data[at : at + 64] = bytes(b ^ 0x5A for b in data[at : at + 64])
    path.write_bytes(bytes(data))
    refused_resume(capsys, run_copy, "damaged", "SHA-256")


def test_step_at_steps_is_finished_not_silently_rewritten(run_copy, capsys):
    refused_resume(capsys, run_copy, "at step 4", "--steps 4", "finished", "--extend",
                   extra=("--steps", "4"))  # fmt: skip


def test_step_beyond_steps_is_refused(run_copy, capsys):
    resign(run_copy / "checkpoint.pt", lambda s: s.update(step=10))
    refused_resume(capsys, run_copy, "at step 10", "--steps 6")


def test_extend_trains_on_to_the_new_steps(run_copy, capsys):
    assert main([*SHORT[:2], "--steps", "6", *SHORT[4:], "--out", str(run_copy), "--resume",
                 "--extend"]) == 0  # fmt: skip
    state = torch.load(run_copy / "checkpoint.pt", weights_only=True)
    assert state["step"] == 6 and state["steps"] == [0, 2, 4, 6]
    assert json.loads((run_copy / "summary.json").read_text())["config"]["steps"] == 6


def test_extend_without_resume_is_refused(run_copy, capsys):
    one_error(capsys, [*SHORT, "--out", str(run_copy), "--extend"], "--extend", "--resume")


def test_other_steps_without_extend_is_other_settings(run_copy, capsys):
    refused_resume(capsys, run_copy, "steps: 4 there, 6 now", extra=("--steps", "6"))


def _first_weight(state):
    return next(iter(state["model"]))


DAMAGES = {
    "not a dict": (lambda s: s.clear() or s.update(x=1), "lacks step"),
    "no digest": (lambda s: s.pop("sha256"), "lacks sha256"),
    "no optimizer": (lambda s: s.update(optimizer={}), "no optimizer state"),
    "missing weight": (lambda s: s["model"].pop(_first_weight(s)), "missing weights"),
    "extra weight": (lambda s: s["model"].update(extra=torch.zeros(1)), "unexpected ['extra']"),
    "wrong shape": (
        lambda s: s["model"].update({_first_weight(s): torch.zeros(3, 5)}),
        "(3, 5); this run has",
    ),
    "wrong dtype": (
        lambda s: s["model"].update({_first_weight(s): s["model"][_first_weight(s)].double()}),
        "torch.float64",
    ),
    "moments wrong shape": (
        lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(2)),
        "optimizer exp_avg[0]",
    ),
    "moments negative": (
        lambda s: s["optimizer"]["state"][0]["exp_avg_sq"].fill_(-1.0),
        "negative optimizer exp_avg_sq[0]",
    ),
    "optimizer lr": (
        lambda s: s["optimizer"]["param_groups"][0].update(lr=1.0),
        "optimizer lr 1.0",
    ),
    "optimizer state for a parameter it lacks": (
        lambda s: s["optimizer"]["state"].update({999: {}}),
        "parameters the model does not have",
    ),
    "bad rng state": (lambda s: s.update(rng=torch.zeros(3, dtype=torch.uint8)), "rng"),
    "bad data state": (lambda s: s.update(data=s["data"].float()), "data"),
    "step not a number": (lambda s: s.update(step="2"), "holds step '2'"),
    "negative step": (lambda s: s.update(step=-1), "holds step -1"),
    "history longer than step": (lambda s: s["steps"].append(8), "measured steps"),
    "measurement fields": (
        lambda s: s["scores"][0].pop(next(iter(s["scores"][0]))),
        "holds a measurement",
    ),
    "config not a dict": (lambda s: s.update(config=[1]), "holds config [1]"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_damaged_checkpoint_is_one_error_line(run_copy, capsys, case):
    damage, fragment = DAMAGES[case]
    resign(run_copy / "checkpoint.pt", damage)
    refused_resume(capsys, run_copy, fragment)


def test_a_checkpoint_that_is_not_a_dict(run_copy, capsys):
    torch.save([1, 2, 3], run_copy / "checkpoint.pt")
    refused_resume(capsys, run_copy, "holds a list")
