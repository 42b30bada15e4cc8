"""The baseline: a retrieval server of Search-R1's kind (`search_r1/search/retrieval_server.py`).

A plain FastAPI endpoint that encodes the request's queries as one padded batch with the same encoder weights (as
Search-R1's `Encoder.encode` does: `padding=True` over the batch) and does exact inner-product search over an
in-memory matrix with numpy, one request at a time through FastAPI's thread pool.
Run: python -m bench.baselines.search_r1_server EMBEDDINGS.npy IDS.json ENCODER_DIR PORT DTYPE
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from services.modeling.encoder import SentenceEncoder


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int = 3
    return_scores: bool = False


def main() -> None:
    emb_path, ids_path, encoder_dir, port, dtype = sys.argv[1:6]
    matrix = np.load(emb_path)
    ids = json.loads(open(ids_path).read())
    encoder = SentenceEncoder.from_pretrained(encoder_dir, dtype=dtype)
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:
        with torch.inference_mode():
            vectors = encoder.forward(request.queries, kind="query").float().numpy()  # the matrix: passage side
        scores = vectors @ matrix.T  # (Q, N)
        top = np.argpartition(-scores, request.topk, axis=1)[:, : request.topk]
        result = []
        for row, cand in zip(scores, top, strict=True):
            order = cand[np.argsort(-row[cand])]
            result.append([{"document": {"id": ids[i]}, "score": float(row[i])} for i in order])
        return {"result": result}

    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
