"""Issue #15: the web console as a person uses it, in a real headless Chromium (Debian's `chromium`, driven by
Playwright's Python package; no browser is downloaded), against a real stack: retriever with the demo corpus,
policy (transformers engine), Redis, a Celery worker that trains one round, and the console in front.

Screenshots of every view go to $BRIDGE_CONSOLE_SCREENSHOTS (docs/console when regenerating docs/api.md's) or a
temporary folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port, policy_env, start_service, stop_service

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RUN_ID = "console-run"
QUESTION = "What science fantasy young adult series has companion books about enslaved worlds?"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, retriever_factory, policy_models_root):
    from services.cli.ingest import ingest_file
    from services.common.clients.retriever import RetrieverClient

    tmp = tmp_path_factory.mktemp("console")
    shared = {"BRIDGE_CHECKPOINT_DIR": str(tmp / "checkpoints")}
    retriever = retriever_factory("console-retriever", **shared)
    with RetrieverClient(retriever.url, admin_token=retriever.token, timeout=600) as client:
        ingest_file(client, REPO / "services/demo_data/hotpotqa_corpus.jsonl", progress=False)
    env = policy_env(policy_models_root, retriever.url, BRIDGE_POLICY_ENGINE="transformers",
                     BRIDGE_POLICY_MAX_NEW_TOKENS="24", BRIDGE_POLICY_DTYPE="float32", **shared)  # fmt: skip
    policy = start_service("policy", tmp / "policy", env, timeout=300)
    metrics_port, queue = free_port(), f"bridge-console-{os.getpid()}"
    trainer_env = {
        **os.environ, **shared, "BRIDGE_DATA_DIR": str(tmp / "trainer"), "BRIDGE_ADMIN_TOKEN": policy.token,
        "REDIS_URL": env["REDIS_URL"], "BRIDGE_TRAINER_TRAJECTORY_STREAM": env["BRIDGE_POLICY_TRAJECTORY_STREAM"],
        "BRIDGE_TRAINER_FEEDBACK_STREAM": env["BRIDGE_POLICY_FEEDBACK_STREAM"], "BRIDGE_TRAINER_QUEUE": queue,
        "BRIDGE_TRAINER_POLICY_URL": policy.url, "BRIDGE_TRAINER_RETRIEVER_URL": retriever.url,
        "BRIDGE_TRAINER_POLICY_BASE_DIR": str(policy_models_root / "SmolLM2-135M-Instruct"),
        "BRIDGE_TRAINER_RETRIEVER_BASE_DIR": str(policy_models_root / "all-MiniLM-L6-v2"),
        "BRIDGE_TRAINER_METRICS_PORT": str(metrics_port),
    }  # fmt: skip
    worker = subprocess.Popen([sys.executable, "-m", "services.cli.main", "worker"], env=trainer_env, cwd=REPO,
                              stdout=(tmp / "worker.log").open("w"), stderr=subprocess.STDOUT)  # fmt: skip
    console = start_service("console", tmp / "console", {
        "BRIDGE_CONSOLE_POLICY_URL": policy.url, "BRIDGE_CONSOLE_RETRIEVER_URL": retriever.url,
        "BRIDGE_CONSOLE_TRAINER_URL": f"http://127.0.0.1:{metrics_port}", "BRIDGE_CONSOLE_TRAINER_QUEUE": queue,
        "REDIS_URL": env["REDIS_URL"],
    })  # fmt: skip
    yield {"retriever": retriever, "policy": policy, "console": console, "trainer_env": trainer_env, "tmp": tmp}
    stop_service(console)
    worker.terminate()
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    stop_service(policy)


@pytest.fixture(scope="module")
def trained(stack):
    """One BRIDGE round on the worker: a run with curves, and a checkpoint of each service to activate."""
    run = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "train", "--rounds", "1", "--questions-per-round", "1",
         "--group-size", "2", "--max-turns", "1", "--run-id", RUN_ID],
        env=stack["trainer_env"], cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr + (stack["tmp"] / "worker.log").read_text()[-3000:]
    return stack


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("BRIDGE_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser):
    # bypass_csp: the page forbids eval, which Playwright's wait_for_function needs; the app itself never evals.
    context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, errors  # no script error on any view


def signed_in(page, token: str) -> None:
    """The admin token in the tab's session storage before any script runs, as the sign-in form leaves it: the
    trajectory list is every user's questions, so the policy serves it to the admin token only."""
    page.add_init_script(f"sessionStorage.setItem('bridge.adminToken', {json.dumps(token)})")


