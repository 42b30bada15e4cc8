"""Retriever throughput and latency against a Search-R1-style baseline, side by side in one run.

Both servers use the same encoder (same dtype) and the same document vectors: the whole shared corpus
(every file in ../shared/data/corpus, ~33k passages). The bench embeds the corpus once (cached under
.cache/bench), loads the vectors into our Qdrant index and into the baseline's numpy matrix, starts both
servers as subprocesses, and drives each with the same concurrent clients at batch 1 and batch 32.

It prints queries/s, p50/p99 request latency, recall@10 against exact search, and recall@10 of hotpotqa
supporting documents for both, the throughput ratios (target: >= 2.0x at batch 1 with 8 clients, at recall@10
vs exact >= 0.99), and the physical floor: the queries/s of the encoder's forward alone, in this process, on the
same queries in batches of one and of `--concurrency` (what a micro-batching server can at best gather).

    python -m bench.retriever [--queries 512] [--concurrency 8] [--repeat 3] [--profile ours.txt]

`--profile FILE` runs our server under py-spy (`pip install -e ".[profile]"`) and writes its samples there in
py-spy's raw format, for `python -m tools.profile_top FILE` (idle waits are not sampled: the profile is where its
CPU went while it served, at batch 1 and 32).

The servers start once; the throughput table, the ratios and the floor are measured `--repeat` times (default 3),
then every ratio's median and spread is printed with the CPU and written to `--json`
(docs/results/bench/retriever.json, which `python -m tools.perf_table --write` puts in docs/performance.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from bench.raw_http import RawConnection
from bench.repeat import Ratios, add_repeat_arguments, finish, repeat
from bench.script import REPO, SHARED_DATA, prepare_models, script_parser
from services.common.hardware import resolve_dtype
from services.common.stats import percentile
from services.modeling.encoder import SentenceEncoder, encoder_config
from services.retriever.backends.index import EdgeIndex
from services.retriever.registry import collection_for
from services.retriever.reindex import passage_text
from tests.conftest import free_port

DTYPE = resolve_dtype("auto")  # bf16 where the CPU has it natively; emulated bf16 is ~85x slower


def load_corpus(data: Path) -> list[dict]:
    docs: dict[str, dict] = {}
    for path in sorted((data / "corpus").glob("*.jsonl")):
        for line in path.open():
            row = json.loads(line)
            docs[row["id"]] = {"doc_id": row["id"], "title": row.get("title") or "", "text": row["text"]}
    return list(docs.values())


def embed_corpus(docs: list[dict], encoder_dir: Path, cache: Path) -> np.ndarray:
    # The passage side of the encoder (its passage prefix, e5's "passage: "), which is part of the cache key.
    prefix = encoder_config(encoder_dir).passage_prefix
    key = hashlib.sha256((prefix + "".join(d["doc_id"] + d["text"] for d in docs)).encode()).hexdigest()[:16]
    path = cache / f"corpus-{key}-{DTYPE}.npy"
    if path.exists():
        return np.load(path)
    from tqdm import tqdm

    encoder = SentenceEncoder.from_pretrained(encoder_dir, dtype=DTYPE)
    texts = [passage_text(d["title"], d["text"]) for d in docs]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    for start in tqdm(range(0, len(order), 512), desc="embed corpus (once, cached)"):
        chunk = order[start : start + 512]
        out[chunk] = encoder.encode([texts[i] for i in chunk], kind="passage")
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, out)
    return out


def build_our_index(data_dir: Path, docs: list[dict], vectors: np.ndarray) -> None:
    index = EdgeIndex(data_dir / "retriever" / "qdrant-edge")
    collection = collection_for("base")
    index.create_collection(collection, vectors.shape[1])
    for start in range(0, len(docs), 2048):
        index.upsert(collection, vectors[start : start + 2048], docs[start : start + 2048])
    index.optimize(collection)
    index.close()


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(url)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (the server under py-spy is py-spy's child)."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        times = p.cpu_times()
        total += times.user + times.system
    return total


async def drive(url: str, path: str, body_for, batches: list[list[str]], concurrency: int, *,
                client: str = "raw", server_pid: int | None = None) -> dict:  # fmt: skip
    """`concurrency` clients send `batches` (each a request) as fast as answers come back; queries/s, latency, and
    where the CPU went meanwhile: the clients' (this process) and the server's, in ms a query."""
    latencies: list[float] = []
    queue: asyncio.Queue = asyncio.Queue()

    if client == "raw":  # bodies serialized before the clock starts, one keep-alive connection a client
        probe = RawConnection(url)
        for batch in batches:
            queue.put_nowait(probe.request_bytes(path, json.dumps(body_for(batch)).encode()))

        async def worker() -> None:
            async with RawConnection(url) as connection:
                while not queue.empty():
                    request = queue.get_nowait()
                    started = time.perf_counter()
                    await connection.send(request)
                    latencies.append(time.perf_counter() - started)

        async with RawConnection(url) as connection:  # warm-up
            await connection.send(probe.request_bytes(path, json.dumps(body_for(batches[0])).encode()))
    else:
        for batch in batches:
            queue.put_nowait(batch)
        http = httpx.AsyncClient(base_url=url, timeout=120)

        async def worker() -> None:
            while not queue.empty():
                batch = queue.get_nowait()
                started = time.perf_counter()
                response = await http.post(path, json=body_for(batch))
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)

        await http.post(path, json=body_for(batches[0]))  # warm-up
    server_before = cpu_seconds(server_pid) if server_pid else 0.0
    client_before, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - client_before
    server_cpu = cpu_seconds(server_pid) - server_before if server_pid else float("nan")
    if client != "raw":
        await http.aclose()
    queries = sum(len(b) for b in batches)
    return {
        "qps": queries / elapsed,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "client_cpu_ms_per_query": 1000 * client_cpu / queries,
        "server_cpu_ms_per_query": 1000 * server_cpu / queries,
        "cpu_busy_share": (client_cpu + server_cpu) / (elapsed * (os.cpu_count() or 1)),
    }


def top10(url: str, path: str, body_for, parse, queries: list[str]) -> list[list[str]]:
    out = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for start in range(0, len(queries), 32):
            out.extend(parse(client.post(path, json=body_for(queries[start : start + 32], 10)).json()))
    return out


def micro_batches(url: str) -> tuple[float, float]:
    """(queries, micro-batches) so far, from the server's `bridge_retriever_batch_queries` histogram."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "bridge_retriever_batch_queries":
            values = {sample.name: sample.value for sample in family.samples}
            return values["bridge_retriever_batch_queries_sum"], values["bridge_retriever_batch_queries_count"]
    raise RuntimeError(f"{url}/metrics has no bridge_retriever_batch_queries")


