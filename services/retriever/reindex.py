"""The re-embed job: a new document tower embeds the corpus into its own collection, while the active version keeps
serving from the one it has. The checkpoint registry runs it in the background when such a version is activated and
flips to it when it finishes; on failure the half-built collection is dropped and the reason is recorded."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from services.modeling.encoder import SentenceEncoder
from services.retriever.backends.index import VectorIndex

log = logging.getLogger(__name__)


class ReembedFailed(RuntimeError):
    """Re-embedding the corpus with a new document tower cannot finish (the reason is recorded on the checkpoint)."""


def passage_text(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


@dataclass
class ReindexProgress:
    version: str
    source: str
    target: str
    passages: int = 0  # embedded so far
    finished: bool = False


class ReindexJob:
    """One re-embed at a time (the registry allows one pending version); `progress` says how far the last got."""

    def __init__(self, index: VectorIndex, encode_batch_size: int) -> None:
        self.index = index
        self.encode_batch_size = encode_batch_size
        self.progress: ReindexProgress | None = None
        self._lock = threading.Lock()

    def run(self, version: str, source: str, target: str, doc_encoder: SentenceEncoder) -> None:
        """Embed every passage of `source` with `doc_encoder` into a fresh `target`, then optimise it."""
        with self._lock:
            self.progress = progress = ReindexProgress(version, source, target)
            if self.index.collection_exists(target):
                self.index.drop_collection(target)  # a half-built collection from an interrupted run
            self.index.create_collection(target, doc_encoder.dim)
            for payloads in self.index.scroll(source, batch=256):
                texts = [passage_text(p.get("title", ""), p["text"]) for p in payloads]
                vectors = doc_encoder.encode(texts, batch_size=self.encode_batch_size, kind="passage")
                if not np.isfinite(vectors).all():  # the index would take them, and never find those passages
                    bad = int((~np.isfinite(vectors).all(axis=1)).sum())
                    raise ReembedFailed(
                        f"the document tower gave non-finite vectors for {bad} of {len(texts)} passages"
                    )
                self.index.upsert(target, vectors, payloads)
                progress.passages += len(payloads)
            self.index.optimize(target)
            progress.finished = True

    def drop(self, target: str) -> None:
        """Free what a half-built collection holds; nothing serves from it."""
        try:
            if self.index.collection_exists(target):
                self.index.drop_collection(target)
        except Exception:
            log.exception("could not drop the half-built collection %s", target)
