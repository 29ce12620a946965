"""ModernBERT encoders (Hugging Face ModernBertModel, and the encoder inside
ModernBertForMaskedLM and the task models): config reader, key map and module side by side."""

from ..loading import Family
from .config import ModernBertConfig, modernbert_config
from .keymap import MODERNBERT_IGNORED, modernbert_key_map, modernbert_rename, modernbert_view
from .model import ModernBertEmbeddings, ModernBertEncoder

MODERNBERT = Family(
    read_config=modernbert_config,
    build=ModernBertEncoder,
    key_map=modernbert_key_map,
    num_layers=lambda config: config.num_hidden_layers,
    rename=modernbert_rename,
    ignored=MODERNBERT_IGNORED,
    view=modernbert_view,
)

__all__ = [
    "MODERNBERT",
    "ModernBertConfig",
    "ModernBertEmbeddings",
    "ModernBertEncoder",
    "modernbert_config",
]
