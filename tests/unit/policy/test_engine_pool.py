"""EnginePool (services/policy/backends/engine_pool.py): generations to the least busy copy, every model change on
all copies or on none. The copies here are in-memory engines (the pool is what is under test; the real vLLM pair
is tests/integration/test_policy_service.py, whose service runs two engines)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.policy.backends.engine import Engine, EngineError, Generation, SamplingSpec
from services.policy.backends.engine_pool import EnginePool
from services.policy.backends.vllm_engine import cpu_share

SPEC = SamplingSpec(max_tokens=4, temperature=0.0, stop=())


class Copy(Engine):
    def __init__(self, name: str, refuse: bool = False, delay: float = 0.05) -> None:
        self.name, self.refuse, self.delay = name, refuse, delay
        self.tokenizer = None
        self.adapters: set[str] = set()
        self.weights: list[Path] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, prompt_ids: list[int], spec: SamplingSpec, adapter: str) -> Generation:
        await asyncio.sleep(self.delay)
        return Generation(token_ids=[1], logprobs=[0.0], text=self.name, finish_reason="stop")

    async def load_adapter(self, name: str, path: Path) -> None:
        if self.refuse:
            raise EngineError(f"{self.name} is out of LoRA slots")
        self.adapters.add(name)

    async def unload_adapter(self, name: str) -> None:
        self.adapters.discard(name)

    async def swap_weights(self, folder: Path) -> None:
        self.weights.append(folder)


def test_concurrent_generations_spread_over_the_copies_and_a_quiet_pool_uses_the_first():
    pool = EnginePool([Copy("a"), Copy("b")])

    async def run() -> tuple[list[str], list[str]]:
        together = await asyncio.gather(*(pool.generate([1], SPEC, "base") for _ in range(6)))
        one_by_one = [await pool.generate([1], SPEC, "base") for _ in range(3)]
        return [g.text for g in together], [g.text for g in one_by_one]

    together, one_by_one = asyncio.run(run())
    assert sorted(together) == ["a", "a", "a", "b", "b", "b"]
    assert one_by_one == ["a", "a", "a"]
    assert pool.served == [6, 3] and pool.in_flight == [0, 0]


def test_an_adapter_is_on_every_copy_or_on_none():
    good, refusing = Copy("a"), Copy("b", refuse=True)
    pool = EnginePool([good, Copy("c")])
    asyncio.run(pool.load_adapter("v1", Path("/ckpt/v1")))
    assert all("v1" in e.adapters for e in pool.engines)
    pool = EnginePool([good, refusing])
    with pytest.raises(EngineError, match=r"loading adapter v2 failed on 1 of 2 engines: engine 1: b is out"):
        asyncio.run(pool.load_adapter("v2", Path("/ckpt/v2")))
    assert "v2" not in good.adapters  # the copy that took it dropped it again
    asyncio.run(pool.unload_adapter("v1"))
    assert good.adapters == set()


def test_merged_weights_reload_on_every_copy():
    pool = EnginePool([Copy("a"), Copy("b")])
    asyncio.run(pool.swap_weights(Path("/merged/v1")))
    assert [e.weights for e in pool.engines] == [[Path("/merged/v1")]] * 2


@pytest.mark.parametrize(
    "engines, cpus, shares",
    [(1, 2, ["0-1"]), (2, 2, ["0-0", "1-1"]), (2, 16, ["0-7", "8-15"]), (3, 2, ["0-0", "1-1", "0-0"])],
)
def test_each_engine_binds_its_share_of_the_cores(engines, cpus, shares):
    assert [cpu_share(n, engines, cpus) for n in range(engines)] == shares


def test_engines_from_settings(tmp_path, policy_models_root):
    from services.policy.service import build_engine
    from services.policy.settings import PolicySettings

    model = policy_models_root / "SmolLM2-135M-Instruct"
    started = PolicySettings(data_dir=tmp_path, model_dir=str(model), vllm_engines=2, vllm_port=9100)
    pool = build_engine(started)
    assert isinstance(pool, EnginePool) and [e.port for e in pool.engines] == [9100, 9101]
    assert [e.command()[e.command().index("--port") + 1] for e in pool.engines] == ["9100", "9101"]
    external = PolicySettings(data_dir=tmp_path, model_dir=str(model), vllm_url="http://h1:8011, http://h2:8011")
    assert external.engine_count == 2 and not external.serves_merged
    assert [e.url for e in build_engine(external).engines] == ["http://h1:8011", "http://h2:8011"]
    assert type(build_engine(PolicySettings(data_dir=tmp_path, model_dir=str(model)))).__name__ == "VLLMEngine"


class Starting(Copy):
    """A copy whose start takes `delay` seconds and logs when it began and ended; `fails` raises instead."""

    def __init__(self, name: str, log: list[str], compiles: bool = False, fails: bool = False) -> None:
        super().__init__(name)
        self.log, self.compiles, self.fails, self.stopped = log, compiles, fails, False

    async def start(self) -> None:
        self.log.append(f"{self.name}+")
        await asyncio.sleep(0.05)
        if self.fails:
            raise EngineError(f"{self.name} did not start")
        self.log.append(f"{self.name}-")

    async def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize(
    "compiles, order",
    [(False, ["a+", "b+", "c+", "a-", "b-", "c-"]),  # eager copies: all at once
     (True, ["a+", "a-", "b+", "c+", "b-", "c-"])],  # the first compiles alone, the rest then load its cache at once
)  # fmt: skip
def test_copies_start_at_once_unless_the_first_compiles(compiles, order):
    log: list[str] = []
    pool = EnginePool([Starting(name, log, compiles=compiles) for name in "abc"])
    asyncio.run(pool.start())
    assert log == order


def test_a_copy_that_fails_to_start_stops_every_copy_and_the_error_is_its_own():
    log: list[str] = []
    pool = EnginePool([Starting("a", log), Starting("b", log, fails=True)])
    with pytest.raises(EngineError, match="b did not start"):
        asyncio.run(pool.start())
    assert all(e.stopped for e in pool.engines)


def test_vllm_compiles_unless_told_to_run_eagerly(tmp_path, policy_models_root):
    from services.policy.backends.vllm_engine import VLLMEngine
    from services.policy.settings import PolicySettings

    model = str(policy_models_root / "SmolLM2-135M-Instruct")
    default, eager, eager_args = (
        VLLMEngine(PolicySettings(data_dir=tmp_path, model_dir=model, **kw))
        for kw in ({}, {"vllm_enforce_eager": True}, {"vllm_args": "--enforce-eager"})
    )
    assert default.compiles and not default.eager and "--enforce-eager" not in default.command()
    assert eager.eager and not eager.compiles and eager.command().count("--enforce-eager") == 1
    assert eager_args.eager and eager_args.command().count("--enforce-eager") == 1  # the user's own flag, once
    external = VLLMEngine(PolicySettings(data_dir=tmp_path, model_dir=model, vllm_url="http://h1:8011"))
    assert not external.compiles  # started elsewhere: nothing here compiles
