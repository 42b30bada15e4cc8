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
        return self.embed(self.tokenize(texts))

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, H) unit vectors of a tokenized, padded batch."""
        out = self.model(**batch)
        pooled = mean_pool(out.last_hidden_state, batch["attention_mask"])  # (B, H)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def encode(self, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """(N, H) float32 unit vectors. Tokenized once, sorted by token count and cut into forwards that each pad
        little (`padded_chunks`): a server's micro-batch mixes short and long queries, and one long query would
        otherwise pad every other to its length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tokens = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        lengths = [len(ids) for ids in tokens["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for chunk in padded_chunks([lengths[i] for i in order], batch_size):
                rows = [order[i] for i in chunk]
                batch = self.tokenizer.pad({k: [v[i] for i in rows] for k, v in tokens.items()}, return_tensors="pt")
                out[rows] = self.embed(batch).float().numpy()
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