def test_ask_streams_and_opens_its_trajectory(stack, page, shots):
    signed_in(page, stack["policy"].token)
    page.goto(stack["console"].url + "/#ask")
    page.fill("#question", QUESTION)
    page.fill("#ask-turns", "1")
    page.click("#ask-button")
    # Streaming: the documents and the generated text are on screen while the answer is not there yet.
    page.wait_for_function(
        "document.querySelector('.doc') && document.querySelector('.turn-text')"
        " && [...document.querySelectorAll('.turn-text')].some(t => t.textContent.length > 0)"
        " && document.getElementById('ask-answer').hidden",
        timeout=120_000,
    )
    page.wait_for_selector("#open-trajectory", timeout=180_000)
    assert page.locator(".doc").count() >= 3 and "score" in page.locator(".doc").first.inner_text()
    assert "greedy" in page.inner_text("#ask-steps") and "retriever base" in page.inner_text("#ask-steps")
    assert page.is_visible("#answer-text")
    page.screenshot(path=shots / "ask.png", full_page=True)

    page.click("#open-trajectory")
    page.wait_for_selector("#token-view .tok-generated", state="attached")
    assert page.locator("#token-view .tok-observation").count() > 0  # the retrieved passages, told apart
    assert QUESTION in page.inner_text("#trajectory")
    assert "✓ chosen" in page.inner_text(".search-step")
    assert page.locator("#traj-table tbody tr").count() >= 1
    page.screenshot(path=shots / "trajectories.png", full_page=True)


def test_runs_show_the_curves_of_a_trained_round(trained, page, shots):
    page.goto(trained["console"].url + f"/#runs/{RUN_ID}")
    page.wait_for_selector(f'#runs-table tr[data-run="{RUN_ID}"]')
    page.wait_for_selector("#run .plot canvas")
    assert page.locator("#run .plot").count() == 4  # reward, EM/F1, recall, losses
    assert page.locator("#round-table tbody tr").count() == 1
    assert "bridge" in page.inner_text("#run") and "estimator" in page.inner_text("#run")
    page.screenshot(path=shots / "runs.png", full_page=True)
    runs = httpx.get(trained["console"].url + "/api/trainer/v1/runs").json()["runs"]
    assert [r["run_id"] for r in runs] == [RUN_ID] and runs[0]["rounds_done"] == 1


def test_checkpoints_roll_back_and_activate_with_the_token_and_not_without(trained, page, shots):
    retriever = trained["retriever"]
    version = f"{RUN_ID}-r0-retriever"
    page.goto(trained["console"].url + "/#checkpoints")
    card = page.locator("#ckpt-retriever")
    card.locator(f'tr[data-version="{version}"]').wait_for()
    card.locator("button.rollback").click()
    page.wait_for_function("document.getElementById('ckpt-status').textContent.includes('refused')")
    assert "401" in page.inner_text("#ckpt-status")
    assert httpx.get(retriever.url + "/v1/checkpoints").json()["active"] == version  # nothing changed

    page.click("#credentials summary")
    page.fill("#admin-token", retriever.token)
    page.click("#credentials-form button[type=submit]")
    assert retriever.token not in page.url
    card.locator(f'tr[data-version="{version}"]').wait_for()
    card.locator("button.rollback").click()
    page.wait_for_function("document.getElementById('ckpt-status').textContent.includes('rollback done')")
    assert httpx.get(retriever.url + "/v1/checkpoints").json()["active"] == "base"
    card.locator(f'tr[data-version="{version}"] button.activate').click()
    page.wait_for_function(f"document.getElementById('ckpt-status').textContent.includes('active {version}')")
    assert httpx.get(retriever.url + "/v1/checkpoints").json()["active"] == version
    page.locator('#ckpt-policy tr[data-version="base"]').wait_for()
    page.screenshot(path=shots / "checkpoints.png", full_page=True)


def test_health_shows_every_component(trained, page, shots):
    page.goto(trained["console"].url + "/#health")
    page.wait_for_selector('#health-table tr[data-component="workers"]', timeout=30_000)
    states = dict(
        zip(page.locator("#health-table tbody td:nth-child(1)").all_inner_texts(),
            page.locator("#health-table tbody td:nth-child(2)").all_inner_texts(), strict=True)
    )  # fmt: skip
    assert states == {"retriever": "ok", "index": "ok", "policy": "ok", "engine (transformers)": "ok", "redis": "ok",
                      "workers": "ok", "trainer runs API": "ok"}, states  # fmt: skip
    page.screenshot(path=shots / "health.png", full_page=True)


def test_every_view_fits_a_phone(trained, browser, shots):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                  device_scale_factor=2, bypass_csp=True)  # fmt: skip
    page = context.new_page()
    signed_in(page, trained["policy"].token)
    try:
        for view, ready in (("ask", "#ask-form"), ("trajectories", "#traj-table tbody tr"),
                            (f"runs/{RUN_ID}", "#run .plot canvas"), ("checkpoints", "#ckpt-retriever table"),
                            ("health", '#health-table tr[data-component="workers"]')):  # fmt: skip
            page.goto(f"{trained['console'].url}/#{view}")
            page.wait_for_selector(ready, timeout=30_000)
            # Nothing wider than the screen: wide tables scroll inside their own box.
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), view
            page.screenshot(path=shots / f"phone-{view.split('/')[0]}.png", full_page=True)
    finally:
        context.close()
