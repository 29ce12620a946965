"""SentenceEncoder: a BERT-family encoder + tokenizer + pooling, with sentence-transformers'
`encode` conventions (pooling and normalisation as the model directory says).

Speed comes from computing nothing on padding: every text is tokenised in one Rust call, texts
are sorted by token count, and a batch is the texts' tokens packed one after another (no padding,
no mask; see `functional.varlen`), so the matmuls run on real tokens only and attention runs
once per run of equal lengths. Batches are sized in tokens and shared out over the CPU cores
(see `batches`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from ..functional.varlen import VarLen
from ..hook_points import caches_as, observed
from ..models.bert import BertEncoder, EncoderOutput
from ..models.modernbert import ModernBertEncoder
from ..models.text import ModelTokenizer
from ..models.text_methods import TextMethods, is_text
from .batches import TOKENS_PER_TEXT, run_batches, token_batches
from .pooling import POOLING_MODES, pool_packed, pool_padded
from .tokenizer import encode_ids


class SentenceEncoder(nn.Module, TextMethods):
    """Token states, attention weights and sentence embeddings from one pretrained encoder.
    Its hook points are the model's (the wrapper adds no name segment). `tokenizer`: its
    ModelTokenizer ([CLS] text [SEP] for BERT), for `to_tokens` and the other text methods."""

    hook_alias: ClassVar[dict[str, str]] = {"model": ""}

    def __init__(
        self,
        model: BertEncoder | ModernBertEncoder,
        tokenizer: Tokenizer | ModelTokenizer,
        *,
        max_seq_length: int,
        normalize: bool,
        pad_token_id: int,
        pooling: tuple[str, ...] = ("mean",),
        source: Path | None = None,
    ) -> None:
        """`pooling`: modes among "mean", "cls", "max", concatenated when several.
        `tokenizer`: a ModelTokenizer, or a tokenizers.Tokenizer whose post-processor puts the
        model's special tokens around a text."""
        super().__init__()
        if not pooling or any(m not in POOLING_MODES for m in pooling):
            raise ValueError(f"pooling must be modes among {POOLING_MODES}, got {pooling!r}")
        if not 1 <= max_seq_length <= model.config.max_length:
            raise ValueError(
                f"max_seq_length must be in [1, {model.config.max_length}], got {max_seq_length}"
            )
        self.model = model
        if not isinstance(tokenizer, ModelTokenizer):
            name = "" if source is None else Path(source).name
            tokenizer = ModelTokenizer.from_tokenizer(tokenizer, pad_id=pad_token_id, name=name)
        self.tokenizer: ModelTokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.normalize = normalize
        self.pad_token_id = pad_token_id
        self.pooling = tuple(pooling)
        self.source = source

    @property
    def dim(self) -> int:
        """The embedding's width: hidden size times the number of pooling modes."""
        return self.model.config.hidden_size * len(self.pooling)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (inputs go there; embeddings come back to CPU)."""
        return self.model.embeddings.word_embeddings.weight.device

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        return_weights: bool = False,
        lengths: VarLen | Sequence[int] | None = None,
    ) -> EncoderOutput:
        """The encoder's token states: see `BertEncoder.forward` (padded or packed input).
        `input_ids` may be text (a str or a list, see `to_tokens`; padding gets its mask)."""
        if is_text(input_ids):
            input_ids, attention_mask = self._ids_and_mask(
                input_ids, attention_mask, None, None, "forward"
            )
        return self.model(
            input_ids,
            attention_mask,
            token_type_ids,
            return_weights=return_weights,
            lengths=lengths,
        )

    def tokenize(self, texts: list[str], max_seq_length: int | None = None) -> list[list[int]]:
        """Token ids per text, with the special tokens ([CLS]/[SEP], <s>/</s>), truncated to
        the maximum length (this call's only: the tokenizer is not changed)."""
        limit = self.max_seq_length if max_seq_length is None else max_seq_length
        return encode_ids(self.tokenizer.tokenizer, texts, limit)

    @property
    def special_ids(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer puts before and after every text: ([CLS], [SEP]) for BERT,
        ([<s>], [</s>]) for RoBERTa, ([], []) for a tokenizer that adds none."""
        raw = self.tokenizer.tokenizer
        inner = raw.encode("a", add_special_tokens=False).ids
        full = raw.post_process(raw.encode("a", add_special_tokens=False))
        ids = full.ids
        for i in range(len(ids) - len(inner) + 1):
            if ids[i : i + len(inner)] == inner:
                return ids[:i], ids[i + len(inner) :]
        return [], []

    def batch(self, ids: list[list[int]]) -> tuple[Tensor, Tensor]:
        """Right-pad token ids to the longest: input_ids (B, T) and attention_mask (B, T)."""
        T = max(len(x) for x in ids)
        input_ids = np.full((len(ids), T), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(ids), T), dtype=np.int64)
        for row, x in enumerate(ids):
            input_ids[row, : len(x)] = x
            mask[row, : len(x)] = 1
        return torch.from_numpy(input_ids), torch.from_numpy(mask)

    @staticmethod
    def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """Mean over real tokens: (B, T, C), (B, T) -> (B, C)."""
        return pool_padded(hidden, attention_mask, ("mean",))

    def pool(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """The model's own pooling (see `pooling`): (B, T, C), (B, T) -> (B, dim)."""
        return pool_padded(hidden, attention_mask, self.pooling)

    @caches_as("sequences")
    def encode(
        self,
        sentences: str | list[str],
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        convert_to_tensor: bool = False,
        show_progress_bar: bool = False,
        max_seq_length: int | None = None,
    ) -> Any:
        """Sentence embeddings, as sentence-transformers' `SentenceTransformer.encode`.

        A list gives a `(N, dim)` float32 array (a tensor with `convert_to_tensor=True`), a single
        string a `(dim,)` vector. Pooled as the model directory says (mean over real tokens
        unless 1_Pooling/config.json says CLS or max). As in sentence-transformers, a
        model whose pipeline normalises (all-MiniLM-L6-v2's modules.json lists Normalize) always
        does; `normalize_embeddings=True` normalises the others too. Results do not depend on
        batch size, order or batch companions. `batch_size` bounds memory: a batch packs up to
        `batch_size * 64` tokens (a longer text gets a batch of its own), never more than the
        `batch_size * max_seq_length` a padded batch may hold. Unnormalised pooled states:
        `pool(self(input_ids, mask).last_hidden_state, mask)`. Concurrent calls (threads), with
        different `max_seq_length`s or not, do not affect each other.
        """
        single = isinstance(sentences, str)
        texts = [sentences] if single else sentences
        if not isinstance(texts, (list, tuple)):
            raise TypeError(
                f"sentences must be a string or a list of strings, got {type(sentences).__name__}"
            )
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"sentences[{i}] must be a string, got {type(text).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if max_seq_length is not None and (
            isinstance(max_seq_length, bool)
            or not isinstance(max_seq_length, int)
            or not 1 <= max_seq_length <= self.max_position_limit
        ):
            raise ValueError(
                f"max_seq_length must be an int in [1, {self.max_position_limit}], "
                f"got {max_seq_length!r}"
            )
        normalize = self.normalize or bool(normalize_embeddings)

        out = torch.empty(len(texts), self.dim)
        ids = self.tokenize([str(t) for t in texts], max_seq_length) if texts else []
        self._check_vocabulary(ids)
        if ids and observed(self.model):  # hooks see each text alone, in order (no packing)
            with torch.inference_mode():
                for i, row in enumerate(ids):
                    out[i] = self._embed_alone(row, normalize)
        elif ids:
            order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first
            batches = token_batches(order, [len(x) for x in ids], batch_size * TOKENS_PER_TEXT)

            def work(rows: list[int]) -> None:
                out[torch.tensor(rows)] = self._embed([ids[i] for i in rows], normalize)

            if show_progress_bar:
                from tqdm.auto import tqdm

                with tqdm(total=len(batches), desc="Batches", unit="batch") as bar:
                    run_batches(work, batches, device=self.device, progress=bar.update)
            else:
                run_batches(work, batches, device=self.device)
        if single:
            out = out[0]
        return out if convert_to_tensor else out.numpy()

    def _embed(self, ids: list[list[int]], normalize: bool) -> Tensor:
        """Pooled embeddings (n, C) of n tokenised texts, packed without padding."""
        packed = VarLen([len(x) for x in ids])
        flat = torch.from_numpy(
            np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=packed.total)
        ).to(self.device)
        hidden = self.model(flat, lengths=packed).last_hidden_state  # (N, C)
        pooled = pool_packed(hidden, packed, self.pooling)  # (n, dim)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu()

    def _embed_alone(self, ids: list[int], normalize: bool) -> Tensor:
        """The pooled embedding (dim,) of one text run as a (1, T) batch: what `encode` runs
        while hooks observe the model, so that every hook point shows one text's (1, T, ...)
        activations and its (1, H, T, T) pattern, in input order (packed batches have no
        per-text pattern, and run in worker threads in length order)."""
        input_ids = torch.tensor([ids], device=self.device)
        mask = torch.ones_like(input_ids)
        hidden = self.model(input_ids).last_hidden_state  # (1, T, C)
        pooled = pool_padded(hidden, mask, self.pooling)  # (1, dim)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled[0].float().cpu()

    def _check_vocabulary(self, ids: list[list[int]]) -> None:
        """The tokenizer's ids fit the model's embedding table (checked on the Python lists,
        before any tensor is made)."""
        vocab = self.model.config.vocab_size
        highest = max((max(x) for x in ids if x), default=-1)
        if highest >= vocab:
            raise ValueError(
                f"the tokenizer produced token id {highest}, outside the model's vocabulary "
                f"({vocab} ids): tokenizer.json does not belong to this model"
            )

    def _text_max_length(self) -> int | None:
        return self.max_seq_length

    def _text_device(self) -> torch.device:
        return self.device

    @property
    def max_position_limit(self) -> int:
        """The longest sequence the model's position table holds."""
        return self.model.config.max_length
