"""Algorithm configuration: one place, a short doc per field, invariants checked at construction."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Algo = Literal["search-r1", "retriever-only", "alt-rp", "alt-pr", "joint", "bridge"]
Estimator = Literal["bridge", "two-state", "drop"]
FRESH_ALGOS = ("bridge", "alt-rp")
PAPER_GAMMA = 0.02  # the fixed penalty the paper measured its estimators at


class AlgoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algo: Algo = Field("bridge", description="Which update rule; all share one code path.")
    policy_rollouts: Literal["fresh", "reweighted"] = Field(
        "reweighted",
        description="How the policy step sees the adapted retriever: re-weight logged trajectories by the "
        "clipped ratio prod_t P_phi(D_t)/P_phi_old(D_t), or publish it, collect fresh rollouts and step the "
        "policy on those (bridge and alt-rp only: the algorithms whose retriever steps before the policy).",
    )
    estimator: Estimator = Field(
        "bridge",
        description="bridge only: the policy gradient at the penalised retriever state. bridge (the paper's): "
        "grad_theta f alone, no second retriever state; two-state: + lambda (grad_theta g(phi) - grad_theta g(z)) "
        "with z the lower-level proxy; drop: + lambda grad_theta g(phi), the value-function term dropped.",
    )
    group_size: int = Field(2, ge=2, le=16, description="G rollouts per question (GRPO needs >= 2).")
    # policy (upper level)
    policy_lr: float = Field(1e-4, gt=0, description="alpha: Adam step size for the LoRA parameters.")
    policy_steps: int = Field(1, ge=1, le=16, description="Optimizer steps on theta per round.")
    eps_low: float = Field(0.2, ge=0, le=1)
    eps_high: float = Field(0.2, ge=0, le=1)
    beta: float = Field(0.01, ge=0, description="KL weight to the frozen base (LoRA disabled).")
    lora_rank: int = Field(8, ge=1, le=64)
    lora_alpha: int = Field(16, ge=1)
    tis_cap: float = Field(
        2.0,
        ge=1,
        description="Truncated importance weight min(cap, pi_old / pi_behaviour) per generated token (and per "
        "sampled retrieval in the credit term): the engine's bf16 log-probs, or an older served version, against "
        "the trainer's own recomputation (verl's TIS).",
    )
    # optimisation (both levels; TRL's defaults where they apply)
    max_grad_norm: float = Field(1.0, ge=0, description="Clip each optimizer's gradient norm to this; 0: off.")
    lr_schedule: Literal["constant", "linear"] = Field(
        "linear", description="After warm-up: constant, or linear decay to 0 over the run's steps (TRL's default)."
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Share of the run's optimizer steps spent warming up.")
    # retriever (lower level)
    retriever_params: Literal["full", "lora"] = Field(
        "full", description="What the retriever trains: the whole query tower, or a query-side LoRA (the paper's eta)."
    )
    retriever_lora_rank: int = Field(8, ge=1, le=64)
    retriever_lora_alpha: int = Field(16, ge=1)
    retriever_lr: float = Field(2e-5, gt=0, description="eta: Adam step size for the query tower (or its LoRA).")
    retriever_steps: int = Field(4, ge=1, le=64, description="K: steps for z and for phi per round.")
    retriever_objective: Literal["both", "target", "credit"] = Field(
        "both",
        description="What phi descends: both (the paper's lower level, f_phi / lambda + g), the target g alone "
        "(Q_theta, LM-supervised, REPLUG-style) or the retrieval credit f_phi alone; for ablations.",
    )
    retrieval_clip: float = Field(
        0.2, gt=0, lt=1, description="epsilon of the retrieval credit's clipped ratio P_phi(D) / P_phi_old(D)."
    )
    mu: float = Field(0.1, ge=0, description="Weight of KL(p_deployed || p_phi): stay near the live retriever.")
    beta_q: float = Field(1.0, gt=0, description="Temperature of Q_theta(d) ∝ exp(log pi(y*|x,d) / beta_Q).")
    target_answer: Literal["golden", "rewarded"] = Field(
        "golden",
        description="y* of the target: the question's golden answer (the dataset's, or one that feedback gave); "
        "'rewarded': where there is none, the trajectory's own answer when its reward is > 0 (live traffic whose "
        "feedback carries a reward only).",
    )
    q_steps: int = Field(8, ge=1, le=256, description="Search steps per round that get a Q_theta target.")
    q_candidates: int = Field(5, ge=2, le=50, description="Candidates per step scored by the policy for Q.")
    q_doc_tokens: int = Field(128, ge=16, le=512, description="Document tokens kept in x + d + y* sequences.")
    q_prior: bool = Field(
        True,
        description="Q_theta as the posterior p_deployed(d) pi(y*|x,d)^(1/beta_Q) / Z (at beta_Q 1 its KL is the "
        "gradient of the paper's L_RAG, the RAG answer likelihood); false: the likelihood alone, "
        "pi(y*|x,d)^(1/beta_Q), which a weak policy's retriever unlearns from (docs/results.md, sections 3, 19).",
    )
    q_informative_only: bool = Field(
        False,
        description="Q_theta targets only for searches whose q_candidates differ in holding y* (some passages write "
        "a gold alias, some do not) and whose y* is not a yes/no label: where no candidate holds y* the reader's "
        "posterior is noise, and a label gives it almost nothing to rank (docs/results.md, section 23).",
    )
    # coupling
    gamma: float | None = Field(
        PAPER_GAMMA,
        gt=0,
        description="The paper's fixed penalty (0.02, the regime where its estimators were measured): phi minimises "
        "f + gamma g (our f / lambda + g), the correction has weight gamma; lambda = gamma every round. null: "
        "lambda follows the schedule below, which the bridge and drop estimators refuse (their fidelity to "
        "two-state was measured at a fixed gamma only; experiments/estimator_fidelity.py).",
    )
    lambda_init: float = Field(1.0, gt=0, description="lambda: penalty weight at round 0.")
    lambda_step: float = Field(0.5, ge=0, description="delta: lambda grows by this each round.")
    lambda_max: float = Field(10.0, gt=0)
    weight_clip: float = Field(2.0, ge=1, description="Upper clip of the re-weighting ratio.")
    seed: int = 0

    @model_validator(mode="after")
    def _checks(self) -> AlgoConfig:
        if self.lambda_init > self.lambda_max:
            raise ValueError("lambda_init must not exceed lambda_max")
        if self.gamma is None and self.algo == "bridge" and self.estimator != "two-state":
            raise ValueError(
                f"estimator {self.estimator!r} is measured only at a fixed gamma (the paper's 0.02): set gamma, or "
                "use estimator='two-state' for a lambda schedule"
            )
        if self.policy_rollouts == "fresh" and self.algo not in FRESH_ALGOS:
            raise ValueError(
                f"policy_rollouts='fresh' needs a retriever step before the policy step ({', '.join(FRESH_ALGOS)}); "
                f"{self.algo!r} has none"
            )
        return self

    @property
    def updates_policy(self) -> bool:
        return self.algo != "retriever-only"

    @property
    def updates_retriever(self) -> bool:
        return self.algo != "search-r1"

    @property
    def needs_q(self) -> bool:
        return self.updates_retriever and self.retriever_objective != "credit"

    @property
    def uses_z(self) -> bool:
        """Only the two-state estimator keeps the second retriever state z (the lower-level value proxy)."""
        return self.algo == "bridge" and self.estimator == "two-state"

    @property
    def initial_lambda(self) -> float:
        return self.gamma if self.gamma is not None else self.lambda_init

    def next_lambda(self, lam: float) -> float:
        if self.gamma is not None or self.algo != "bridge":
            return lam
        return min(lam + self.lambda_step, self.lambda_max)
