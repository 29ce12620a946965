"""Sentence-transformers' settings in a model directory, read without sentence-transformers.

modules.json lists the pipeline: Transformer (its files at the top or, as sentence-transformers
before v3 saved them, in a subfolder such as 0_Transformer/: see `model_layout`), then Pooling
(1_Pooling/config.json: mean, CLS, max) and an optional Normalize; any other module (Dense,
LayerNorm, ...) would change the embedding and is refused by name. The maximum length comes
from sentence_bert_config.json's max_seq_length (or the first older name sentence-transformers
reads, sentence_roberta_config.json, ...), else tokenizer_config.json (model_max_length, where
sentence-transformers 6 writes it), capped at the model's position table; do_lower_case adds a
Lowercase step. A default prompt (config_sentence_transformers.json) would be prepended to
every text by sentence-transformers and is refused. Without modules.json: mean pooling, no
normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model_layout import module_entries, module_folder, module_kind, transformer_folder
from ..models.checkpoint import read_json
from .pooling import POOLING_MODES

# sentence-transformers' legacy pooling flags, in its concatenation order
LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# the Transformer's settings file, then the older names sentence-transformers still reads
SETTINGS_FILES = tuple(
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)
# modules that do nothing at inference
HARMLESS_MODULES = ("Dropout",)


@dataclass(frozen=True)
class SentenceSettings:
    max_seq_length: int
    pooling: tuple[str, ...]
    normalize: bool
    lowercase: bool


def _pooling_modes(config_path: Path, hidden_size: int) -> tuple[str, ...]:
    config = read_json(config_path)
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = tuple(mode) if isinstance(mode, list) else (mode,)
    else:
        modes = tuple(m for key, m in LEGACY_POOLING.items() if config.get(key)) or ("mean",)
    unsupported = [m for m in modes if m not in POOLING_MODES]
    if unsupported:
        raise ValueError(
            f"{str(config_path)!r}: pooling mode {', '.join(map(str, unsupported))} is not "
            f"supported; multihead implements {', '.join(POOLING_MODES)}"
        )
    dim = config.get("embedding_dimension", config.get("word_embedding_dimension", hidden_size))
    if dim != hidden_size:
        raise ValueError(
            f"{str(config_path)!r}: embedding_dimension {dim} != the model's hidden size "
            f"{hidden_size}"
        )
    return modes


def _positive(path: Path, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{str(path)!r}: {key} must be a positive int, got {value!r}")
    return value


def read_sentence_settings(model_dir: Path, hidden_size: int, max_length: int) -> SentenceSettings:
    """The directory's settings; `max_length`: the longest sequence the model can take.
    sentence_bert_config.json and tokenizer_config.json are the Transformer's files, read from
    its folder (see `model_layout.transformer_folder`)."""
    pooling: tuple[str, ...] = ("mean",)
    normalize = False
    entries = module_entries(model_dir)
    if entries is not None:
        kinds = [module_kind(e) for e in entries]
        other = [
            f"{e.get('type')} ({e.get('path')})"
            for e, kind in zip(entries, kinds, strict=True)
            if kind not in ("Transformer", "Pooling", "Normalize", *HARMLESS_MODULES)
        ]
        if other:
            raise ValueError(
                f"modules.json lists {', '.join(other)}: multihead implements Transformer, "
                "Pooling and Normalize"
            )
        order = [k for k in kinds if k not in HARMLESS_MODULES]
        if order not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            raise ValueError(
                f"modules.json runs {' -> '.join(order)}; multihead implements Transformer -> "
                "Pooling (-> Normalize)"
            )
        pooling_entry = entries[kinds.index("Pooling")]
        pooling = _pooling_modes(  # inside the model directory, as the Transformer's
            module_folder(model_dir, pooling_entry) / "config.json", hidden_size
        )
        normalize = "Normalize" in kinds

    limit, lowercase = max_length, False
    files = transformer_folder(model_dir)
    st_path = next(
        (files / n for n in SETTINGS_FILES if (files / n).is_file()), files / SETTINGS_FILES[0]
    )
    st = read_json(st_path) if st_path.is_file() else {}
    tok_path = files / "tokenizer_config.json"
    if st.get("max_seq_length") is not None:
        limit = _positive(st_path, "max_seq_length", st["max_seq_length"])
    elif tok_path.is_file():
        value = read_json(tok_path).get("model_max_length")
        if value is not None:
            # transformers writes a huge number (1e30) for "no limit": the model's then applies
            if isinstance(value, float) and value.is_integer() and value > max_length:
                value = max_length
            limit = _positive(tok_path, "model_max_length", value)
    task = st.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise ValueError(f"{str(st_path)!r}: transformer_task {task!r} is not supported")
    if "do_lower_case" in st:
        lowercase = st["do_lower_case"]
        if not isinstance(lowercase, bool):
            raise ValueError(f"{str(st_path)!r}: do_lower_case must be true or false")

    prompts_path = model_dir / "config_sentence_transformers.json"
    if prompts_path.is_file():
        default_prompt = read_json(prompts_path).get("default_prompt_name")
        if default_prompt is not None:
            raise ValueError(
                f"{str(prompts_path)!r}: default_prompt_name {default_prompt!r} would prepend a "
                "prompt to every text; multihead does not implement prompts"
            )
    return SentenceSettings(min(limit, max_length), pooling, normalize, lowercase)