def encoder_floor(encoder: SentenceEncoder, queries: list[str], batch_size: int, reps: int = 30) -> dict:
    """The encoder's forward alone over `reps` batches of `batch_size` (the server's floor): queries/s, and the CPU
    ms it spends a query (every core it used)."""
    batches = [queries[(i * batch_size) % len(queries) :][:batch_size] for i in range(reps)]
    encoder.encode(batches[0], batch_size=batch_size)  # warm-up
    cpu, started = time.process_time(), time.perf_counter()
    for batch in batches:
        encoder.encode(batch, batch_size=batch_size)
    n = sum(len(b) for b in batches)
    return {"qps": n / (time.perf_counter() - started), "cpu_ms_per_query": 1000 * (time.process_time() - cpu) / n}


def measure_throughput(servers: dict[str, tuple], encoder: SentenceEncoder, queries: list[str],
                       concurrency: int, client: str) -> Ratios:  # fmt: skip
    """One repetition: both servers at batch 1 and 32 (a table), the throughput ratios, and the encoder's floor;
    with where the CPU went (the clients', each server's) and the server's CPU a query against the floor's."""
    print(f"\n{'':10} {'batch':>5} {'q/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'server CPU ms/q':>15} "
          f"{'client CPU ms/q':>15} {'CPU busy':>8}   concurrency {concurrency}, {client} client")  # fmt: skip
    ratios, ours_b1 = {}, {}
    # The machine's speed drifts from minute to minute (the floor has moved 140-225 q/s within one run): the floor
    # the batch-1 drive is held to is measured right before and right after it, and averaged.
    bracket = [encoder_floor(encoder, queries, concurrency)]
    for batch_size in (1, 32):
        batches = [queries[i : i + batch_size] for i in range(0, len(queries), batch_size)]
        if batch_size == 32:
            batches = batches * 4  # enough requests for stable percentiles
        results = {}
        for name, (url, path, body, pid) in servers.items():
            before = micro_batches(url) if name == "ours" else (0.0, 0.0)
            results[name] = asyncio.run(drive(url, path, body, batches, concurrency, client=client, server_pid=pid))
            r = results[name]
            gathered = ""
            if name == "ours":  # how many concurrent queries shared a forward (the server's own histogram)
                after = micro_batches(url)
                mean = (after[0] - before[0]) / max(after[1] - before[1], 1)
                ratios[f"queries_per_forward/ours@batch{batch_size}"] = mean
                gathered = f"   {mean:.1f} queries per micro-batch"
            print(f"{name:10} {batch_size:>5} {r['qps']:>8.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                  f"{r['server_cpu_ms_per_query']:>15.2f} {r['client_cpu_ms_per_query']:>15.2f} "
                  f"{r['cpu_busy_share']:>8.0%}{gathered}")  # fmt: skip
        ratios[f"qps/ours_over_baseline@batch{batch_size}"] = results["ours"]["qps"] / results["baseline"]["qps"]
        if batch_size == 1:
            ours_b1 = results["ours"]
            bracket.append(encoder_floor(encoder, queries, concurrency))
    print()
    for batch_size in (1, 32):
        target = "2.0x" if batch_size == 1 else "1.0x"
        ratio = ratios[f"qps/ours_over_baseline@batch{batch_size}"]
        print(f"throughput ratio ours/baseline at batch {batch_size}: {ratio:.2f}x (target >= {target})")
    # The floor, measured with the servers idle: only the forward pass, no HTTP, index or batching window.
    at = {key: (bracket[0][key] + bracket[1][key]) / 2 for key in bracket[0]}
    floor = {1: encoder_floor(encoder, queries, 1), concurrency: at}
    ratios[f"qps/ours@batch1_over_encoder_floor@{concurrency}"] = ours_b1["qps"] / at["qps"]
    # Like for like where the clients share the server's cores: the encoder's CPU a query over the server's.
    ratios[f"cpu_per_query/encoder_floor@{concurrency}_over_ours@batch1"] = (
        at["cpu_ms_per_query"] / ours_b1["server_cpu_ms_per_query"]
    )
    ratios["client_cpu_per_query@batch1_ms"] = ours_b1["client_cpu_ms_per_query"]
    print(f"encoder floor: {floor[1]['qps']:.0f} q/s one query per forward, {at['qps']:.0f} q/s {concurrency} per "
          f"forward ({bracket[0]['qps']:.0f} before the batch-1 drives, {bracket[1]['qps']:.0f} after; "
          f"{at['cpu_ms_per_query']:.2f} CPU ms a query); ours at batch 1 reaches "
          f"{ours_b1['qps'] / at['qps']:.0%} of the latter's queries/s, and spends "
          f"{ours_b1['server_cpu_ms_per_query']:.2f} CPU ms a query: the encoder's share of it is "
          f"{ratios[f'cpu_per_query/encoder_floor@{concurrency}_over_ours@batch1']:.0%}; the clients spent "
          f"{ours_b1['client_cpu_ms_per_query']:.2f} CPU ms a query on the same cores")  # fmt: skip
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    parser.add_argument("--queries", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--profile", type=Path, help="Run our server under py-spy; its raw samples go here.")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="The load generator: raw keep-alive HTTP/1.1 (default: costs the shared cores least) "
                        "or httpx's AsyncClient (what earlier runs used).")  # fmt: skip
    add_repeat_arguments(parser, "retriever", cost="The servers start once; a repetition (both servers at batch 1 "
                         "and 32, the encoder floor) takes under a minute on 2 cores.")  # fmt: skip
    args = parser.parse_args(argv)
    started = time.perf_counter()

    encoder_dir = prepare_models(args.work, policy=False).retriever
    docs = load_corpus(args.data)
    vectors = embed_corpus(docs, encoder_dir, args.work)
    print(f"corpus: {len(docs)} passages, {vectors.shape[1]}-d, dtype {DTYPE}")

    questions = []
    for path in sorted((args.data / "qa").glob("*.jsonl")):
        questions.extend(json.loads(line) for line in path.open())
    rng = np.random.default_rng(0)
    picked = [questions[i] for i in rng.permutation(len(questions))[: args.queries]]
    queries = [q["question"][:500] for q in picked]
    hotpot = [json.loads(line) for line in (args.data / "qa" / "hotpotqa.jsonl").open()]

    run_dir = args.work / f"run-{os.getpid()}"
    build_our_index(run_dir, docs, vectors)
    np.save(run_dir / "emb.npy", vectors)
    (run_dir / "ids.json").write_text(json.dumps([d["doc_id"] for d in docs]))

    ours_port, base_port = free_port(), free_port()
    env = {
        **os.environ,
        "BRIDGE_DATA_DIR": str(run_dir),
        "BRIDGE_ADMIN_TOKEN": "bench",
        "BRIDGE_RETRIEVER_ENCODER_DIR": str(encoder_dir),
        "BRIDGE_RETRIEVER_DTYPE": DTYPE,
    }
    logs = (run_dir / "ours.log").open("w"), (run_dir / "baseline.log").open("w")
    serve = [sys.executable, "-m", "services.cli.main", "serve", "retriever", "--port", str(ours_port)]
    if args.profile:  # py-spy cannot attach here (no ptrace into a running process): it starts the server
        spy = Path(sys.executable).with_name("py-spy")
        serve = [str(spy), "record", "--rate", "200", "--format", "raw", "-o", str(args.profile), "--", *serve]
    ours = subprocess.Popen(serve, env=env, cwd=REPO, stdout=logs[0], stderr=subprocess.STDOUT,
                            start_new_session=bool(args.profile))  # fmt: skip
    baseline = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.baselines.search_r1_server",
            str(run_dir / "emb.npy"),
            str(run_dir / "ids.json"),
            str(encoder_dir),
            str(base_port),
            DTYPE,
        ],
        env=env,
        cwd=REPO,
        stdout=logs[1],
        stderr=subprocess.STDOUT,
    )
    ours_url, base_url = f"http://127.0.0.1:{ours_port}", f"http://127.0.0.1:{base_port}"
    try:
        wait_ready(ours_url + "/readyz", ours)
        wait_ready(base_url + "/healthz", baseline)

        def ours_body(batch, k=3):
            return {"queries": batch, "top_k": k, "candidates": max(k, 10)}

        def base_body(batch, k=3):
            return {"queries": batch, "topk": k, "return_scores": True}

        def ours_parse(resp):
            return [[d["id"] for d in r["docs"]] for r in resp["results"]]

        def base_parse(resp):
            return [[d["document"]["id"] for d in r] for r in resp["result"]]

        # Quality first: recall@10 against exact search on the same vectors, and of hotpotqa supporting docs.
        ids = [d["doc_id"] for d in docs]
        encoder = SentenceEncoder.from_pretrained(encoder_dir, dtype=DTYPE)
        qvec = encoder.encode(queries)
        exact = np.argsort(-(qvec @ vectors.T), axis=1)[:, :10]
        exact_ids = [[ids[i] for i in row] for row in exact]
        quality = {}
        for name, url, path, body, parse in (
            ("ours", ours_url, "/v1/search", ours_body, ours_parse),
            ("baseline", base_url, "/retrieve", base_body, base_parse),
        ):
            got = top10(url, path, body, parse, queries)
            vs_exact = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact_ids, strict=True)])
            hp = top10(url, path, body, parse, [q["question"] for q in hotpot])
            support = np.mean(
                [
                    len(set(q["metadata"]["supporting_doc_ids"]) & set(r)) / len(q["metadata"]["supporting_doc_ids"])
                    for q, r in zip(hotpot, hp, strict=True)
                ]
            )
            quality[name] = (vs_exact, support)

        print()
        for name, (vs_exact, support) in quality.items():  # the same vectors every repeat: measured once
            print(
                f"{name:10} recall@10 vs exact search {vs_exact:.3f}   hotpotqa supporting-doc recall@10 {support:.3f}"
            )
        servers = {"baseline": (base_url, "/retrieve", base_body, baseline.pid),
                   "ours": (ours_url, "/v1/search", ours_body, ours.pid)}  # fmt: skip
        runs = repeat(lambda _: measure_throughput(servers, encoder, queries, args.concurrency, args.client),
                      args.repeat)  # fmt: skip
        context = {"passages": len(docs), "queries": len(queries), "concurrency": args.concurrency, "dtype": DTYPE,
                   "client": args.client,
                   "recall10_vs_exact": {name: round(float(q[0]), 4) for name, q in quality.items()}}  # fmt: skip
        finish("retriever", args, runs, started, context=context, argv=argv)
    finally:
        if args.profile:  # Ctrl-C to py-spy's group: the server stops cleanly, py-spy writes its samples
            os.killpg(ours.pid, signal.SIGINT)
            ours.wait(timeout=60)
        for proc in (ours, baseline):
            proc.terminate()
            proc.wait(timeout=30)
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
