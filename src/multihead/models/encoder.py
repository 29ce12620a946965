"""`load_encoder_model(dir)`: an encoder checkpoint into a multihead BertEncoder (ModernBertEncoder
for ModernBERT), by model_type
(the tokenizer and sentence-transformers settings are `multihead.pretrained.load_encoder`'s)."""

from __future__ import annotations

from pathlib import Path

import torch

from .bert import BERT, BertEncoder
from .checkpoint import open_checkpoint, read_json
from .distilbert import DISTILBERT
from .electra import ELECTRA
from .fields import unsupported_architecture
from .loading import Family, load_model
from .modernbert import MODERNBERT, ModernBertEncoder
from .mpnet import MPNET
from .roberta import ROBERTA

ENCODER_FAMILIES: dict[str, Family] = {
    "bert": BERT,
    "distilbert": DISTILBERT,
    "electra": ELECTRA,
    "modernbert": MODERNBERT,
    "mpnet": MPNET,
    "roberta": ROBERTA,
    "xlm-roberta": ROBERTA,
}


def load_encoder_model(
    model_dir: Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> BertEncoder | ModernBertEncoder:
    """The encoder of a model directory (config.json + weights), in eval mode."""
    config = read_json(model_dir / "config.json")
    family = ENCODER_FAMILIES.get(config.get("model_type"))  # type: ignore[arg-type]
    if family is None:
        raise unsupported_architecture(config, "load_encoder", list(ENCODER_FAMILIES))
    model = load_model(family, config, open_checkpoint(model_dir), dtype=dtype, device=device)
    assert isinstance(model, BertEncoder | ModernBertEncoder)
    return model
