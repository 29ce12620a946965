"""`multihead bench attention --mask`: wiring, refusals, and the ideal's pair counts."""

import pytest

from multihead.bench import attention_structure
from multihead.cli import main


@pytest.mark.parametrize("kind", attention_structure.MASKS)
@pytest.mark.parametrize("T", [512, 1024])
def test_allowed_pairs_count_the_dense_mask(kind, T):
    assert attention_structure.allowed_pairs(kind, T) == int(
        attention_structure.dense_mask(kind, T).sum()
    )


def test_mask_routes_to_the_structure_suite(monkeypatch, capsys):
    seen = []

    def fake_main(kinds, quick, repeats):
        seen.append((kinds, quick, repeats))
        return "table"

    monkeypatch.setattr(attention_structure, "main", fake_main)
    assert main(["bench", "attention", "--mask", "window", "--repeats", "2"]) == 0
    assert main(["bench", "attention", "--mask", "all", "--quick"]) == 0
    assert seen == [(("window",), False, 2), (attention_structure.MASKS, True, 3)]
    assert "table" in capsys.readouterr().out


def test_mask_refuses_other_devices_and_dtypes(capsys):
    assert main(["bench", "attention", "--mask", "window", "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("multihead: error: --mask measures --device cpu --dtype fp32")
    assert err.count("\n") == 1
