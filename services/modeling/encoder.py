"""A sentence encoder over an HF encoder folder: an optional prefix (or instruction) per side, mean or CLS pooling,
and L2 normalisation, set by the model family's preset and overridable by settings.

Presets (`PRESETS`), chosen by `encoder_config` from the folder's name, else the `_name_or_path` of its
config.json; a sentence-transformers export's own files then have the last word before explicit settings:
`1_Pooling/config.json` (pooling), `modules.json` (a Normalize module or none) and the `prompts` of
`config_sentence_transformers.json`.

* e5 (intfloat/e5-*): "query: " / "passage: ", mean pooling, normalised;
* BGE (BAAI/bge-*): the query instruction, no passage prefix, CLS pooling, normalised;
* MiniLM (sentence-transformers/all-MiniLM-*, the shipped default; also anything unrecognised): no prefixes, mean
  pooling, normalised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from services.common.hardware import resolve_dtype

TextKind = Literal["query", "passage"]
Pooling = Literal["mean", "cls"]


class EncoderConfig(BaseModel):
    """How texts become vectors; the same for the query tower and the document tower of one model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str = "minilm"
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: Pooling = "mean"
    normalize: bool = True

    def prefix(self, kind: TextKind) -> str:
        return self.query_prefix if kind == "query" else self.passage_prefix


BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
PRESETS: dict[str, EncoderConfig] = {
    "e5": EncoderConfig(preset="e5", query_prefix="query: ", passage_prefix="passage: ", pooling="mean"),
    "bge": EncoderConfig(preset="bge", query_prefix=BGE_QUERY_INSTRUCTION, pooling="cls"),
    "minilm": EncoderConfig(preset="minilm"),
}
# A family's name as a word of the model name: "e5-base-v2", "multilingual-e5-small", "bge-small-en-v1.5".
_FAMILIES = [("e5", re.compile(r"(^|[^a-z0-9])e5([^a-z0-9]|$)")), ("bge", re.compile(r"(^|[^a-z0-9])bge([^a-z0-9]|$)")),
             ("minilm", re.compile(r"minilm"))]  # fmt: skip


