"""The Search-R1 agent loop over an engine and the retriever (DESIGN §3). No FastAPI here.

Questions of one call advance in lockstep: every live trajectory generates (concurrently, so the engine
batches them), then the turn's searches go to the retriever in ONE call, then the observations are
appended as token ids. Generated ids are kept exactly as sampled; only observations are tokenised here,
so the generated-token mask is exact by construction.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from services.common.answers import extract_answer
from services.common.clients.retriever import AsyncRetrieverClient
from services.common.schemas.agent_events import DeltaEvent, DocumentsEvent, RetrievedDoc, SearchEvent
from services.common.schemas.policy import SearchStep, TrajectoryRecord, TurnRecord
from services.common.schemas.retriever import DEFAULT_TOP_K, Document
from services.modeling.prompt import ANSWER_STOP, SEARCH_STOP, build_prompt, format_information, parse_search
from services.policy.backends.engine import Engine, SamplingSpec


@dataclass(frozen=True)
class RetrievalSpec:
    top_k: int = DEFAULT_TOP_K
    mode: str = "greedy"  # "sample" in training rollouts
    candidates: int = 20
    temperature: float = 1.0
    version: str | None = None  # a pinned retriever version (training rollouts); None: the active one


@dataclass
class AgentTask:
    question: str
    item_id: str | None = None
    golden_answers: list[str] | None = None
    group_index: int | None = None
    seed: int | None = None
    # The oracle modes: shown first, in place of a first search (oracle), or as the answer to the policy's own
    # first search (oracle-search).
    oracle_docs: list[Document] | None = None


class EventSink:
    """Where the steps of a streamed run go as they happen (a queue the caller drains), and the records being
    built, so that a caller that cancels the run can still store what was generated before it stopped."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.records: list[TrajectoryRecord] = []

    def emit(self, event: object) -> None:
        self.queue.put_nowait(event)


@dataclass
class _State:
    task: AgentTask
    record: TrajectoryRecord
    context_ids: list[int]
    done: bool = False
    oracle_shown: bool = False
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0, "retrieve_s": 0.0})


