"""Writes the round's checkpoints into the shared checkpoint root (temporary folder, then an atomic rename).

A retried train step writes its checkpoint again, replacing an earlier attempt's: the weights published are
always those of the attempt whose optimizer state and stats the round keeps (until the round is published,
nothing has read them)."""

from __future__ import annotations

from pathlib import Path

from services.common.checkpoints import publish_checkpoint, staging_dir
from services.trainer.models import PolicyModel, RetrieverModel


def retriever_version(run_id: str, round_index: int) -> str:
    return f"{run_id}-r{round_index}-retriever"


def policy_version(run_id: str, round_index: int) -> str:
    return f"{run_id}-r{round_index}-policy"


def write_retriever(root: Path, retriever: RetrieverModel, version: str, parent: str | None, **meta) -> Path:
    final = root / version
    staging = staging_dir(root, version)
    retriever.save_query(staging, "query_encoder.safetensors")
    extra = {**meta.pop("extra", {}), "retriever_params": retriever.params}
    publish_checkpoint(
        staging, final, replace=True, kind="retriever-query", version=version, parent=parent, extra=extra, **meta
    )
    return final


def write_policy(root: Path, policy: PolicyModel, version: str, parent: str | None, **meta) -> Path:
    final = root / version
    staging = staging_dir(root, version)
    policy.save_adapter(staging)
    publish_checkpoint(staging, final, replace=True, kind="policy-lora", version=version, parent=parent, **meta)
    return final
