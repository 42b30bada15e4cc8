"""A sentence encoder (mean pooling + L2 norm, as all-MiniLM-L6-v2 is trained) over an HF encoder folder."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from services.common.hardware import resolve_dtype


def mean_pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)  # (B, T, 1)
    summed = (last_hidden * mask).sum(dim=1)  # (B, H)
    return summed / mask.sum(dim=1).clamp(min=1e-9)


class SentenceEncoder(torch.nn.Module):
    """Differentiable: the trainer calls `forward` with gradients, the service calls `encode` without."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, max_length: int = 256):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def from_pretrained(cls, folder: str | Path, max_length: int = 256, dtype: str = "float32") -> SentenceEncoder:
        """`dtype`: float32, bfloat16, or auto (bf16 only where the CPU has it natively; services/common/hardware)."""
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder), dtype=getattr(torch, resolve_dtype(dtype)))
        model.eval()
        return cls(model, tokenizer, max_length)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        batch = self.tokenize(texts)
        out = self.model(**batch)
        pooled = mean_pool(out.last_hidden_state, batch["attention_mask"])  # (B, H)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def encode(self, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """(N, H) float32 unit vectors. Texts are length-sorted so each batch pads to similar lengths."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for chunk in _chunks(order, batch_size):
                out[chunk] = self.forward([texts[i] for i in chunk]).float().numpy()
        return out

    def save_weights(self, path: Path) -> None:
        save_file({k: v.detach().contiguous() for k, v in self.model.state_dict().items()}, str(path))

    def load_weights(self, path: Path) -> None:
        """Load a safetensors state dict; refuses missing or unexpected keys and wrong shapes."""
        state = load_file(str(path))
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


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
