"""Load with live swaps: N concurrent agent clients for S seconds while a retriever and a policy checkpoint are
registered and activated under them. Prints total requests, failures (must be 0), p50/p95/p99 latency, and which
(policy, retriever) versions served before, between and after the swaps.

By default it starts a retriever (the demo corpus) and the policy service (vLLM, or --engine transformers) the way
`bench.agent` does, with a checkpoint root they share; or point it at running services:

    python -m bench.load [--seconds 120] [--clients 64] [--engine vllm|transformers]
    python -m bench.load --policy-url http://127.0.0.1:8000 --retriever-url http://127.0.0.1:8001 \\
        --checkpoint-dir ~/.bridge/checkpoints --token "$(cat ~/.bridge/admin_token)"

The two checkpoints are written before the load starts (a perturbed copy of the base query tower, and a random
LoRA adapter, as the trainer would write them: staging folder, sha256 manifest, rename); hashing, loading and
activating them happens under the load, retriever at 25% of the run and policy at 50%.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.script import DEMO_DATA, prepare_models, script_parser
from services.cli.ingest import ingest_file
from services.common.checkpoints import publish_checkpoint, staging_dir
from services.common.clients.retriever import RetrieverClient
from services.common.stats import percentile
from tests.conftest import policy_env, start_service, stop_service


@dataclass
class Sample:
    started: float
    latency: float
    ok: bool
    policy_version: str | None = None
    retriever_version: str | None = None
    error: str | None = None


def write_retriever_checkpoint(root: Path, model_dir: Path, version: str, parent: str) -> None:
    import torch

    from services.modeling.encoder import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # small noise: a different, still sensible query tower
        for param in encoder.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05 * param.std().clamp(min=1e-3))
    staging = staging_dir(root, version)
    encoder.save_weights(staging / "query_encoder.safetensors")
    publish_checkpoint(staging, root / version, kind="retriever-query", version=version, parent=parent)


def write_policy_checkpoint(root: Path, model_dir: Path, version: str, parent: str) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)  # random A and B: a policy that really differs from the base
    staging = staging_dir(root, version)
    peft_model.save_pretrained(str(staging))
    (staging / "README.md").unlink(missing_ok=True)
    publish_checkpoint(staging, root / version, kind="policy-lora", version=version, parent=parent)


async def client_loop(http: httpx.AsyncClient, questions: list[str], worker: int, deadline: float,
                      max_turns: int, samples: list[Sample]) -> None:  # fmt: skip
    i = worker
    while time.monotonic() < deadline:
        started = time.monotonic()
        body = {"question": questions[i % len(questions)], "max_turns": max_turns}
        try:
            response = await http.post("/v1/agent/query", json=body)
        except httpx.HTTPError as exc:
            samples.append(Sample(started, time.monotonic() - started, False, error=repr(exc)))
        else:
            latency = time.monotonic() - started
            if response.status_code == 200:
                data = response.json()
                samples.append(Sample(started, latency, True, data["policy_version"], data["retriever_version"]))
            else:
                samples.append(Sample(started, latency, False, error=f"{response.status_code} {response.text[:200]}"))
        i += 1


async def swap(url: str, token: str, version: str, at: float, log: dict) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        log["register_started"] = time.monotonic()
        registered = await http.post("/v1/checkpoints", json={"path": version})
        registered.raise_for_status()
        activated = await http.post(f"/v1/checkpoints/{version}/activate")
        activated.raise_for_status()
        log["activated"] = time.monotonic()
        log["status"] = activated.json()["status"]
        log["version"] = version


async def run_load(args, policy_url: str, retriever_url: str, token: str, versions: tuple[str, str]) -> None:
    questions = [json.loads(line)["question"] for line in (DEMO_DATA / "hotpotqa_train.jsonl").open()]
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    headers = {"X-API-Key": args.api_key} if args.api_key else {}
    samples: list[Sample] = []
    retriever_version, policy_version = versions
    start = time.monotonic()
    deadline = start + args.seconds
    swaps = {"retriever": {}, "policy": {}}
    async with httpx.AsyncClient(base_url=policy_url, timeout=900, limits=limits, headers=headers) as http:
        await asyncio.gather(
            *(client_loop(http, questions, w, deadline, args.max_turns, samples) for w in range(args.clients)),
            swap(retriever_url, token, retriever_version, start + 0.25 * args.seconds, swaps["retriever"]),
            swap(policy_url, token, policy_version, start + 0.5 * args.seconds, swaps["policy"]),
        )
    elapsed = time.monotonic() - start
    report(args, samples, swaps, start, elapsed)


def report(args, samples: list[Sample], swaps: dict, start: float, elapsed: float) -> None:
    ok = [s for s in samples if s.ok]
    failed = [s for s in samples if not s.ok]
    latencies = [s.latency for s in ok]
    r_at, p_at = swaps["retriever"]["activated"], swaps["policy"]["activated"]

    def phase(s: Sample) -> str:  # by when the request was sent, relative to the activations
        if s.started + s.latency < r_at:
            return "1 finished before the retriever swap"
        if s.started > p_at:
            return "3 sent after the policy swap"
        return "2 overlapping the swaps"

    print(f"\n{args.clients} clients, {elapsed:.0f} s, max_turns {args.max_turns}, engine {args.engine}")
    print(f"requests: {len(samples)}  ok: {len(ok)}  failed: {len(failed)}  ({len(ok) / elapsed:.2f} req/s)")
    if latencies:
        p50, p95, p99 = (percentile(latencies, q) for q in (0.5, 0.95, 0.99))
        print(f"latency s: p50 {p50:.2f}  p95 {p95:.2f}  p99 {p99:.2f}  max {max(latencies):.2f}")
    for kind in ("retriever", "policy"):
        log = swaps[kind]
        print(f"{kind} swap: register+activate took {log['activated'] - log['register_started']:.1f} s "
              f"(activated at t={log['activated'] - start:.0f} s, status {log['status']})")  # fmt: skip
    by_phase: dict[str, Counter] = {}
    for s in ok:
        by_phase.setdefault(phase(s), Counter())[(s.policy_version, s.retriever_version)] += 1
    for name in sorted(by_phase):
        served = ", ".join(f"policy {p} / retriever {r}: {n}" for (p, r), n in by_phase[name].most_common())
        print(f"  {name[2:]}: {served}")
    for s in failed[:10]:
        print("  FAILED:", s.error)
    first = set(by_phase.get("1 finished before the retriever swap", {}))
    last = set(by_phase.get("3 sent after the policy swap", {}))
    new = (swaps["policy"]["version"], swaps["retriever"]["version"])
    if failed or new not in last or len(last) != 1 or new in first:
        print("NOT OK: failed requests, or versions not as swapped")
        sys.exit(1)
    print("OK: zero failures; every request sent after the swaps was served by the new versions")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per turn (services started here)")
    parser.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
    parser.add_argument("--policy-url")
    parser.add_argument("--retriever-url")
    parser.add_argument("--checkpoint-dir", type=Path, help="the services' checkpoint root (with the URLs)")
    parser.add_argument("--token", help="admin token (with the URLs)")
    parser.add_argument("--api-key", help="X-API-Key for the agent endpoint, if the policy has keys on")
    args = parser.parse_args()

    models = prepare_models(args.work)
    tag = uuid.uuid4().hex[:6]
    versions = (f"load-{tag}-retriever", f"load-{tag}-policy")
    started: list = []
    try:
        if args.policy_url:
            assert args.retriever_url and args.checkpoint_dir and args.token, "with --policy-url give them all"
            policy_url, retriever_url, token = args.policy_url, args.retriever_url, args.token
            root = args.checkpoint_dir
        else:
            tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
            root = tmp / "checkpoints"
            shared = {"BRIDGE_CHECKPOINT_DIR": str(root)}
            encoder = {"BRIDGE_RETRIEVER_ENCODER_DIR": str(models.retriever), **shared}
            retriever = start_service("retriever", tmp / "retriever", encoder)
            started.append(retriever)
            with RetrieverClient(retriever.url, admin_token=retriever.token, timeout=600) as client:
                ingest_file(client, DEMO_DATA / "hotpotqa_corpus.jsonl", progress=False)
            env = policy_env(models.root, retriever.url, BRIDGE_POLICY_MAX_NEW_TOKENS=str(args.max_tokens),
                             BRIDGE_POLICY_ENGINE=args.engine, **shared)  # fmt: skip
            policy = start_service("policy", tmp / "policy", env, timeout=900)
            started.append(policy)
            policy_url, retriever_url, token = policy.url, retriever.url, policy.token
        with httpx.Client(timeout=30) as http:
            parents = (http.get(retriever_url + "/v1/checkpoints").json()["active"],
                       http.get(policy_url + "/v1/checkpoints").json()["active"])  # fmt: skip
        write_retriever_checkpoint(root, models.retriever, versions[0], parents[0])
        write_policy_checkpoint(root, models.policy, versions[1], parents[1])
        print(f"serving before: policy {parents[1]}, retriever {parents[0]}; swapping in {versions[1]}, {versions[0]}")
        asyncio.run(run_load(args, policy_url, retriever_url, token, versions))
    finally:
        for service in reversed(started):
            stop_service(service)


if __name__ == "__main__":
    main()
