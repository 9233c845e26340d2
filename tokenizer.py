"""BERT WordPiece tokenizer on the Rust `tokenizers` library, with the course's calling convention.

    tok = BertTokenizer.from_pretrained("minilm-l6")      # or bert-base-uncased, or a directory
    batch = tok(["a sentence", "another"], padding=True, truncation=True, max_length=128,
                return_tensors="pt")                      # input_ids, token_type_ids, attention_mask
    pair = tok(questions, text_pair=answers, ...)         # [CLS] a [SEP] b [SEP] with segment ids

Ids equal Hugging Face `BertTokenizerFast` (checked in tests/test_tokenizer.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from base_bert import CheckpointError, resolve_pretrained

DEFAULT_MAX_LENGTH = 512


def shortest_max_length(texts: int) -> int:
    """The shortest truncation length that keeps a token of each of `texts` texts (1, or 2 for a pair encoded
    jointly) beside the special tokens, [CLS] a [SEP] or [CLS] a [SEP] b [SEP]. Below it the Rust tokenizer cannot
    cut and returns the texts whole, however long."""
    return 2 * texts + 1


class BertTokenizer:
    def __init__(self, backend: Tokenizer, model_max_length: int = DEFAULT_MAX_LENGTH):
        self.backend = backend
        self.backend.no_padding()
        self.backend.no_truncation()
        self.model_max_length = model_max_length
        self.pad_token_id = self.backend.token_to_id("[PAD]")
        self.cls_token_id = self.backend.token_to_id("[CLS]")
        self.sep_token_id = self.backend.token_to_id("[SEP]")
        self.unk_token_id = self.backend.token_to_id("[UNK]")
        self.mask_token_id = self.backend.token_to_id("[MASK]")  # None is allowed: only the MLM stage needs it
        if None in (self.pad_token_id, self.cls_token_id, self.sep_token_id, self.unk_token_id):
            raise CheckpointError("the vocabulary lacks one of [PAD], [CLS], [SEP], [UNK]")
        self._settings: tuple = (None, None)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike = "bert-base-uncased") -> "BertTokenizer":
        """Load from tokenizer.json when present, else build BERT's WordPiece pipeline from vocab.txt."""
        directory = resolve_pretrained(name_or_path)
        try:
            return cls._from_directory(directory)
        except CheckpointError:
            raise
        except Exception as err:  # json and the Rust tokenizers library raise their own kinds
            raise CheckpointError(f"{directory}: cannot read the tokenizer ({type(err).__name__}: {err})") from None

    @classmethod
    def _from_directory(cls, directory: Path) -> "BertTokenizer":
        settings = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.is_file():
            settings = json.loads(config_file.read_text(encoding="utf-8"))
        max_length = settings.get("model_max_length", DEFAULT_MAX_LENGTH)
        if not isinstance(max_length, int) or max_length > DEFAULT_MAX_LENGTH:
            max_length = DEFAULT_MAX_LENGTH  # some configs store a huge sentinel meaning "unset"
        if (directory / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(directory / "tokenizer.json")), max_length)
        vocab = directory / "vocab.txt"
        if not vocab.is_file():
            raise CheckpointError(f"{directory}: neither tokenizer.json nor vocab.txt")
        lowercase = settings.get("do_lower_case", True)
        wordpiece = BertWordPieceTokenizer(
            str(vocab), lowercase=lowercase, strip_accents=settings.get("strip_accents"),
            clean_text=True, handle_chinese_chars=settings.get("tokenize_chinese_chars", True))
        return cls(wordpiece._tokenizer, max_length)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def check_fits(self, vocab_size: int, model: str) -> None:
        """Refuse a vocabulary larger than the model's embedding table (vocab_size rows): an id past its end
        would fail in the middle of a run."""
        if self.vocab_size > vocab_size:
            raise CheckpointError(f"{model}: the tokenizer has {self.vocab_size} tokens but the model's embedding "
                                  f"table has {vocab_size} rows (config.json vocab_size); they must come together")

    def tokenize(self, text: str) -> list[str]:
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each text's token ids, without special tokens, untruncated and unpadded, with every token's
        (start, end) character span in the text as written (extractive QA maps predicted spans back by them)."""
        self._configure(None, None)
        return [(e.ids, e.offsets) for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.backend.token_to_id(t) if self.backend.token_to_id(t) is not None else self.unk_token_id
                for t in tokens]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _configure(self, truncate_to: int | None, pad_to: int | str | None) -> None:
        """Set the Rust pipeline's truncation and padding only when they change (they are sticky)."""
        if (truncate_to, pad_to) == self._settings:
            return
        if truncate_to is None:
            self.backend.no_truncation()
        else:
            # longest_first trims the longer sentence of a pair token by token, like Hugging Face.
            self.backend.enable_truncation(truncate_to, strategy="longest_first")
        if pad_to is None:
            self.backend.no_padding()
        else:
            self.backend.enable_padding(pad_id=self.pad_token_id, pad_token="[PAD]",
                                        length=None if pad_to == "longest" else pad_to)
        self._settings = (truncate_to, pad_to)

    def __call__(self, text: str | list[str], text_pair: str | list[str] | None = None,
                 padding: bool | str = False, truncation: bool = False, max_length: int | None = None,
                 return_tensors: str | None = None) -> dict:
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        inputs = texts
        if text_pair is not None:
            pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} text pairs")
            inputs = list(zip(texts, pairs))
        if padding not in (False, True, "longest", "max_length", "do_not_pad"):
            raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}")
        limit = max_length or self.model_max_length
        if truncation and limit < shortest_max_length(1 if text_pair is None else 2):
            raise ValueError(f"max_length {limit} cannot truncate: it must leave a token of each text beside the "
                             f"special tokens (>= {shortest_max_length(1 if text_pair is None else 2)})")
        pad_to = {True: "longest", "longest": "longest", "max_length": limit}.get(padding)
        self._configure(limit if truncation else None, pad_to)
        encodings = self.backend.encode_batch(inputs)
        result = {"input_ids": [e.ids for e in encodings],
                  "token_type_ids": [e.type_ids for e in encodings],
                  "attention_mask": [e.attention_mask for e in encodings]}
        if return_tensors == "pt":
            try:
                result = {k: torch.tensor(v, dtype=torch.long) for k, v in result.items()}
            except ValueError:
                raise ValueError("sequences of different lengths need padding=True for return_tensors='pt'") from None
        elif return_tensors is not None:
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        elif single:
            result = {k: v[0] for k, v in result.items()}
        return result
