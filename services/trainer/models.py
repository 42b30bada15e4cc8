"""The two learnable parts as the trainer holds them: a LoRA policy over the frozen base (which doubles as
the KL reference) and the retriever's query tower over a frozen document tower.

The encoder class is the retriever service's own, so a checkpoint written here loads there unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.modeling.encoder import SentenceEncoder
from services.trainer.device import Placement

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class PolicyModel:
    def __init__(
        self, base_dir: Path, adapter_dir: Path | None, rank: int, alpha: int, seed: int = 0,
        dtype: torch.dtype = torch.float32, placement: Placement | None = None,
    ) -> None:  # fmt: skip
        """`seed`: a new adapter's A matrices are drawn from it, whatever the global RNG has done before.
        `dtype`: float32 to train; a frozen policy that only scores or generates may run in bfloat16.
        `placement`: the device the weights live on and the autocast of forward passes (default: CPU, float32)."""
        self.placement = placement or Placement.cpu()
        self.tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype)
        if adapter_dir is not None:
            self.model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
        else:
            config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=LORA_TARGETS, lora_dropout=0.0)
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self.model = get_peft_model(base, config)  # B = 0: starts exactly at the base policy
        # No dropout anywhere (LoRA dropout is 0 too): the log-probs a gradient step differentiates are the
        # ones every ratio and Q_theta evaluation divides by.
        self.model.to(self.placement.device)
        self.model.eval()

    @property
    def device(self) -> torch.device:
        return self.placement.device

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def token_logps(
        self, token_ids: Sequence[int], start: int, *, reference: bool = False, temperature: float = 1.0
    ) -> torch.Tensor:
        """log pi(token_t | tokens_<t) for t in [start, T); (T - start,). Gradients flow unless `reference`.

        `temperature`: the policy that sampled is softmax(logits / T) (as verl divides logits by the rollout
        temperature); greedy decoding (T = 0) is scored at T = 1."""
        input_ids = torch.tensor([list(token_ids)], device=self.device)
        keep = len(token_ids) - start + 1
        if reference:
            with torch.no_grad(), self.model.disable_adapter(), self.placement.forward():
                logits = self.model(input_ids=input_ids, logits_to_keep=keep).logits
        else:
            with self.placement.forward():
                logits = self.model(input_ids=input_ids, logits_to_keep=keep).logits
        logits = logits[0, :-1].float()  # (T - start, V): position p predicts token p + 1
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        targets = input_ids[0, start:]
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]

    def answer_logprob(self, context_ids: list[int], answer_ids: list[int]) -> torch.Tensor:
        """sum log pi(y* | context), differentiable; used for Q_theta."""
        logps = self.token_logps(context_ids + answer_ids, len(context_ids))
        return logps.sum()

    def answer_logprobs(self, contexts: Sequence[Sequence[int]], answer_ids: Sequence[int]) -> torch.Tensor:
        """sum_t log pi(y*_t | context_i, y*_<t) for every context at once: one LEFT-padded forward (position ids
        from the mask, so padding changes nothing), so the answers line up at the end and only their logits are
        computed (a full-vocabulary log-softmax over every position was most of Q_theta's memory); (M,),
        differentiable. Same numbers as `answer_logprob` per context."""
        n_answer = len(answer_ids)
        width = max(len(c) for c in contexts) + n_answer
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)  # (M, L)
        attention_mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, context in enumerate(contexts):
            row = list(context) + list(answer_ids)
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention_mask[i, width - len(row) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        with self.placement.forward():
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                logits_to_keep=n_answer + 1).logits[:, :-1].float()  # (M, n_answer, V)  # fmt: skip
        targets = input_ids[:, width - n_answer :]  # (M, n_answer)
        return torch.log_softmax(logits, dim=-1).gather(2, targets[..., None])[..., 0].sum(-1)

    def save_adapter(self, folder: Path) -> None:
        self.model.save_pretrained(str(folder))
        (folder / "README.md").unlink(missing_ok=True)  # checkpoints hold safetensors + config only


RETRIEVER_LORA_TARGETS = ["query", "value"]
RETRIEVER_LORA_FILE = "query_lora.safetensors"


class RetrieverModel:
    """`params="full"` trains the whole query tower; `"lora"` a query-side LoRA over it (the paper's eta), whose
    adapter (`RETRIEVER_LORA_FILE`) continues from round to round while the service gets the merged tower.

    The towers stay in eval mode: dropout would make every no-grad evaluation (ratios, coupling) noisy and the
    ratio at no change differ from 1."""

    def __init__(
        self,
        base_dir: Path,
        query_weights: Path | None,
        max_length: int = 256,
        *,
        params: str = "full",
        lora_rank: int = 8,
        lora_alpha: int = 16,
        seed: int = 0,
        encoder_overrides: dict[str, str | bool] | None = None,
        placement: Placement | None = None,
    ) -> None:
        """`encoder_overrides`: the BRIDGE_ENCODER_* settings (`settings.encoder_overrides`), as the service has
        them, for both towers. `placement`: as the policy's (default: CPU, float32)."""
        self.params = params
        self.placement = placement or Placement.cpu()
        overrides = encoder_overrides or {}
        self.query = SentenceEncoder.from_pretrained(base_dir, max_length=max_length, dtype="float32", **overrides)
        lora_file = query_weights.with_name(RETRIEVER_LORA_FILE) if query_weights is not None else None
        if params == "lora":
            config = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=RETRIEVER_LORA_TARGETS,
                                lora_dropout=0.0)  # fmt: skip
            if query_weights is not None and not lora_file.exists():
                self.query.load_weights(query_weights)  # a full-tower checkpoint: the LoRA starts on top of it
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self.query.model = get_peft_model(self.query.model, config)
            if lora_file is not None and lora_file.exists():
                from peft import set_peft_model_state_dict
                from safetensors.torch import load_file

                set_peft_model_state_dict(self.query.model, load_file(str(lora_file)))
        elif query_weights is not None:
            self.query.load_weights(query_weights)
        self.query.model.eval()
        self.docs = SentenceEncoder.from_pretrained(base_dir, max_length=max_length, dtype="float32", **overrides)
        self.query.to(self.placement.device)
        self.docs.to(self.placement.device)
        self._doc_vectors: dict[str, torch.Tensor] = {}

    def copy_query(self) -> SentenceEncoder:
        return copy.deepcopy(self.query)

    @staticmethod
    def trainable(encoder: SentenceEncoder) -> list[torch.nn.Parameter]:
        return [p for p in encoder.parameters() if p.requires_grad]

    def save_query(self, folder: Path, filename: str) -> list[Path]:
        """The query tower as the service loads it (LoRA merged in), plus the adapter itself in LoRA mode."""
        from safetensors.torch import save_file

        if self.params != "lora":
            return [self.save_trained(folder, filename)]
        merged = copy.deepcopy(self.query.model).merge_and_unload()
        save_file({k: v.detach().contiguous() for k, v in merged.state_dict().items()}, str(folder / filename))
        return [folder / filename, self.save_trained(folder, filename)]

    def save_trained(self, folder: Path, filename: str) -> Path:
        """What trains, to resume from (`RetrieverModel(base, folder / filename, params=...)` loads it): in LoRA mode
        the adapter alone (`RETRIEVER_LORA_FILE`, under 1 MB, not the 88 MB merged tower `save_query` adds)."""
        from safetensors.torch import save_file

        if self.params != "lora":
            self.query.save_weights(folder / filename)
            return folder / filename
        from peft import get_peft_model_state_dict

        adapter = {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(self.query.model).items()}
        save_file(adapter, str(folder / RETRIEVER_LORA_FILE))
        return folder / RETRIEVER_LORA_FILE

    def use_doc_vectors(self, ids: Sequence[str], vectors: torch.Tensor) -> None:
        """Score against these e_d (N, H) for `ids` (the index's own vectors, as served) instead of encoding."""
        self._doc_vectors.update(zip(ids, vectors.to(self.placement.device), strict=True))

    def doc_vectors(self, ids: list[str], texts: dict[str, str]) -> torch.Tensor:
        """Frozen e_d for the given ids; (M, H). Cached across steps of a round."""
        missing = [i for i in ids if i not in self._doc_vectors]
        if missing:
            vectors = self.docs.encode([texts[i] for i in missing], kind="passage")
            for i, v in zip(missing, vectors, strict=True):
                self._doc_vectors[i] = torch.from_numpy(v).to(self.placement.device)
        return torch.stack([self._doc_vectors[i] for i in ids])
