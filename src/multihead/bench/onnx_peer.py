"""The ONNX Runtime peer of `multihead bench embed`: the directory's transformers model
(BertModel for MiniLM) exported with `torch.onnx.export(dynamo=True)` (dynamic batch and
length; the TorchScript exporter traces transformers 5's attention mask wrongly: hidden states
off by ~1), run by onnxruntime with every graph optimisation (ORT_ENABLE_ALL: attention and
GELU fusion, constant folding) and torch's intra-op thread count.

It encodes as sentence-transformers does: texts tokenised by the same tokenizer (ids equal to
multihead's), sorted by length, cut into `batch_size` batches padded to their longest text; the
states pooled and normalised as the model directory says (multihead's pooling functions on the
ORT output). Optional: `pip install 'multihead[bench]'` brings onnxruntime and onnxscript.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model_layout import transformer_folder
from ..pretrained.encoder import SentenceEncoder
from ..pretrained.pooling import pool_padded

REQUIRES = ("onnxruntime", "onnxscript")


def missing() -> list[str]:
    """The packages the peer needs that are not installed."""
    return [m for m in REQUIRES if importlib.util.find_spec(m) is None]


class _LastHidden(torch.nn.Module):
    """The transformers model with the two inputs and one output the export names."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def export(model_dir: Path, path: Path, max_length: int) -> None:
    """The transformers model of `model_dir` as ONNX at `path` (inputs (B, T) int64 ids and
    mask, output (B, T, C) states; T up to `max_length`)."""
    import warnings

    import transformers

    model = transformers.AutoModel.from_pretrained(str(model_dir)).eval()
    ids = torch.ones(2, 8, dtype=torch.long)
    B, T = torch.export.Dim("batch"), torch.export.Dim("length", max=max_length)
    with warnings.catch_warnings():  # the exporter's notes on torchvision ops and the like
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _LastHidden(model),
            (ids, torch.ones_like(ids)),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_shapes={"input_ids": {0: B, 1: T}, "attention_mask": {0: B, 1: T}},
            dynamo=True,
            verbose=False,
        )


class OnnxEncoder:
    """`encoder`'s model under ONNX Runtime (see the module docstring); `threads`: ORT's
    intra-op threads (default torch's)."""

    def __init__(self, encoder: SentenceEncoder, *, threads: int | None = None) -> None:
        absent = missing()
        if absent:
            raise ImportError(
                f"the ONNX Runtime peer needs {', '.join(absent)}: pip install 'multihead[bench]'"
            )
        if encoder.source is None:
            raise ValueError("the ONNX Runtime peer exports the encoder's model directory: none")
        import onnxruntime as ort

        self.encoder = encoder
        self.threads = threads or torch.get_num_threads()
        with tempfile.TemporaryDirectory(prefix="multihead-onnx-") as tmp:
            path = Path(tmp) / "model.onnx"
            export(transformer_folder(encoder.source), path, encoder.max_position_limit)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            # the session holds the model in memory: the file may go
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )

    def encode(self, texts: list[str], batch_size: int = 32) -> Any:
        """(N, dim) float32 embeddings, in the order of `texts`."""
        ids = self.encoder.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = np.empty((len(texts), self.encoder.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = self.encoder.batch([ids[i] for i in rows])  # (b, T) padded
            (hidden,) = self.session.run(
                None, {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
            )
            pooled = pool_padded(torch.from_numpy(hidden), mask, self.encoder.pooling)
            if self.encoder.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[rows] = pooled.numpy()
        return out
