"""The console's logic: pass calls through to the services, and probe every component for the health view.
No FastAPI here."""

from __future__ import annotations

import asyncio

import httpx
import redis.asyncio as aioredis

from services.console.protocol import ComponentHealth, HealthReport
from services.console.settings import ConsoleSettings

UPSTREAMS = ("policy", "retriever", "trainer")
# Headers passed through to a service: the caller's credentials and what describes the body. Nothing else.
FORWARD_HEADERS = ("authorization", "x-api-key", "content-type", "accept")


class ConsoleService:
    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.urls = {"policy": settings.policy_url, "retriever": settings.retriever_url,
                     "trainer": settings.trainer_url}  # fmt: skip
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(settings.request_timeout_s, connect=5))
        self.redis = aioredis.from_url(settings.resolved_redis_url, socket_timeout=settings.health_timeout_s,
                                       socket_connect_timeout=settings.health_timeout_s)  # fmt: skip

    async def close(self) -> None:
        await self.http.aclose()
        await self.redis.aclose()

    async def forward(
        self, upstream: str, method: str, path: str, query: bytes, headers: dict[str, str], body: bytes
    ) -> httpx.Response:
        """Send one call on to a service; the response is open for streaming (the caller closes it)."""
        url = f"{self.urls[upstream]}/{path}" + (f"?{query.decode()}" if query else "")
        kept = {k: v for k, v in headers.items() if k.lower() in FORWARD_HEADERS}
        request = self.http.build_request(method, url, headers=kept, content=body or None)
        return await self.http.send(request, stream=True)

    async def _get(self, url: str) -> httpx.Response:
        return await self.http.get(url, timeout=self.settings.health_timeout_s)

    async def _service(self, name: str) -> list[ComponentHealth]:
        url = self.urls[name]
        behind = ComponentHealth(name="index" if name == "retriever" else "engine", state="unknown",
                                 detail=f"not seen: the {name} service is down")  # fmt: skip
        try:
            response = await self._get(url + "/readyz")
        except httpx.HTTPError as exc:
            down = ComponentHealth(name=name, state="down", detail=f"unreachable at {url}: {type(exc).__name__}")
            return [down, behind]
        body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        if response.status_code != 200:
            detail = body.get("detail", response.text[:200]) if isinstance(body, dict) else response.text[:200]
            return [ComponentHealth(name=name, state="down", detail=f"{response.status_code}: {detail}"), behind]
        if name == "retriever":
            return [
                ComponentHealth(name="retriever", state="ok", detail=f"version {body.get('retriever_version')}",
                                info=body),
                ComponentHealth(name="index", state="ok", detail=f"{body.get('documents')} documents",
                                info={"documents": body.get("documents")}),
            ]  # fmt: skip
        engine_ok = body.get("engine_healthy", True)
        return [
            ComponentHealth(name="policy", state="ok", detail=f"version {body.get('policy_version')}", info=body),
            ComponentHealth(name=f"engine ({body.get('engine')})", state="ok" if engine_ok else "down",
                            detail="answering" if engine_ok else "not answering its health check"),
        ]  # fmt: skip

    async def _redis_and_workers(self) -> list[ComponentHealth]:
        try:
            await self.redis.ping()
            queued = await self.redis.llen(self.settings.trainer_queue)
        except Exception as exc:  # any failure to reach Redis is its state here, not a console error
            return [
                ComponentHealth(name="redis", state="down", detail=f"{type(exc).__name__}: {exc}"),
                ComponentHealth(name="workers", state="unknown", detail="not seen: Redis (their broker) is down"),
            ]
        components = [ComponentHealth(name="redis", state="ok", detail=self.settings.resolved_redis_url.split("@")[-1])]
        workers = await asyncio.to_thread(self._ping_workers)
        components.append(
            ComponentHealth(
                name="workers", state="ok" if workers else "down",
                detail=f"{len(workers)} answering; queue '{self.settings.trainer_queue}': {queued} waiting",
                info={"workers": workers, "queue": self.settings.trainer_queue, "queued": queued},
            )
        )  # fmt: skip
        return components

    def _ping_workers(self) -> list[str]:
        """Celery's own ping over the broker: every worker on this Redis answers with its name."""
        from celery import Celery

        app = Celery(broker=self.settings.resolved_redis_url)
        try:
            replies = app.control.ping(timeout=min(self.settings.health_timeout_s, 1.5)) or []
        except Exception:  # the broker went away between the two probes: no worker can be seen
            return []
        finally:
            app.close()
        return sorted(name for reply in replies for name in reply)

    async def _trainer(self) -> list[ComponentHealth]:
        url = self.urls["trainer"]
        try:
            response = await self._get(url + "/v1/runs")
            runs = response.json()["runs"] if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return [ComponentHealth(name="trainer runs API", state="down", detail=f"{url}: {type(exc).__name__}")]
        if runs is None:
            return [ComponentHealth(name="trainer runs API", state="down", detail=f"{url}: {response.status_code}")]
        running = sum(1 for r in runs if r["status"] == "running")
        return [ComponentHealth(name="trainer runs API", state="ok", detail=f"{len(runs)} runs, {running} running")]

    async def health(self) -> HealthReport:
        parts = await asyncio.gather(
            self._service("retriever"), self._service("policy"), self._redis_and_workers(), self._trainer()
        )
        return HealthReport(components=[c for part in parts for c in part])
