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
