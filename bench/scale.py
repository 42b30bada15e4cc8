"""How retrieval cost grows with the corpus: Qdrant Edge (the embedded default), qdrant-client and exact search.

For each size (default 32k, 256k and 1M passages) and each engine, a fresh process builds the index from synthetic
384-d unit vectors (clustered like sentence embeddings: each is a random centre plus noise, so HNSW faces a realistic
neighbourhood structure, not uniform noise), then times one query at a time (the agent's case: batch 1) and reports
ingest seconds, p50 / p99 latency, queries/s, the process's memory growth and peak, and recall@10 against exact
search on the same vectors. Encoding the query is not included (one MiniLM forward of a short query: ~4 ms here;
bench/retriever.py measures the whole service).

    python -m bench.scale [--sizes 32000 256000 1000000] [--engines edge client exact] [--client-max 256000]
                          [--repeat 3] [--json docs/results/bench/scale.json]
    python -m bench.scale --plot docs/results/scale.json docs/results/scale-1m.json   # one plot of saved runs

qdrant-client's local mode (`path=`, no server) keeps points in Python objects and searches them by brute force; it
ingests ~1k points/s, so it is skipped above `--client-max`. A Qdrant server (`QDRANT_URL`) is what that engine
is for at scale; this bench measures the local mode the embedded stack could fall back to.

Every size x engine runs `--repeat` times (default 3; the rows of every repeat go to `--out`, the plot draws their
medians); each exact/edge latency ratio is printed per repeat and then as its median and spread, with the CPU, and
written to `--json` for docs/performance.md's headline table (`python -m tools.perf_table --write`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.repeat import Ratios, add_repeat_arguments, command_line, finish, median_rows, repeat
from bench.script import REPO, script_parser
from services.common.stats import percentile

DIM = 384
ENGINES = ("edge", "client", "exact")
PLOTTED = ("p50_ms", "ingest_s", "memory_mb")  # what plot() draws: the median over repeats


def synthetic(n: int, seed: int) -> np.ndarray:
    """`n` unit vectors around n/64 random centres (float32), generated in chunks to bound the peak."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 64), DIM), dtype=np.float32)
    out = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 65536):
        rows = min(65536, n - start)
        chunk = centres[rng.integers(0, len(centres), rows)] + 0.9 * rng.standard_normal((rows, DIM), dtype=np.float32)
        out[start : start + rows] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out


def queries_near(vectors: np.ndarray, count: int, seed: int) -> np.ndarray:
    """Noisy copies of stored vectors: a query has true neighbours, as a question has its passages."""
    rng = np.random.default_rng(seed + 1)
    picked = vectors[rng.integers(0, len(vectors), count)]
    noisy = picked + 0.05 * rng.standard_normal(picked.shape, dtype=np.float32)
    return noisy / np.linalg.norm(noisy, axis=1, keepdims=True)


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set of this process, MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def exact_top10(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    out = np.empty((len(queries), 10), dtype=np.int64)
    for start in range(0, len(queries), 64):
        scores = queries[start : start + 64] @ vectors.T
        top = np.argpartition(-scores, 10, axis=1)[:, :10]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[start : start + 64] = np.take_along_axis(top, order, axis=1)
    return out


def measure(engine: str, n: int, queries: int, seed: int) -> dict:
    """One row, in this process: build, then time `queries` single-query searches."""
    from services.retriever.backends.index import EdgeIndex, QdrantClientIndex

    vectors = synthetic(n, seed)
    probe = queries_near(vectors, queries, seed)
    truth = exact_top10(vectors, probe)
    before, _ = rss_mb()
    (REPO / ".cache").mkdir(exist_ok=True)  # a fresh clone has none
    folder = Path(tempfile.mkdtemp(prefix=f"scale-{engine}-", dir=REPO / ".cache"))
    started = time.perf_counter()
    if engine == "exact":
        matrix = vectors.copy()  # what a Search-R1-style exact server holds: the matrix itself

        def search(q: np.ndarray) -> list[int]:
            return exact_top10(matrix, q[None])[0].tolist()
    else:
        index = EdgeIndex(folder) if engine == "edge" else QdrantClientIndex(path=folder)
        index.create_collection("c", DIM)
        for start in range(0, n, 4096):
            rows = range(start, min(n, start + 4096))
            index.upsert("c", vectors[start : rows.stop], [{"doc_id": str(i)} for i in rows])
        index.optimize("c")

        def search(q: np.ndarray) -> list[int]:
            return [int(h.doc_id) for h in index.search("c", q[None], 10)[0]]

    ingest_s = time.perf_counter() - started
    search(probe[0])  # warm-up
    latencies, found = [], []
    for q in probe:
        t = time.perf_counter()
        found.append(search(q))
        latencies.append(time.perf_counter() - t)
    current, peak = rss_mb()
    disk = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "engine": engine, "n": n, "ingest_s": ingest_s,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "qps": len(latencies) / sum(latencies),
        "memory_mb": current - before, "peak_mb": peak, "disk_mb": disk / 2**20,
        "recall10": float(np.mean([len(set(f) & set(t.tolist())) / 10 for f, t in zip(found, truth, strict=True)])),
    }  # fmt: skip