def preset_name(folder: Path) -> str:
    """The family of the folder's name, else of the `_name_or_path` in its config.json, else minilm."""
    names = [folder.name.lower()]
    try:
        names.append(str(json.loads((folder / "config.json").read_text()).get("_name_or_path", "")).lower())
    except (OSError, ValueError):
        pass
    for name in names:
        for family, pattern in _FAMILIES:
            if pattern.search(name.rsplit("/", 1)[-1]):
                return family
    return "minilm"


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sentence_transformers_config(folder: Path) -> dict:
    """What a sentence-transformers export in `folder` says about pooling, normalisation and prompts."""
    found: dict = {}
    modules = _read_json(folder / "modules.json")
    pooling_dir = "1_Pooling"
    if isinstance(modules, list):
        types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
        found["normalize"] = any(t.endswith(".Normalize") for t in types)
        pooling_dir = next((m.get("path") for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
    pooling = _read_json(folder / pooling_dir / "config.json") if pooling_dir else None
    if isinstance(pooling, dict):
        if pooling.get("pooling_mode_cls_token"):
            found["pooling"] = "cls"
        elif pooling.get("pooling_mode_mean_tokens"):
            found["pooling"] = "mean"
    prompts = (_read_json(folder / "config_sentence_transformers.json") or {}).get("prompts") or {}
    if prompts.get("query"):
        found["query_prefix"] = prompts["query"]
    passage = prompts.get("passage") or prompts.get("document")
    if passage:
        found["passage_prefix"] = passage
    return found


def encoder_config(folder: str | Path, **overrides: str | bool) -> EncoderConfig:
    """The preset of `folder`, then what its sentence-transformers files say, then `overrides` (settings:
    query_prefix, passage_prefix, pooling, normalize). An unknown pooling is refused (pydantic's ValueError)."""
    folder = Path(folder)
    preset = PRESETS[preset_name(folder)]
    return EncoderConfig.model_validate({**preset.model_dump(), **sentence_transformers_config(folder), **overrides})


def mean_pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)  # (B, T, 1)
    summed = (last_hidden * mask).sum(dim=1)  # (B, H)
    return summed / mask.sum(dim=1).clamp(min=1e-9)


def cls_pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The first token's hidden state ([CLS]: the tokenizer pads on the right); (B, H)."""
    return last_hidden[:, 0]


POOLINGS = {"mean": mean_pool, "cls": cls_pool}


class SentenceEncoder(torch.nn.Module):
    """Differentiable: the trainer calls `forward` with gradients, the service calls `encode` without. Both take
    the kind of text (`query`, the default, or `passage`), whose prefix `config` puts before each text."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int = 256,
        config: EncoderConfig | None = None,
    ):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.config = config or EncoderConfig()

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, max_length: int = 256, dtype: str = "float32", **overrides: str | bool
    ) -> SentenceEncoder:
        """`dtype`: float32, bfloat16, or auto (bf16 only where the CPU has it natively; services/common/hardware).
        `overrides`: query_prefix, passage_prefix, pooling, normalize over the folder's preset (`encoder_config`)."""
        config = encoder_config(folder, **overrides)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder), dtype=getattr(torch, resolve_dtype(dtype)))
        model.eval()
        return cls(model, tokenizer, max_length, config)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def prefixed(self, texts: Sequence[str], kind: TextKind) -> list[str]:
        prefix = self.config.prefix(kind)
        return [prefix + text for text in texts] if prefix else list(texts)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """The texts as given (no prefix): padded, truncated token ids."""
        return self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )

    def forward(self, texts: Sequence[str], kind: TextKind = "query") -> torch.Tensor:
        return self.embed(self.tokenize(self.prefixed(texts, kind)))

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, H) vectors of a tokenized, padded batch: pooled as configured, unit length unless not normalising."""
        device = self.model.device  # a trainer's GPU tower gets the tokenizer's CPU tensors
        batch = {k: v.to(device) for k, v in batch.items()}
        out = self.model(**batch)
        pooled = POOLINGS[self.config.pooling](out.last_hidden_state, batch["attention_mask"])  # (B, H)
        return torch.nn.functional.normalize(pooled, dim=-1) if self.config.normalize else pooled

    def encode(self, texts: Sequence[str], batch_size: int = 16, kind: TextKind = "query") -> np.ndarray:
        """(N, H) float32 vectors of queries or passages (`kind`). Tokenized once, sorted by token count and cut into
        forwards that each pad little (`padded_chunks`): a server's micro-batch mixes short and long queries, and
        one long query would otherwise pad every other to its length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tokens = self.tokenizer(self.prefixed(texts, kind), truncation=True, max_length=self.max_length)
        lengths = [len(ids) for ids in tokens["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for chunk in padded_chunks([lengths[i] for i in order], batch_size):
                rows = [order[i] for i in chunk]
                batch = self.tokenizer.pad({k: [v[i] for i in rows] for k, v in tokens.items()}, return_tensors="pt")
                out[rows] = self.embed(batch).float().cpu().numpy()
        return out

    def save_weights(self, path: Path) -> None:
        save_file({k: v.detach().contiguous() for k, v in self.model.state_dict().items()}, str(path))

    def load_weights(self, path: Path) -> None:
        """Load a safetensors state dict; refuses (ValueError) a file that is not safetensors, missing or unexpected
        keys and wrong shapes."""
        try:
            state = load_file(str(path))
        except SafetensorError as exc:  # a hashed file can still be anything: a 400 with the reason, not a 500
            raise ValueError(f"{path.name} is not a safetensors file: {exc}") from exc
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"weights do not match the encoder: missing {missing[:3]}, unexpected {unexpected[:3]}")
        for key, tensor in state.items():
            if tensor.shape != own[key].shape:
                raise ValueError(f"shape mismatch for {key}: {tuple(tensor.shape)} vs {tuple(own[key].shape)}")
        dtype = next(self.model.parameters()).dtype
        self.model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
        self.model.eval()


# What one more forward costs, in padded token rows: on 2 cores a forward of one short query takes ~5 ms and each
# further token row ~0.08 ms (bf16 and fp32 alike, services/modeling; measured for docs/performance.md).
FORWARD_COST_TOKENS = 48


def padded_chunks(
    sorted_lengths: Sequence[int], batch_size: int, forward_cost: int = FORWARD_COST_TOKENS
) -> Iterator[list[int]]:
    """Positions of ascending `sorted_lengths` cut into runs of at most `batch_size`; a run ends where taking the
    next item would add more padding to the run (its rows times the length step) than a forward of its own costs."""
    chunk: list[int] = []
    for position, length in enumerate(sorted_lengths):
        if chunk and (len(chunk) >= batch_size or len(chunk) * (length - sorted_lengths[chunk[-1]]) > forward_cost):
            yield chunk
            chunk = []
        chunk.append(position)
    if chunk:
        yield chunk
