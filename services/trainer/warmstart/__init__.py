"""`bridge-rl warmstart`: a cold-start SFT of the policy on Search-R1-format trajectories.

Small policies (SmolLM2-135M) never emit `<search>` or close an `<answer>` on their own, so every GRPO
advantage is zero. As DGPO and Tool-Star do, we first fine-tune on search-format trajectories:

1. questions from the training pool (every question after the first `EVAL_SPLIT` of each dataset file; the
   first ones are the evaluation split and are refused here);
2. each `<search>` is answered by the REAL retriever (the retriever service's own code, in-process, over the
   shared corpus), so the `<information>` blocks are byte-for-byte what serving shows;
3. targets are the agent's own turns: `<think> … </think>` + `<search> query </search>` (the question; for a
   multi-hop question whose supporting passages the first search missed, a second search by the missing
   passage's title when that reaches it) and `<think> … </think>` + `<answer> gold </answer>` (the gold alias
   the shown passages contain, when one does);
4. the loss covers exactly the tokens `TrajectoryRecord.generated_mask` marks (the agent's turns; never the
   prompt or the retrieved observations), as in RL;
5. a LoRA on every linear layer, bf16 autocast where the CPU has native bf16 (else fp32), seeded, with a held-out
   loss; the adapter is written as
   safetensors + `manifest.json` (sha256 of each file, the command, the data split, the loss curve).
"""
