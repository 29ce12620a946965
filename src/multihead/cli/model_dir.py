"""Models named on the command line, checked before anything slow by the library's own check
(`multihead.models.check.check_model`, which `multihead.load` runs too): the CLI only turns its
error into the one `multihead: error:` line, so a bad directory reads the same both ways."""

from __future__ import annotations

from typing import Any

from ..models.check import ModelCheckError, ModelFiles
from ..models.check import check_model as check_model_files
from ..models.source import DEFAULT_MODEL as DEFAULT_MODEL  # the commands' default
from ..models.source import ModelNotFoundError
from .errors import UsageError

# model_type values that load_encoder and load_causal_lm read (literals: the CLI checks before
# importing torch; tests keep them equal to models.ENCODER_FAMILIES and CAUSAL_LM_FAMILIES)
ENCODER_TYPES = ("bert", "distilbert", "electra", "modernbert", "mpnet", "roberta", "xlm-roberta")
CAUSAL_LM_TYPES: tuple[str, ...] = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "phi3")
CAUSAL_LM_TYPES += ("gemma", "gemma2", "gemma3_text", "qwen3", "olmo2")  # (models/decoder_keys.py)


class ModelDir(ModelFiles):
    """A checked model as a command sees it: its errors are usage errors."""

    def error(self, problem: str) -> UsageError:  # type: ignore[override]
        return UsageError(f"model {self.name!r}: {problem}")

    def check_length(self, value: int | None, option: str, low: int = 1) -> None:
        """A token count asked on the command line must fit the model's position table."""
        if value is None:
            return
        high = self.max_positions
        if value < low or (high is not None and value > high):
            bound = f"[{low}, {high}]" if high is not None else f"at least {low}"
            raise UsageError(
                f"{option} must be {'in ' if high is not None else ''}{bound} for this model "
                f"(max_position_embeddings in config.json), got {value}"
            )


def check_model(name: str, *, tokenizer: bool = True) -> ModelDir:
    """The model behind `name`, with every file it needs readable (tokenizer.json unless
    `tokenizer=False`: a decoder benchmarked on random token ids needs none); the library's
    error, unchanged, as a usage error."""
    try:
        files = check_model_files(name, tokenizer=tokenizer, architecture=_bridged_gguf)
    except (ModelNotFoundError, ModelCheckError) as e:
        raise UsageError(str(e)) from None
    return ModelDir(
        files.name,
        files.path,
        files.config,
        files.transformer_dir,
        files.is_gguf,
        files.gguf_architecture,
    )


def _bridged_gguf(model: ModelFiles) -> None:
    """A GGUF file whose general.architecture no native family reads is checked as
    `multihead.load` checks it (`pretrained.auto.check_architecture`: can the bridge build it;
    the same error otherwise), so it loads through the bridge as `multihead.load` loads it.
    Directories keep the commands' own checks (torch and transformers are imported only here)."""
    if model.gguf_architecture is None:
        return
    from ..pretrained.auto import check_architecture

    check_architecture(model)


def load_sentence_encoder(model: ModelDir, command: str):
    """A BERT-family `SentenceEncoder`; other architectures are refused by name."""
    if model.model_type not in ENCODER_TYPES:
        raise model.error(
            f"`multihead {command}` reads BERT-family encoders (model_type "
            f"{', '.join(map(repr, ENCODER_TYPES))}); this model's config.json says model_type "
            f"{model.model_type!r}"
        )
    from ..pretrained import load_encoder

    try:
        return load_encoder(model.path)
    except (ValueError, OSError) as e:  # the checkpoint does not fit its config, and the like
        raise model.error(str(e)) from None


def load_subject(model: ModelDir, command: str):
    """What `inspect` and `heads` analyse: an `EncoderSubject` for a BERT-family encoder, a
    `CausalLMSubject` for a causal LM: native families as they are, other decoder-only
    architectures through the bridge (which refuses, by name, those it cannot route). An
    encoder-decoder is refused here, before anything loads."""
    native = ENCODER_TYPES + CAUSAL_LM_TYPES
    # a bridged GGUF file has no config.json: its general.architecture names the model_type
    config = {"model_type": model.gguf_architecture} if model.gguf_architecture else model.config
    kind = config.get("model_type")
    if kind not in native and is_encoder_decoder(config):
        says = "general.architecture" if model.gguf_architecture else "config.json says model_type"
        raise model.error(
            f"`multihead {command}` reads BERT-family encoders (model_type "
            f"{', '.join(map(repr, ENCODER_TYPES))}) and causal LMs (model_type "
            f"{', '.join(map(repr, CAUSAL_LM_TYPES))} natively, other decoder-only models "
            f"through the bridge); this model's {says} {kind!r}, an encoder-decoder"
        )
    from ..interpret.subject import EncoderSubject
    from ..interpret.subject import load_subject as load

    try:
        if model.model_type in ENCODER_TYPES:
            return EncoderSubject(load_sentence_encoder(model, command))
        return load(model.path)
    except (ValueError, OSError) as e:  # the checkpoint does not fit its config, and the like
        raise model.error(" ".join(str(e).split())) from None


# model_types of encoder-decoders (their config.json usually says is_encoder_decoder too)
ENCODER_DECODER_TYPES = (
    "t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus",
    "marian", "whisper", "blenderbot", "prophetnet", "led", "encoder-decoder",
)  # fmt: skip


def is_encoder_decoder(config: dict[str, Any]) -> bool:
    return bool(config.get("is_encoder_decoder")) or config.get("model_type") in (
        ENCODER_DECODER_TYPES
    )
