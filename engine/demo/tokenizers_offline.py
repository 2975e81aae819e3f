"""Real, saveable CLIP and T5 tokenizers built in code, so tiny test models need no download.

The vocabularies are tiny and fixed (a short English word list plus the full byte / character
alphabet), so any prompt tokenizes without unknown-token surprises and every build is byte-identical.
Saved folders load with ``transformers.CLIPTokenizer`` / ``T5Tokenizer`` / ``T5TokenizerFast``
(``from_pretrained(dir)``), which is what diffusers' ``model_index.json`` names.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers.pre_tokenizers import ByteLevel
from transformers import CLIPTokenizer, T5Tokenizer

__all__ = [
    "CLIP_BOS",
    "CLIP_EOS",
    "PROMPT_WORDS",
    "build_clip_tokenizer",
    "build_t5_tokenizer",
    "save_clip_tokenizer",
    "save_t5_tokenizer",
    "write_clip_slow_files",
]

CLIP_BOS = "<|startoftext|>"
CLIP_EOS = "<|endoftext|>"

# Words that get whole-word tokens; anything else still tokenizes (bytes / single characters).
PROMPT_WORDS: tuple[str, ...] = (
    "a", "an", "the", "of", "in", "on", "with", "and", "at", "by",
    "photo", "painting", "picture", "image", "video", "portrait", "landscape",
    "cat", "dog", "horse", "bird", "fish", "astronaut", "robot", "person", "woman", "man",
    "riding", "sitting", "running", "flying", "standing",
    "red", "green", "blue", "yellow", "black", "white", "small", "large", "tiny",
    "mountain", "sea", "city", "forest", "sky", "space", "moon", "sun", "night", "day",
    "high", "quality", "detailed", "realistic", "style", "console", "demo",
)  # fmt: skip


def _clip_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's layout: 256 byte symbols, the same with ``</w>``, merges, then BOS/EOS last."""
    alphabet = sorted(ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    for ch in alphabet:
        vocab[ch + "</w>"] = len(vocab)
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for word in PROMPT_WORDS:
        parts = list(word)
        parts[-1] += "</w>"
        cur = parts[0]
        for nxt in parts[1:]:
            pair = (cur, nxt)
            cur += nxt
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            if cur not in vocab:
                vocab[cur] = len(vocab)
    vocab[CLIP_BOS] = len(vocab)
    vocab[CLIP_EOS] = len(vocab)
    return vocab, merges


def build_clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """A byte-level BPE CLIP tokenizer (bos/eos/pad as in openai/clip-vit-large-patch14)."""
    vocab, merges = _clip_vocab_and_merges()
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)


def save_clip_tokenizer(path: Path, model_max_length: int = 77) -> CLIPTokenizer:
    """Save the CLIP tokenizer; also write vocab.json/merges.txt so slow-tokenizer loaders work too."""
    path = Path(path)
    tok = build_clip_tokenizer(model_max_length)
    tok.save_pretrained(str(path))
    write_clip_slow_files(path)
    return tok


def write_clip_slow_files(path: Path) -> None:
    """vocab.json + merges.txt beside tokenizer.json, for loaders that want CLIP's classic files."""
    path = Path(path)
    vocab, merges = _clip_vocab_and_merges()
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (path / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _t5_vocab() -> list[tuple[str, float]]:
    """T5's Unigram layout: <pad>=0, </s>=1, <unk>=2, then scored pieces (words beat characters)."""
    vocab: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + w, -3.0) for w in PROMPT_WORDS]
    chars = string.ascii_letters + string.digits + string.punctuation
    vocab += [("\u2581" + c, -6.0) for c in chars]
    vocab += [(c, -8.0) for c in chars]
    return vocab


def build_t5_tokenizer(model_max_length: int = 512) -> T5Tokenizer:
    """A Unigram (SentencePiece-style) T5 tokenizer; also serves UMT5 (Wan) which uses the same class."""
    return T5Tokenizer(vocab=_t5_vocab(), extra_ids=0, model_max_length=model_max_length)


def save_t5_tokenizer(path: Path, model_max_length: int = 512) -> T5Tokenizer:
    """Save tokenizer.json + tokenizer_config.json (loads as T5Tokenizer or T5TokenizerFast)."""
    tok = build_t5_tokenizer(model_max_length)
    tok.save_pretrained(str(path))
    return tok
