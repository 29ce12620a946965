"""RoBERTa and XLM-RoBERTa encoders: BERT's module and key names, with positions that count
non-padding tokens from pad_token_id + 1 (so the usable length is max_position_embeddings -
pad_token_id - 1, 512 for the usual 514) and one token type."""

from ..bert import BERT_IGNORED, BertConfig, BertEncoder, bert_key_map, renamer
from ..bert.config import bert_like_config
from ..fields import Fields
from ..loading import Family


def roberta_config(config: dict) -> BertConfig:
    f = Fields(config, str(config.get("model_type")))
    return bert_like_config(f, pad_default=1, position_style="roberta")


def _rename(key: str) -> str | None:
    for prefix in ("roberta.", "xlm_roberta."):
        if key.startswith(prefix):
            return renamer(prefix)(key)
    return renamer("")(key)


ROBERTA = Family(
    read_config=roberta_config,
    build=BertEncoder,
    key_map=bert_key_map,
    num_layers=lambda config: config.num_hidden_layers,
    rename=_rename,
    ignored=(*BERT_IGNORED, "lm_head.", "classifier."),
)

__all__ = ["ROBERTA", "roberta_config"]