class AgentRunner:
    def __init__(
        self, engine: Engine, retriever: AsyncRetrieverClient, max_new_tokens: int, max_model_len: int
    ) -> None:
        self.engine = engine
        self.retriever = retriever
        self.max_new_tokens = max_new_tokens
        self.max_model_len = max_model_len
        self.last_retriever_version = "unknown"

    async def run(
        self,
        tasks: list[AgentTask],
        *,
        adapter: str,
        policy_version: str,
        temperature: float,
        max_turns: int,
        retrieval: RetrievalSpec,
        run_id: str | None = None,
        retrieval_seed: int | None = None,
        initial_search: bool = False,
        search_tool: bool = True,
        mode: str = "agent",
        sink: EventSink | None = None,
    ) -> list[tuple[TrajectoryRecord, dict[str, float]]]:
        """`initial_search`: retrieve with the question before the first generation (a scaffold for small
        models, which rarely emit <search> on their own); it is an observation, masked like the others.
        `search_tool=False` prompts without the search tool (the direct-answer baseline; use max_turns=0).
        `sink`: stream the steps (text deltas, searches, documents) of a one-question run as they happen.
        A task's `oracle_docs` are shown before its first generation (`_show_oracle`; use initial_search=False),
        or, with mode="oracle-search", returned by the policy's own first search in place of the retriever's.
        A turn joins the record only once its generation is whole, so a cancelled run leaves no half turn."""
        tokenizer = self.engine.tokenizer
        states = []
        for task in tasks:
            prompt = build_prompt(tokenizer, task.question, search=search_tool)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            record = TrajectoryRecord(
                id=uuid.uuid4().hex,
                item_id=task.item_id,
                run_id=run_id,
                group_index=task.group_index,
                question=task.question,
                golden_answers=task.golden_answers,
                prompt=prompt,
                prompt_ids=prompt_ids,
                turns=[],
                answer=None,
                mode=mode,
                policy_version=policy_version,
                retriever_version=retrieval.version or self.last_retriever_version,
                sampling={
                    "temperature": temperature,
                    "seed": task.seed,
                    "max_turns": max_turns,
                    "retrieval_temperature": retrieval.temperature if retrieval.mode == "sample" else None,
                    "retrieval_candidates": retrieval.candidates,
                    "top_k": retrieval.top_k,
                    "initial_search": int(initial_search),
                },
                created_at=time.time(),
            )
            states.append(_State(task, record, list(prompt_ids)))
        if sink is not None:
            sink.records = [s.record for s in states]
        oracle_answers_search = mode == "oracle-search"
        for state in states:
            if state.task.oracle_docs is not None and not oracle_answers_search:
                self._show_oracle(state, state.task.question, sink)

        if initial_search and states:
            for state in states:
                state.record.turns.append(TurnRecord(generated_ids=[], generated_logprobs=[], text=""))
            await self._search([(s, s.task.question) for s in states], 0, retrieval, retrieval_seed, sink, draw=0)

        for turn in range(max_turns + 1):
            live = [s for s in states if not s.done]
            if not live:
                break
            final = turn == max_turns
            stop = (ANSWER_STOP,) if final else (SEARCH_STOP, ANSWER_STOP)

            async def step(state: _State, turn: int = turn, stop: tuple[str, ...] = stop):
                budget = self.max_model_len - len(state.context_ids)
                if budget < 8:
                    state.done = True
                    return None
                seed = None if state.task.seed is None else state.task.seed * 101 + turn
                spec = SamplingSpec(min(self.max_new_tokens, budget), temperature, stop, seed)
                started = time.perf_counter()
                if sink is None:
                    generation = await self.engine.generate(state.context_ids, spec, adapter)
                else:
                    index = len(state.record.turns)
                    generation = await self.engine.generate_streaming(
                        state.context_ids, spec, adapter, lambda text: sink.emit(DeltaEvent(turn=index, text=text))
                    )
                state.timings["generate_s"] += time.perf_counter() - started
                return generation

            generations = await asyncio.gather(*(step(s) for s in live))
            searches: list[tuple[_State, str]] = []
            for state, generation in zip(live, generations, strict=True):
                if generation is None:
                    continue
                state.record.turns.append(
                    TurnRecord(
                        generated_ids=generation.token_ids,
                        generated_logprobs=generation.logprobs,
                        text=generation.text,
                        finish_reason=generation.finish_reason,
                    )
                )
                state.context_ids += generation.token_ids
                query = None if final else parse_search(generation.text)
                if query is None:
                    state.done = True
                elif oracle_answers_search and state.task.oracle_docs is not None and not state.oracle_shown:
                    self._show_oracle(state, query, sink)
                else:
                    searches.append((state, query))
            if searches:
                await self._search(searches, turn, retrieval, retrieval_seed, sink, draw=turn + 1)

        results = []
        for state in states:
            generated_text = "".join(t.text for t in state.record.turns)
            state.record.answer = extract_answer(generated_text)
            results.append((state.record, state.timings))
        return results

    def _show_oracle(self, state: _State, query: str, sink: EventSink | None) -> None:
        """The oracle modes (an evaluation's measurement of what better evidence is worth): the task's passages
        stand for a search's result. Before the first generation (oracle) they answer a search with the question,
        written exactly as the scaffold writes its search (the call, then the <information> block), so that only
        the passages differ from naive-rag; after a generated search (oracle-search) they answer that search, so
        that only the passages differ from the agent's own first search. Only titles and texts reach the model; the
        observation is masked like every other."""
        docs = state.task.oracle_docs or []
        observation = format_information([(d.title, d.text) for d in docs])
        generated = bool(state.record.turns) and bool(state.record.turns[-1].generated_ids)
        if not generated:
            observation = f"<search> {query} </search>{observation}"
            state.record.turns.append(TurnRecord(generated_ids=[], generated_logprobs=[], text=""))
        turn = len(state.record.turns) - 1
        turn_record = state.record.turns[-1]
        turn_record.observation_ids = self.engine.tokenizer(observation, add_special_tokens=False)["input_ids"]
        turn_record.search = SearchStep(
            turn=turn,
            query=query,
            candidates=[],
            chosen_ids=[d.id for d in docs],
            chosen_titles=[d.title for d in docs],
            mode="oracle",
            temperature=0.0,
            retriever_version=self.last_retriever_version,
        )
        state.context_ids += turn_record.observation_ids
        state.oracle_shown = True
        if sink is not None:
            sink.emit(SearchEvent(turn=turn, query=query))
            sink.emit(
                DocumentsEvent(
                    turn=turn,
                    query=query,
                    docs=[RetrievedDoc(id=d.id, title=d.title, score=0.0, text=d.text) for d in docs],
                    mode="oracle",
                    candidates=0,
                    retriever_version=turn_record.search.retriever_version,
                )
            )

    async def _search(
        self,
        searches: list[tuple[_State, str]],
        turn: int,
        retrieval: RetrievalSpec,
        seed: int | None,
        sink: EventSink | None = None,
        *,
        draw: int,
    ) -> None:
        """`draw`: this search call's place in the trajectory (0 the scaffold's, turn + 1 the model's), so every
        search of a seeded rollout draws its documents from a seed of its own."""
        if sink is not None:
            for state, query in searches:
                sink.emit(SearchEvent(turn=len(state.record.turns) - 1, query=query))
        started = time.perf_counter()
        response = await self.retriever.search(
            [query for _, query in searches],
            top_k=retrieval.top_k,
            mode=retrieval.mode,
            candidates=max(retrieval.candidates, retrieval.top_k),
            temperature=retrieval.temperature,
            seed=None if seed is None else seed * 1009 + draw,
            **({} if retrieval.version is None else {"version": retrieval.version}),
        )
        elapsed = time.perf_counter() - started
        if retrieval.version is None:  # what the service serves now (a pinned search says nothing of it)
            self.last_retriever_version = response.retriever_version
        tokenizer = self.engine.tokenizer
        for (state, query), result in zip(searches, response.results, strict=True):
            observation = format_information([(d.title, d.text) for d in result.docs])
            if not state.record.turns[-1].generated_ids:  # the scaffold's search: write the call it stands for
                observation = f"<search> {query} </search>{observation}"
            observation_ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
            turn_record = state.record.turns[-1]
            turn_record.observation_ids = observation_ids
            turn_record.search = SearchStep(
                turn=turn,
                query=query,
                candidates=[{"id": c.id, "score": c.score} for c in result.candidates],
                chosen_ids=[d.id for d in result.docs],
                chosen_titles=[d.title for d in result.docs],
                logprob=result.logprob,
                mode=retrieval.mode,
                temperature=retrieval.temperature,
                retriever_version=response.retriever_version,
            )
            state.record.retriever_version = response.retriever_version
            state.context_ids += observation_ids
            state.timings["retrieve_s"] += elapsed
            if sink is not None:
                sink.emit(
                    DocumentsEvent(
                        turn=len(state.record.turns) - 1,
                        query=query,
                        docs=[RetrievedDoc(id=d.id, title=d.title, score=d.score, text=d.text) for d in result.docs],
                        mode=retrieval.mode,
                        candidates=len(result.candidates),
                        logprob=result.logprob,
                        retriever_version=response.retriever_version,
                    )
                )
