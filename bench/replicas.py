"""Replicas on one machine (issue 42 section 3): searches/s through HAProxy with 1, 2 and 3 retriever replicas,
agent questions/s with 1 and 2 vLLM engines, and how long a swap takes to reach every copy.

Retriever: three replicas in one replica group (each its own embedded index; the demo corpus, 800 passages,
ingested once through the balancer, so the document log fills every index), and four HAProxy front ends: over
replica 0 alone, over 0-1, over 0-2. Each is driven by `--clients` concurrent clients for `--seconds` (the same
queries); the baseline is replica 0 reached directly (no balancer), in the same run. Then a query-tower checkpoint
is activated and rolled back through the 3-replica front end: the seconds until every replica has committed.

Policy: one policy service with 1 engine, then one with 2 (`BRIDGE_POLICY_VLLM_ENGINES`), each answering the same
`--questions` demo questions at concurrency 16 with no search (`max_turns` 0: the engines' work, not the
retriever's); then the 2-engine service activates a trained checkpoint (merged weights reloaded in both engines):
the seconds it takes.

On a 2-core machine more copies cannot add compute: expect ratios at or below 1; what they show is the overhead
of the balancer and of splitting the cores.

    python -m bench.replicas [--seconds 20] [--clients 16] [--questions 48] [--no-policy] [--repeat 1]
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from bench.agent import publish_trained, run_service
from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import DEMO_DATA, prepare_models, script_parser
from services.cli.balancer import Balancer
from services.cli.ingest import ingest_file
from services.common.clients.retriever import RetrieverClient
from tests.conftest import free_port, policy_env, start_service, stop_service

QUERIES = [json.loads(line)["question"] for line in (DEMO_DATA / "hotpotqa_train.jsonl").open()]
REDIS = "redis://127.0.0.1:6379/0"


def searches_per_s(url: str, clients: int, seconds: float) -> float:
    """`clients` threads each searching one query at a time (top 5 of 20) for `seconds`: answered searches/s."""
    done = [0] * clients
    failed: list[str] = []
    stop = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            k = n
            while not stop.is_set():
                body = {"queries": [QUERIES[k % len(QUERIES)]], "top_k": 5, "candidates": 20}
                response = http.post("/v1/search", json=body)
                if response.status_code == 200:
                    done[n] += 1
                else:
                    failed.append(response.text[:200])
                k += clients

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if failed:
        raise RuntimeError(f"{len(failed)} searches failed, e.g. {failed[0]}")
    return sum(done) / (time.perf_counter() - started)


def write_query_checkpoint(root: Path, encoder_dir: Path, version: str) -> str:
    """A perturbed copy of the base query tower, published the way the trainer publishes one."""
    import torch

    from services.common.checkpoints import publish_checkpoint, staging_dir
    from services.modeling.encoder import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(encoder_dir)
    with torch.no_grad():
        for param in encoder.model.parameters():
            param.add_(torch.randn_like(param) * 0.05 * param.std().clamp(min=1e-3))
    staging = staging_dir(root, version)
    encoder.save_weights(staging / "query_encoder.safetensors")
    publish_checkpoint(staging, root / version, kind="retriever-query", version=version, parent="base")
    return version


class Retrievers:
    def __init__(self, encoder_dir: Path, tmp: Path) -> None:
        self.group = f"bench-{uuid.uuid4().hex[:8]}"
        self.checkpoints = tmp / "checkpoints"
        self.checkpoints.mkdir(parents=True)
        self.encoder_dir = encoder_dir
        ports = [free_port() for _ in range(3)]
        self.replicas = []
        for n, port in enumerate(ports):
            env = {"BRIDGE_RETRIEVER_ENCODER_DIR": str(encoder_dir), "REDIS_URL": REDIS,
                   "BRIDGE_RETRIEVER_REPLICA_GROUP": self.group, "BRIDGE_RETRIEVER_REPLICA_ID": f"r{n}",
                   "BRIDGE_CHECKPOINT_DIR": str(self.checkpoints)}  # fmt: skip
            self.replicas.append(start_service("retriever", tmp / f"r{n}", env, port=port))
        self.fronts = {k: Balancer(free_port(), [("127.0.0.1", p) for p in ports[:k]], tmp / f"haproxy-{k}")
                       for k in (1, 2, 3)}  # fmt: skip
        for balancer in self.fronts.values():
            balancer.wait_ready()
        with RetrieverClient(self.fronts[3].url, admin_token=self.replicas[0].token, timeout=900) as client:
            ingest_file(client, DEMO_DATA / "hotpotqa_corpus.jsonl", progress=False)
        self.admin = {"Authorization": f"Bearer {self.replicas[0].token}"}

    def swap_s(self, version: str) -> float:
        url = self.fronts[3].url
        started = time.perf_counter()
        response = httpx.post(f"{url}/v1/checkpoints/{version}/activate", headers=self.admin, timeout=300)
        elapsed = time.perf_counter() - started
        if response.status_code != 200 or set(response.json()["replicas"].values()) != {"committed"}:
            raise RuntimeError(f"swap to {version}: {response.status_code} {response.text[:300]}")
        return elapsed

    def close(self) -> None:
        for balancer in self.fronts.values():
            balancer.stop()
        for replica in self.replicas:
            stop_service(replica)
        import redis

        client = redis.Redis.from_url(REDIS)
        for key in client.scan_iter(f"bridge:replicas:{self.group}:*"):
            client.delete(key)


def measure_retrievers(r: Retrievers, args, index: int) -> Ratios:
    searches_per_s(r.replicas[0].url, args.clients, 2)  # warm-up
    direct = searches_per_s(r.replicas[0].url, args.clients, args.seconds)
    rows = {k: searches_per_s(r.fronts[k].url, args.clients, args.seconds) for k in (1, 2, 3)}
    print(f"searches/s at {args.clients} clients: replica 0 direct {direct:.1f}; through HAProxy: "
          + ", ".join(f"{k} replica{'s' if k > 1 else ''} {v:.1f}" for k, v in rows.items()), flush=True)  # fmt: skip
    version = f"q-bench-{index}"
    write_query_checkpoint(r.checkpoints, r.encoder_dir, version)
    registered = httpx.post(r.fronts[3].url + "/v1/checkpoints", json={"path": version}, headers=r.admin, timeout=300)
    registered.raise_for_status()
    swap, back = r.swap_s(version), r.swap_s("base")
    print(f"retriever swap to every replica (3): {swap:.2f} s; rollback {back:.2f} s", flush=True)
    return {
        "searches_s/haproxy_1_over_direct": rows[1] / direct,
        "searches_s/replicas_2_over_1": rows[2] / rows[1],
        "searches_s/replicas_3_over_1": rows[3] / rows[1],
        "retriever_swap_3_replicas_s": swap,
        "retriever_rollback_3_replicas_s": back,
    }


def questions_per_s(url: str, questions: list[str]) -> float:
    return asyncio.run(run_service(url, questions, 16, 0))["qps"]


def measure_policy(models, retriever_url: str, args, tmp: Path) -> Ratios:
    questions = QUERIES[: args.questions]
    rates, swap = {}, 0.0
    for engines in (1, 2):
        env = policy_env(models.root, retriever_url, BRIDGE_POLICY_MAX_NEW_TOKENS="32",
                         BRIDGE_POLICY_VLLM_ENGINES=str(engines), BRIDGE_POLICY_ADAPTER_SERVING="merged")  # fmt: skip
        policy = start_service("policy", tmp / f"policy-{engines}", env, timeout=900)
        try:
            questions_per_s(policy.url, questions[:4])  # warm-up
            rates[engines] = questions_per_s(policy.url, questions)
            if engines == 2:
                trained = publish_trained(Path(policy.data_dir))
                admin = {"Authorization": f"Bearer {policy.token}"}
                httpx.post(policy.url + "/v1/checkpoints", json={"path": trained}, headers=admin,
                           timeout=300).raise_for_status()  # fmt: skip
                started = time.perf_counter()
                httpx.post(f"{policy.url}/v1/checkpoints/{trained}/activate", headers=admin,
                           timeout=300).raise_for_status()  # fmt: skip
                # merged weights reload when a request needs them: the first request at the new version pays it
                questions_per_s(policy.url, questions[:1])
                swap = time.perf_counter() - started
        finally:
            stop_service(policy)
    print(f"agent questions/s (concurrency 16, no search): 1 engine {rates[1]:.2f}, 2 engines {rates[2]:.2f}; "
          f"activate + first answer on 2 engines {swap:.1f} s", flush=True)  # fmt: skip
    return {"questions_s/engines_2_over_1": rates[2] / rates[1], "policy_swap_2_engines_s": swap}


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=20, help="Seconds each searches/s row runs.")
    parser.add_argument("--clients", type=int, default=16, help="Concurrent search clients.")
    parser.add_argument("--questions", type=int, default=48, help="Agent questions per row.")
    parser.add_argument("--no-policy", action="store_true", help="Only the retriever rows.")
    add_repeat_arguments(parser, "replicas", cost="One repetition is ~4 min on 2 cores after ~3 min of start-up.")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = prepare_models(args.work)
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    retrievers = Retrievers(models.retriever, tmp)
    try:

        def measure(index: int) -> Ratios:
            ratios = measure_retrievers(retrievers, args, index)
            if not args.no_policy:
                ratios |= measure_policy(models, retrievers.fronts[3].url, args, tmp / f"repeat-{index}")
            return ratios

        runs = repeat(measure, args.repeat)
    finally:
        retrievers.close()
    context = {"seconds": args.seconds, "clients": args.clients, "questions": args.questions}
    finish("replicas", args, runs, started, context=context, argv=argv)


if __name__ == "__main__":
    main()
