"""BERT encoders: config reader, module and key map (RoBERTa and DistilBERT reuse the module)."""

from ..loading import Family
from .config import BertConfig, bert_config
from .keymap import BERT_IGNORED, bert_key_map, renamer
from .model import BertEmbeddings, BertEncoder, EncoderOutput

BERT = Family(
    read_config=bert_config,
    build=BertEncoder,
    key_map=bert_key_map,
    num_layers=lambda config: config.num_hidden_layers,
    rename=renamer("bert."),
    ignored=BERT_IGNORED,
)

__all__ = [
    "BERT",
    "BertConfig",
    "BertEmbeddings",
    "BertEncoder",
    "EncoderOutput",
    "bert_config",
    "bert_key_map",
]
