"""Small random RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ELECTRA and ModernBERT checkpoints saved by `transformers`,
each with a real tokenizer.json trained on a few sentences with the `tokenizers` library (BPE,
Unigram, WordPiece; MPNet's: WordPiece with RoBERTa's <s> </s> specials), optionally wrapped as a sentence-transformers model (Pooling, Normalize).
Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch

SENTENCES = [
    "The cat sat on the mat.",
    "A dog runs fast in the park, chasing a red ball!",
    "Sentences about cats and dogs make small corpora.",
    "Hello world, hello tokenizers.",
    "Crème brûlée and naïve façades are French words.",
    "Numbers like 42 and 1999 appear too.",
    "the quick brown fox jumps over the lazy dog",
]
SPECIAL_ROBERTA = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4: pad 1 as RoBERTa
SPECIAL_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SIZES = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40)


def _bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL_ROBERTA,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 3, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def _unigram():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=150, special_tokens=SPECIAL_ROBERTA, unk_token="<unk>"
    )
    tok.train_from_iterator(SENTENCES * 3, trainer)
    tok.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok


def _wordpiece():
    from tokenizers import BertWordPieceTokenizer, processors

    helper = BertWordPieceTokenizer(lowercase=True)
    helper.train_from_iterator(SENTENCES * 3, vocab_size=200, special_tokens=SPECIAL_BERT)
    tok = helper._tokenizer  # the Tokenizer inside the helper class
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return tok


def _wordpiece_mpnet():
    """As all-mpnet-base-v2's: lowercasing WordPiece, <s> $A </s> with <pad> at id 1."""
    from tokenizers import BertWordPieceTokenizer, processors

    helper = BertWordPieceTokenizer(
        lowercase=True,
        unk_token="<unk>",
        sep_token="</s>",
        cls_token="<s>",
        pad_token="<pad>",
        mask_token="<mask>",
    )
    helper.train_from_iterator(SENTENCES * 3, vocab_size=200, special_tokens=SPECIAL_ROBERTA)
    tok = helper._tokenizer  # the Tokenizer inside the helper class
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def save_tokenizer(directory: Path, kind: str) -> int:
    """tokenizer.json (+ tokenizer_config.json, as transformers saves) in `directory`; returns
    the vocabulary size."""
    import transformers

    makers = {
        "bpe": _bpe,
        "unigram": _unigram,
        "wordpiece": _wordpiece,
        "wordpiece-mpnet": _wordpiece_mpnet,
    }
    tok = makers[kind]()
    specials = (
        dict(
            bos_token="<s>",
            eos_token="</s>",
            cls_token="<s>",
            sep_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
        )
        if kind != "wordpiece"
        else dict(
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            unk_token="[UNK]",
            mask_token="[MASK]",
        )
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    fast.save_pretrained(directory)
    return tok.get_vocab_size()


# model_type -> (config class, model class, tokenizer kind, config overrides)
KINDS = {
    "roberta": ("RobertaConfig", "RobertaModel", "bpe", dict(max_position_embeddings=40)),
    "xlm-roberta": (
        "XLMRobertaConfig",
        "XLMRobertaModel",
        "unigram",
        dict(max_position_embeddings=40, type_vocab_size=1, pad_token_id=1),
    ),
    "distilbert": (
        "DistilBertConfig",
        "DistilBertModel",
        "wordpiece",
        dict(max_position_embeddings=40),
    ),
    "mpnet": ("MPNetConfig", "MPNetModel", "wordpiece-mpnet", dict(max_position_embeddings=40)),
    # embeddings narrower than the stream: embeddings_project maps 16 -> 24
    "electra": (
        "ElectraConfig",
        "ElectraModel",
        "wordpiece",
        dict(max_position_embeddings=40, embedding_size=16),
    ),
    # layer 0 global, layer 1 local with a window (3 each side) shorter than the sentences;
    # every bias present and distinct RoPE bases, so each shows in the states
    "modernbert": (
        "ModernBertConfig",
        "ModernBertModel",
        "wordpiece",
        dict(
            max_position_embeddings=40,
            local_attention=6,
            global_attn_every_n_layers=2,
            global_rope_theta=500.0,
            local_rope_theta=40.0,
            norm_bias=True,
            attention_bias=True,
            mlp_bias=True,
            pad_token_id=0,
            cls_token_id=2,
            sep_token_id=3,
            bos_token_id=2,
            eos_token_id=3,
        ),
    ),
}


def save_encoder(directory: Path, model_type: str, *, seed: int = 0, **overrides):
    """A random encoder of `model_type` + its tokenizer in `directory`; returns the HF model
    (eval, eager attention so it can return weights)."""
    import transformers

    config_cls, model_cls, tok_kind, extra = KINDS[model_type]
    directory.mkdir(parents=True, exist_ok=True)
    vocab = save_tokenizer(directory, tok_kind)
    sizes = dict(SIZES)
    if model_type == "distilbert":
        sizes = dict(dim=24, n_layers=2, n_heads=3, hidden_dim=40)
    config = getattr(transformers, config_cls)(vocab_size=vocab, **sizes, **(extra | overrides))
    torch.manual_seed(seed)
    kwargs = (
        {}
        if model_type in ("distilbert", "electra", "modernbert")
        else {"add_pooling_layer": False}
    )
    model = getattr(transformers, model_cls)(config, **kwargs)
    with torch.no_grad():  # every weight random, biases and norms included (init zeros / ones)
        for key, p in model.named_parameters():
            p.normal_(1.0 if "norm" in key.lower() else 0.0, 0.2)
    model.save_pretrained(directory)
    return model.eval()


def save_sentence_transformer(
    directory: Path, model_dir: Path, pooling: str | tuple[str, ...], *, normalize: bool, **kwargs
):
    """model_dir wrapped as a sentence-transformers model (Transformer, Pooling, Normalize)
    and saved to `directory`; returns it."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(model_dir), **kwargs)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling)]
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(directory))
    return model
