"""Policy logic: serve questions, run rollout groups, take feedback. No FastAPI here."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx

from services.common.answers import exact_match, f1_score, reward_for, trajectory_text
from services.common.clients.retriever import AsyncRetrieverClient, ServiceError
from services.common.errors import Conflict, DeadlineExceeded, InvalidRequest, UpstreamUnavailable
from services.common.schemas.agent_events import AnswerEvent, DoneEvent, StartEvent
from services.common.schemas.policy import (
    ORACLE_MODES,
    AgentQueryRequest,
    AgentQueryResponse,
    FeedbackRequest,
    FeedbackResponse,
    RewardKind,
    RolloutRequest,
    RolloutResponse,
    RolloutSummary,
    SearchStepView,
    TokenSegment,
    TrajectoryList,
    TrajectoryRecord,
    TrajectorySummary,
    TrajectoryTokens,
    TurnView,
)
from services.common.schemas.retriever import Document
from services.policy.adapters import adapter_registry
from services.policy.agent import AgentRunner, AgentTask, EventSink, RetrievalSpec
from services.policy.backends.engine import Engine, EngineError
from services.policy.merged import AdapterPerRequest, ServedWeights, merged_registry
from services.policy.settings import PolicySettings
from services.policy.store import TrajectoryStore

T = TypeVar("T")
log = logging.getLogger(__name__)
_SUMMARY_FIELDS = set(TrajectorySummary.model_fields) - {"searches"}

# How each AgentQueryRequest.mode runs the loop (the baselines answer in one final turn).
_MODES: dict[str, dict[str, object]] = {
    "agent": {"mode": "agent"},
    "naive-rag": {"mode": "naive-rag", "initial_search": True},
    "direct": {"mode": "direct", "initial_search": False, "search_tool": False},
    "oracle": {"mode": "oracle", "initial_search": False},  # the request's passages stand for the first search
    "oracle-search": {"mode": "oracle-search", "initial_search": False},  # ... answer the policy's first search
}


def build_engine(settings: PolicySettings) -> Engine:
    if settings.engine == "transformers":
        from services.policy.backends.hf_engine import TransformersEngine

        return TransformersEngine(settings)
    from services.policy.backends.vllm_engine import VLLMEngine

    if settings.engine_count == 1:
        return VLLMEngine(settings)
    from services.policy.backends.engine_pool import EnginePool

    return EnginePool([VLLMEngine(settings, index=n) for n in range(settings.engine_count)])


class PolicyService:
    def __init__(
        self,
        settings: PolicySettings,
        engine: Engine,
        on_pinned_trim: Callable[[str, int], None] = lambda stream, count: None,
    ) -> None:
        """`on_pinned_trim(stream, count)`: entries a training run needed were trimmed (the metric counts them)."""
        self.settings = settings
        self.engine = engine
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        registry_file = settings.state_dir / "registry.json"
        if settings.serves_merged:
            base = Path(settings.resolved_model_dir)
            self.checkpoints = merged_registry(engine, base, settings.state_dir / "merged", settings.checkpoint_root,
                                               registry_file)  # fmt: skip
            self.weights: ServedWeights | AdapterPerRequest = ServedWeights(engine, base)
        else:
            self.checkpoints = adapter_registry(engine, settings.checkpoint_root, registry_file)
            self.weights = AdapterPerRequest()
        self.retriever = AsyncRetrieverClient(settings.retriever_url, timeout=settings.request_timeout_s)
        self.store = TrajectoryStore(
            settings.resolved_redis_url,
            settings.trajectory_stream,
            settings.feedback_stream,
            settings.stream_bound,
            settings.trajectory_ttl_s,
            on_pinned_trim,
        )
        self.agent = AgentRunner(engine, self.retriever, settings.max_new_tokens, settings.max_model_len)
        self.explore_rng = random.Random()  # which served queries draw the exploring share of retrieval
        self._cleanups: set[asyncio.Task] = set()  # cut-short streams being recorded

    async def start(self) -> None:
        await self.engine.start()
        await self.checkpoints.restore(previous=True)
        await self.store.ping()

    async def stop(self) -> None:
        if self._cleanups:
            await asyncio.wait(self._cleanups, timeout=30)
        await self.retriever.aclose()
        await self.store.close()
        await self.engine.stop()

    async def _run(
        self, tasks: list[AgentTask], version: str | None = None, **kwargs
    ) -> list[tuple[TrajectoryRecord, dict[str, float]]]:
        kwargs.setdefault("initial_search", self.settings.initial_search)
        async with self.checkpoints.lease(version) as version:
            try:
                async with self.weights.serving(version, self.checkpoints.weights(version)) as adapter:
                    return await self.agent.run(tasks, adapter=adapter, policy_version=version, **kwargs)
            except EngineError as exc:
                raise UpstreamUnavailable(f"LLM engine: {exc}") from exc
            except ServiceError as exc:
                if exc.status_code == 409:  # a pinned retriever version it does not have: the caller's conflict
                    raise Conflict(f"retriever: {exc.detail}", param="retriever_version") from exc
                raise UpstreamUnavailable(f"retriever answered {exc.status_code}: {exc.detail}") from exc
            except httpx.TransportError as exc:
                raise UpstreamUnavailable(f"retriever unreachable at {self.settings.retriever_url}: {exc}") from exc

    async def answer(
        self, request: AgentQueryRequest, sink: EventSink | None = None, version: str | None = None
    ) -> tuple[TrajectoryRecord, dict[str, float]]:
        oracle = None if request.oracle_doc_ids is None else await self._oracle_docs(request.oracle_doc_ids)
        [(record, timings)] = await self._run(
            [AgentTask(question=request.question, oracle_docs=oracle)],
            temperature=self.settings.serve_temperature,
            max_turns=request.max_turns if request.mode in ("agent", *ORACLE_MODES) else 0,
            retrieval=self.settings.serve_retrieval_spec(
                request.top_k, explore=self.settings.explores(self.explore_rng.random())
            ),
            sink=sink,
            version=version,
            **_MODES[request.mode],
        )
        await self.store.append([record])
        return record, timings

    async def _oracle_docs(self, ids: list[str]) -> list[Document]:
        """The indexed passages of `ids`, in that order: what a search returning them would show."""
        try:
            found = await self.retriever.lookup(ids)
        except ServiceError as exc:
            raise UpstreamUnavailable(f"retriever answered {exc.status_code}: {exc.detail}") from exc
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"retriever unreachable at {self.settings.retriever_url}: {exc}") from exc
        if found.missing:
            raise InvalidRequest(
                f"{len(found.missing)} of oracle_doc_ids not in the retriever's index, e.g. {found.missing[:3]}",
                param="oracle_doc_ids",
            )
        return found.documents

    async def query(self, request: AgentQueryRequest, version: str | None = None) -> AgentQueryResponse:
        started = time.perf_counter()
        record, timings = await self.within_deadline(self.answer(request, version=version))
        return self.response(record, timings, started)

    async def within_deadline(self, work: Awaitable[T]) -> T:
        """`work` or a 504 once `agent_deadline_s` has passed (the work is cancelled)."""
        deadline = self.settings.agent_deadline_s
        timer = asyncio.timeout(deadline)
        try:
            async with timer:
                return await work
        except TimeoutError as exc:
            if not timer.expired():  # a timeout of its own inside the work, not the deadline
                raise
            raise DeadlineExceeded(f"the agent ran past this deployment's deadline of {deadline:g} s "
                                   "(BRIDGE_POLICY_AGENT_DEADLINE_S)", code="deadline_exceeded") from exc  # fmt: skip

    @staticmethod
    def response(record: TrajectoryRecord, timings: dict[str, float], started: float) -> AgentQueryResponse:
        turns = [
            TurnView(
                text=t.text,
                search=None
                if t.search is None
                else SearchStepView(
                    query=t.search.query,
                    mode=t.search.mode,
                    docs=[
                        {"id": i, "title": title}
                        for i, title in zip(t.search.chosen_ids, t.search.chosen_titles, strict=False)
                    ],
                ),
            )
            for t in record.turns
        ]
        return AgentQueryResponse(
            answer=record.answer or "",
            trajectory_id=record.id,
            policy_version=record.policy_version,
            retriever_version=record.retriever_version,
            turns=turns,
            timings={**timings, "total_s": time.perf_counter() - started},
        )

    async def query_stream(self, request: AgentQueryRequest, version: str | None = None) -> AsyncIterator[object]:
        """The steps of one question as they happen (services.common.schemas.agent_events), ending with `done`.
        Domain errors propagate (the route turns them into a final error event). If the consumer stops early
        (the client went away), the run is cancelled and what it generated is recorded as `cancelled`."""
        started = time.perf_counter()
        sink = EventSink()
        work = asyncio.create_task(self.within_deadline(self.answer(request, sink, version)))
        work.add_done_callback(lambda _: sink.queue.put_nowait(None))
        finished = False
        try:
            announced = False
            while (event := await sink.queue.get()) is not None:
                if not announced and sink.records:
                    announced = True
                    record = sink.records[0]
                    yield StartEvent(trajectory_id=record.id, question=record.question,
                                     policy_version=record.policy_version, mode=record.mode)  # fmt: skip
                yield event
            record, timings = work.result()
            if not announced:
                yield StartEvent(trajectory_id=record.id, question=record.question,
                                 policy_version=record.policy_version, mode=record.mode)  # fmt: skip
            yield AnswerEvent(answer=record.answer or "", reward=record.reward, trajectory_id=record.id)
            finished = True
            yield DoneEvent(response=self.response(record, timings, started))
        finally:
            if not finished and not work.done():
                # Not awaited here: this generator may be closing inside a cancelled scope, where any await fails.
                cleanup = asyncio.create_task(self._record_cut_short(work, sink))
                self._cleanups.add(cleanup)
                cleanup.add_done_callback(self._cleanups.discard)

    async def _record_cut_short(self, work: asyncio.Task, sink: EventSink) -> None:
        work.cancel()
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # it finished (and stored its record, or failed) before the cancel reached it
            return
        if not sink.records:
            return
        for record in sink.records:
            record.turns = [t for t in record.turns if t.generated_ids or t.search is not None]
            record.answer = None
            record.status = "cancelled"
        try:
            await self.store.append(sink.records)
            log.info("client went away: trajectory %s recorded as cancelled", [r.id for r in sink.records])
        except Exception:  # a background task: log it, there is no caller left to tell
            log.exception("could not record the cancelled trajectory")

    async def rollouts(self, request: RolloutRequest) -> RolloutResponse:
        """Groups of sampled trajectories, at the pinned versions when the request names them (a training run's
        own), else the active ones; a pinned version this deployment does not have is a 409, never a silent
        substitute."""
        if request.policy_version is not None and request.policy_version not in self.checkpoints.table.checkpoints:
            raise Conflict(f"policy version {request.policy_version!r} is not registered here",
                           param="policy_version", code="version_not_registered")  # fmt: skip
        base_seed = request.seed
        tasks = [
            AgentTask(
                question=item.question,
                item_id=item.id,
                golden_answers=item.golden_answers,
                group_index=g,
                seed=None if base_seed is None else base_seed * 100_003 + i * request.group_size + g,
            )
            for i, item in enumerate(request.items)
            for g in range(request.group_size)
        ]
        results = await self._run(
            tasks,
            temperature=request.temperature,
            max_turns=request.max_turns,
            retrieval=RetrievalSpec(
                top_k=request.top_k,
                mode="sample",
                candidates=request.candidates,
                temperature=request.retrieval_temperature,
                version=request.retriever_version,
            ),
            version=request.policy_version,
            run_id=request.run_id,
            **({} if request.initial_search is None else {"initial_search": request.initial_search}),
            retrieval_seed=base_seed,
        )
        records = []
        for record, _ in results:
            self._score(record, record.golden_answers or [], request.reward)
            records.append(record)
        await self.store.append(records)
        return RolloutResponse(
            trajectories=[
                RolloutSummary(
                    trajectory_id=r.id,
                    item_id=r.item_id or "",
                    answer=r.answer,
                    reward=r.reward or 0.0,
                    reward_kind=request.reward,
                    em=r.em or 0.0,
                    f1=r.f1 or 0.0,
                    policy_version=r.policy_version,
                    retriever_version=r.retriever_version,
                )
                for r in records
            ]
        )

    def _score(self, record: TrajectoryRecord, gold: list[str], kind: RewardKind) -> None:
        """EM and F1 against `gold`, and the training reward of `kind` (rollouts and feedback score alike)."""
        record.em = exact_match(record.answer, gold)
        record.f1 = f1_score(record.answer, gold)
        text = trajectory_text(record, self.engine.tokenizer) if kind == "em-format" else ""
        record.reward = reward_for(kind, text, record.answer, gold)
        record.reward_kind = kind

    async def feedback(self, request: FeedbackRequest) -> FeedbackResponse:
        record = await self.store.get(request.trajectory_id)
        if record.status == "cancelled":  # no answer to reward: live learning must never train on a cut-short run
            raise Conflict(f"trajectory {record.id} was cut short (its client went away): it has no answer to reward",
                           param="trajectory_id")  # fmt: skip
        if request.golden_answers is not None:
            record.golden_answers = request.golden_answers
            self._score(record, request.golden_answers, request.reward_kind)
        else:
            record.reward = request.reward
        if not await self.store.set_reward(record):
            raise Conflict(
                f"trajectory {record.id} already has its feedback: one per trajectory, so that live learning trains "
                "on each answer once",
                param="trajectory_id",
                code="feedback_given",
            )
        return FeedbackResponse(trajectory_id=record.id, reward=record.reward, em=record.em, f1=record.f1)

    async def trajectory(self, trajectory_id: str) -> TrajectoryRecord:
        return await self.store.get(trajectory_id)

    async def latest_trajectories(
        self, limit: int, policy_version: str | None = None, retriever_version: str | None = None,
        min_reward: float | None = None,
    ) -> TrajectoryList:  # fmt: skip
        """Newest first, filtered; scans at most 10x `limit` of the stream to fill the page."""
        records = await self.store.latest(min(limit * 10, 2000))
        picked = [
            r for r in records
            if (policy_version is None or r.policy_version == policy_version)
            and (retriever_version is None or r.retriever_version == retriever_version)
            and (min_reward is None or (r.reward is not None and r.reward >= min_reward))
        ][:limit]  # fmt: skip
        return TrajectoryList(
            trajectories=[
                TrajectorySummary(
                    **r.model_dump(include=_SUMMARY_FIELDS), searches=sum(1 for t in r.turns if t.search is not None)
                )
                for r in picked
            ]
        )

    async def trajectory_tokens(self, trajectory_id: str) -> TrajectoryTokens:
        """The record's tokens, each decoded on its own, in runs of prompt / generated / observation."""
        record = await self.store.get(trajectory_id)
        tokenizer = self.engine.tokenizer

        def pieces(ids: list[int]) -> list[str]:
            return [tokenizer.decode([i]) for i in ids]

        segments = [TokenSegment(kind="prompt", tokens=pieces(record.prompt_ids))]
        for index, turn in enumerate(record.turns):
            if turn.generated_ids:
                segments.append(TokenSegment(kind="generated", turn=index, tokens=pieces(turn.generated_ids),
                                             logprobs=turn.generated_logprobs))  # fmt: skip
            if turn.observation_ids:
                segments.append(TokenSegment(kind="observation", turn=index, tokens=pieces(turn.observation_ids)))
        return TrajectoryTokens(trajectory_id=record.id, segments=segments)
