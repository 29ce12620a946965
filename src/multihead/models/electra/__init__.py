"""ELECTRA encoders (Hugging Face ElectraModel, and the discriminator / generator checkpoints'
encoder): BERT's module and key names, with embeddings `embedding_size` wide projected to
hidden_size by `embeddings_project` when the two differ (ELECTRA-small: 128 -> 256)."""

from ..bert import BERT_IGNORED, BertConfig, BertEncoder, bert_key_map, renamer
from ..bert.config import bert_like_config
from ..fields import Fields
from ..loading import Family


def electra_config(config: dict) -> BertConfig:
    f = Fields(config, "electra")
    base = bert_like_config(f, pad_default=0, position_style="bert")
    width = f.int("embedding_size", base.hidden_size)
    return BertConfig(**{**base.__dict__, "embedding_size": width})


ELECTRA = Family(
    read_config=electra_config,
    build=BertEncoder,
    key_map=bert_key_map,
    num_layers=lambda config: config.num_hidden_layers,
    rename=renamer("electra."),
    # the pretraining heads (discriminator, generator) and task heads are not the encoder
    ignored=(
        *BERT_IGNORED,
        "discriminator_predictions.",
        "generator_predictions.",
        "generator_lm_head.",
        "classifier.",
        "qa_outputs.",
    ),
)

__all__ = ["ELECTRA", "electra_config"]