def plot(rows: list[dict], out: Path) -> None:
    """p50 latency, ingest seconds and resident memory against passages, one line per engine (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("p50_ms", "p50 latency, one query (ms)"), ("ingest_s", "ingest + index build (s)"),
              ("memory_mb", "resident memory growth (MB)"))  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.8))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for engine in ENGINES:
            points = sorted((r["n"], max(r[key], 1e-2)) for r in rows if r["engine"] == engine)
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=engine)
        ax.set(xscale="log", yscale="log", xlabel="passages", title=label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out)


def run_row(engine: str, n: int, queries: int, seed: int) -> dict | str:
    """One row in a fresh process (its own peak memory): the row, or why it failed."""
    command = [sys.executable, "-m", "bench.scale", "--row", engine, str(n), "--queries", str(queries),
               "--seed", str(seed)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1:]}"
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"wall_s": time.perf_counter() - started}


def measure_sizes(args: argparse.Namespace, index: int, rows: list[dict]) -> Ratios:
    """One repetition: every size x engine, printed as a table; appends the rows, returns exact/edge latency."""
    print(f"{'engine':8} {'passages':>9} {'ingest s':>9} {'p50 ms':>8} {'p99 ms':>8} {'q/s':>8} "
          f"{'mem MB':>8} {'peak MB':>8} {'disk MB':>8} {'recall@10':>9}", flush=True)  # fmt: skip
    these = []
    for n in args.sizes:
        for engine in args.engines:
            if engine == "client" and n > args.client_max:
                print(f"{engine:8} {n:>9}   skipped (above --client-max {args.client_max})", flush=True)
                continue
            row = run_row(engine, n, args.queries, args.seed)
            if isinstance(row, str):
                print(f"{engine:8} {n:>9}   {row}", flush=True)
                continue
            these.append(row | {"repeat": index})
            print(f"{engine:8} {n:>9} {row['ingest_s']:>9.1f} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
                  f"{row['qps']:>8.0f} {row['memory_mb']:>8.0f} {row['peak_mb']:>8.0f} {row['disk_mb']:>8.0f} "
                  f"{row['recall10']:>9.3f}", flush=True)  # fmt: skip
    ratios = {}
    for n in args.sizes:
        by = {r["engine"]: r for r in these if r["n"] == n}
        if "edge" in by and "exact" in by:
            ratios[f"p50_ms/exact_over_edge@{n}"] = ratio = by["exact"]["p50_ms"] / by["edge"]["p50_ms"]
            print(f"latency ratio exact/edge at {n} passages: {ratio:.2f}x")
    rows.extend(these)
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__, seed=0, out=REPO / "docs" / "results" / "scale.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32_000, 256_000, 1_000_000])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--queries", type=int, default=300, help="Single-query searches timed per row.")
    parser.add_argument("--client-max", type=int, default=256_000, help="Largest size qdrant-client local mode gets.")
    parser.add_argument("--row", nargs=2, metavar=("ENGINE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--plot", type=Path, nargs="+", metavar="JSON",
                        help="Only plot the rows of these saved runs, to the first one's .png.")  # fmt: skip
    add_repeat_arguments(parser, "scale", cost="Long: one repetition at the default sizes is ~25 min on 2 cores "
                         "(Edge ingests 1M points in ~13 min), so the default 3 take over an hour; "
                         "--sizes 32000 256000 --client-max 32000 took ~5 min a repetition.")  # fmt: skip
    args = parser.parse_args(argv)
    if args.plot:
        rows = [r for f in args.plot for r in json.loads(f.read_text())["rows"]]
        plot(median_rows(rows, ("engine", "n"), PLOTTED), args.plot[0].with_suffix(".png"))
        return
    if args.row:
        print(json.dumps(measure(args.row[0], int(args.row[1]), args.queries, args.seed)))
        return

    started, rows = time.perf_counter(), []
    runs = repeat(lambda index: measure_sizes(args, index, rows), args.repeat)
    finish("scale", args, runs, started, context={"sizes": args.sizes, "queries": args.queries}, argv=argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = command_line("scale", argv)
    args.out.write_text(json.dumps({"command": command, "repeat": args.repeat, "rows": rows}, indent=1))
    plot(median_rows(rows, ("engine", "n"), PLOTTED), args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
