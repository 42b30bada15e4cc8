// BRIDGE console: one page, no build step. Talks only to /api/* on its own origin (the console passes calls through
// to the services). Everything shown from the services goes into the page as text, never as HTML.
"use strict";

// ---- credentials: this tab's session storage only (never the URL, never logged) ----
const creds = {
  get admin() { return sessionStorage.getItem("bridge.adminToken") || ""; },
  get apiKey() { return sessionStorage.getItem("bridge.apiKey") || ""; },
  save(admin, key) {
    admin ? sessionStorage.setItem("bridge.adminToken", admin) : sessionStorage.removeItem("bridge.adminToken");
    key ? sessionStorage.setItem("bridge.apiKey", key) : sessionStorage.removeItem("bridge.apiKey");
  },
};

function headers(kind, json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (kind === "admin" && creds.admin) h["Authorization"] = `Bearer ${creds.admin}`;
  if (kind === "agent") {
    if (creds.apiKey) h["X-API-Key"] = creds.apiKey;
    else if (creds.admin) h["Authorization"] = `Bearer ${creds.admin}`;
  }
  return h;
}

async function api(upstream, path, { method = "GET", body, kind = "agent" } = {}) {
  const response = await fetch(`/api/${upstream}/${path}`, {
    method, headers: headers(kind, body !== undefined), body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const reason = (data && (data.detail || (data.error && data.error.message))) || response.statusText;
    throw new Error(`${response.status}: ${reason}`);
  }
  return data;
}

// ---- small DOM helpers (text only) ----
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
const when = (t) => new Date(t * 1000).toLocaleString();
function status(id, text, error = false) { const s = $(id); s.textContent = text; s.classList.toggle("error", error); }

// ---- views ----
const views = ["ask", "trajectories", "runs", "checkpoints", "health"];
const loaders = {};
function route() {
  const [view, arg] = (location.hash.slice(1) || "ask").split("/");
  const name = views.includes(view) ? view : "ask";
  for (const v of views) $(`view-${v}`).hidden = v !== name;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === name);
  if (loaders[name]) loaders[name](arg ? decodeURIComponent(arg) : undefined);
}

// ---- Ask: the answer streams in (Server-Sent Events over a POST) ----
async function ask(event) {
  event.preventDefault();
  const steps = $("ask-steps"), answer = $("ask-answer"), button = $("ask-button");
  steps.replaceChildren(); answer.hidden = true; button.disabled = true;
  status("ask-status", "asking…");
  const body = { question: $("question").value, mode: $("ask-mode").value, max_turns: Number($("ask-turns").value),
                 top_k: Number($("ask-topk").value), stream: true };
  const turns = {};
  const turnCard = (i) => {
    if (!turns[i]) {
      const text = el("div", { class: "turn-text" });
      const card = el("div", { class: "card turn", "data-turn": i }, el("div", { class: "meta" }, `turn ${i}`), text);
      steps.append(card);
      turns[i] = { card, text };
    }
    return turns[i];
  };
  try {
    const response = await fetch("/api/policy/v1/agent/query", { method: "POST", headers: headers("agent", true),
                                                                 body: JSON.stringify(body) });
    if (!response.ok) {
      let reason = response.statusText;
      try { reason = (await response.json()).detail; } catch (_) { /* keep the status text */ }
      throw new Error(`${response.status}: ${reason}`);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) handleEvent(JSON.parse(data));
      }
    }
  } catch (err) {
    status("ask-status", String(err.message || err), true);
  } finally {
    button.disabled = false;
  }

  function handleEvent(e) {
    if (e.type === "start") status("ask-status", `policy ${e.policy_version} · trajectory ${e.trajectory_id} · thinking…`);
    else if (e.type === "delta") turnCard(e.turn).text.append(e.text);
    else if (e.type === "search") turnCard(e.turn).card.append(el("div", { class: "search" }, `search: ${e.query}`));
    else if (e.type === "documents") {
      const list = el("ul", { class: "docs" }, e.docs.map((d) => el("li", { class: "doc" },
        el("strong", {}, d.title), " ", el("span", { class: "meta" }, `score ${fmt(d.score)} · ${d.id}`))));
      turnCard(e.turn).card.append(
        el("div", { class: "meta" }, `${e.mode} · ${e.candidates} candidates · retriever ${e.retriever_version}` +
           (e.logprob === null ? "" : ` · log-prob ${fmt(e.logprob)}`)), list);
    } else if (e.type === "answer") {
      answer.replaceChildren(el("div", { class: "meta" }, "answer"), el("div", { id: "answer-text" }, e.answer || "(none)"));
      answer.hidden = false;
    } else if (e.type === "done") {
      const r = e.response;
      status("ask-status", "");
      $("ask-status").append(`policy ${r.policy_version} · retriever ${r.retriever_version} · ` +
                             `${fmt(r.timings.total_s, 1)} s · `,
                             el("a", { href: `#trajectories/${r.trajectory_id}`, id: "open-trajectory" }, "open its trajectory"));
    } else if (e.type === "error") status("ask-status", `failed: ${e.detail}`, true);
  }
}

// ---- Trajectories ----
loaders.trajectories = async (id) => {
  const q = new URLSearchParams({ limit: "50" });
  if ($("f-policy").value) q.set("policy_version", $("f-policy").value);
  if ($("f-retriever").value) q.set("retriever_version", $("f-retriever").value);
  if ($("f-reward").value !== "") q.set("min_reward", $("f-reward").value);
  status("traj-status", "loading…");
  try {
    const data = await api("policy", `v1/trajectories?${q}`, { kind: "admin" });  // every user's questions: admin only
    $("traj-table").tBodies[0].replaceChildren(...data.trajectories.map((t) => el("tr", {
      class: "clickable", "data-id": t.id, onclick: () => { location.hash = `trajectories/${t.id}`; } },
      el("td", {}, when(t.created_at)), el("td", { class: "q", title: t.question }, t.question),
      el("td", {}, t.answer ?? (t.status === "cancelled" ? "(cut short)" : "–")), el("td", {}, t.mode),
      el("td", {}, fmt(t.reward, 2)), el("td", {}, t.policy_version), el("td", {}, t.retriever_version),
      el("td", {}, t.run_id || "live"))));
    status("traj-status", `${data.trajectories.length} latest trajectories (newest first)`);
  } catch (err) { status("traj-status", String(err.message), true); }
  if (id) showTrajectory(id);
  else $("traj-detail").replaceChildren();
};

async function showTrajectory(id) {
  const box = $("traj-detail");
  box.replaceChildren(el("div", { class: "status" }, "loading trajectory…"));
  try {
    const [t, tokens] = await Promise.all([api("policy", `v1/trajectories/${id}`),
                                           api("policy", `v1/trajectories/${id}/tokens`)]);
    const tokenView = el("div", { class: "tokens", id: "token-view" }, tokens.segments.map((s) =>
      s.tokens.map((tok, i) => el("span", { class: `tok-${s.kind}`,
        title: s.logprobs ? `${s.kind}, turn ${s.turn}, log-prob ${fmt(s.logprobs[i])}` : `${s.kind} (masked)` }, tok))));
    const searches = t.turns.filter((turn) => turn.search).map((turn) => {
      const s = turn.search, chosen = new Set(s.chosen_ids);
      return el("div", { class: "card search-step" },
        el("div", { class: "search" }, `turn ${s.turn}: ${s.query}`),
        el("div", { class: "meta" }, `${s.mode} · temperature ${s.temperature} · retriever ${s.retriever_version} · ` +
           `log-prob of the chosen set ${fmt(s.logprob)}`),
        el("div", { class: "scroll" }, el("table", { class: "candidates" },
          el("thead", {}, el("tr", {}, el("th", {}, "candidate"), el("th", {}, "score"), el("th", {}, "shown"))),
          el("tbody", {}, s.candidates.map((c) => el("tr", {}, el("td", {}, c.id), el("td", {}, fmt(c.score)),
                                                     el("td", {}, chosen.has(c.id) ? "✓ chosen" : "")))))));
    });
    box.replaceChildren(el("div", { class: "card", id: "trajectory" },
      el("h3", {}, t.question),
      el("div", {}, "answer: ", el("strong", {}, t.answer ?? "(none)"), t.status === "cancelled" ? " (cut short)" : ""),
      el("div", { class: "meta" }, `reward ${fmt(t.reward, 2)} · EM ${fmt(t.em, 2)} · F1 ${fmt(t.f1, 2)} · ` +
         `policy ${t.policy_version} · retriever ${t.retriever_version} · ${t.mode} · ${t.id}`),
      el("div", { class: "legend meta" }, el("span", { class: "tok-generated" }, "generated (trained on)"),
         el("span", { class: "tok-observation" }, "observation (masked)"), el("span", { class: "tok-prompt" }, "prompt")),
      tokenView), ...searches);
  } catch (err) { box.replaceChildren(el("div", { class: "error" }, String(err.message))); }
}

// ---- Runs ----
loaders.runs = async (id) => {
  status("runs-status", "loading…");
  try {
    const data = await api("trainer", "v1/runs");
    $("runs-table").tBodies[0].replaceChildren(...data.runs.map((r) => el("tr", {
      class: "clickable", "data-run": r.run_id, onclick: () => { location.hash = `runs/${r.run_id}`; } },
      el("td", {}, r.run_id), el("td", {}, r.algo), el("td", {}, r.estimator || "–"), el("td", {}, r.status),
      el("td", {}, `${r.rounds_done}/${r.rounds}`), el("td", {}, fmt(r.latest && r.latest["reward/mean"])),
      el("td", {}, fmt(r.latest && r.latest["em/mean"])), el("td", {}, fmt(r.latest && r.latest["recall/support"])))));
    status("runs-status", data.runs.length ? `${data.runs.length} runs` : "no runs yet (bridge-rl train …)");
    const pick = id || (data.runs[0] && data.runs[0].run_id);
    if (pick) showRun(pick); else $("run-detail").replaceChildren();
  } catch (err) { status("runs-status", String(err.message), true); }
};

// A plot's box goes into the page first; uPlot draws into it once the box has its width (see drawPlots).
function plot(title, rounds, series, unit = false) {
  const box = el("div", { class: "plot", "data-plot": title }, el("h4", {}, title));
  box.plotData = { rounds, series, unit };
  return box;
}

function drawPlots(container) {
  const colors = ["#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7d8c", "#57606a"];
  for (const box of container.querySelectorAll(".plot")) {
    const { rounds, series, unit } = box.plotData;
    const lo = Math.min(...rounds), hi = Math.max(...rounds);
    const opts = {
      width: Math.max(200, box.clientWidth - 16), height: 170, legend: { show: series.length > 1 },
      scales: { x: { time: false, range: () => (hi > lo ? [lo, hi] : [lo - 1, hi + 1]) },
                y: unit ? { range: [0, 1] } : { auto: true } },
      axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100], values: (u, ticks) => ticks.map((t) => String(t)) },
             { size: 44 }],
      series: [{ label: "round" }, ...series.map((s, i) => ({ label: s.label, stroke: colors[i % 8], width: 2,
                                                               points: { show: true, size: 6 } }))],
    };
    // eslint-disable-next-line no-undef
    new uPlot(opts, [rounds, ...series.map((s) => s.values)], box);
  }
}

// The promotion gate's decision on a round (docs/training.md): kept back rounds name their reason.
function gateCell(row) {
  if (row["gate/accepted"] === undefined) return "–";
  const em = `canary EM ${fmt(row["gate/em_candidate"])} vs ${fmt(row["gate/em_serving"])}`;
  return row["gate/accepted"] ? `accepted, ${em}` : `kept back: ${row["gate/reason"]}`;
}

async function showRun(id) {
  const box = $("run-detail");
  try {
    const run = await api("trainer", `v1/runs/${id}`);
    const rows = run.metrics, rounds = rows.map((r) => r.round);
    const col = (k) => rows.map((r) => (typeof r[k] === "number" ? r[k] : null));
    const lossKeys = [...new Set(rows.flatMap((r) => Object.keys(r).filter((k) => k.startsWith("loss/"))))];
    const plots = rows.length ? [
      plot("reward", rounds, [{ label: "reward/mean", values: col("reward/mean") }], true),
      plot("exact match", rounds, [{ label: "em/mean", values: col("em/mean") }, { label: "f1/mean", values: col("f1/mean") }],
           true),
      plot("recall of supporting docs", rounds, [{ label: "recall/support", values: col("recall/support") }], true),
      plot("losses", rounds, lossKeys.map((k) => ({ label: k, values: col(k) }))),
    ] : [el("div", { class: "status" }, "no round published yet")];
    const table = el("table", { id: "round-table" },
      el("thead", {}, el("tr", {}, ["round", "wall time (s)", "peak memory (MB)", "lambda", "retriever", "policy", "gate"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, el("td", {}, r.round), el("td", {}, fmt(r["time/train_s"], 1)),
        el("td", {}, fmt(r["memory/peak_mb"], 0)), el("td", {}, fmt(r.lambda, 2)), el("td", {}, r.retriever_version ?? "–"),
        el("td", {}, r.policy_version ?? "–"), el("td", { class: r["gate/accepted"] === 0 ? "error" : "" }, gateCell(r))))));
    const s = run.summary;
    box.replaceChildren(el("div", { class: "card", id: "run" },
      el("h3", {}, s.run_id), el("div", { class: "meta" }, `${s.algo} · estimator ${s.estimator || "–"} · ${s.dataset} · ` +
        `${s.source} · ${s.status} · ${s.rounds_done}/${s.rounds} rounds`), s.error ? el("div", { class: "error" }, s.error) : null,
      el("div", { class: "plots" }, plots), el("div", { class: "scroll" }, table),
      el("details", {}, el("summary", {}, "config"), el("pre", { class: "config" }, JSON.stringify(run.config, null, 2)))));
    drawPlots(box);
  } catch (err) { box.replaceChildren(el("div", { class: "error" }, String(err.message))); }
}

// ---- Checkpoints ----
loaders.checkpoints = async () => {
  const box = $("ckpt-services");
  box.replaceChildren(...["retriever", "policy"].map((name) => el("div", { class: "card", id: `ckpt-${name}` }, el("h3", {}, name))));
  await Promise.all(["retriever", "policy"].map(renderCheckpoints));
};

async function renderCheckpoints(name) {
  const card = $(`ckpt-${name}`);
  try {
    const list = await api(name, "v1/checkpoints", { kind: "admin" });
    const act = (label, path) => async () => {
      status("ckpt-status", `${label}…`);
      try {
        const r = await api(name, path, { method: "POST", kind: "admin" });
        status("ckpt-status", `${name}: ${label} done: active ${r.active}, previous ${r.previous ?? "–"}`);
      } catch (err) { status("ckpt-status", `${name}: ${label} refused: ${err.message}`, true); }
      renderCheckpoints(name);
    };
    const rows = list.checkpoints.map((c) => el("tr", { "data-version": c.version },
      el("td", {}, c.version, " ", c.version === list.active ? el("span", { class: "badge active" }, "active") : null,
         c.version === list.previous ? el("span", { class: "badge previous" }, "previous") : null),
      el("td", {}, c.kind), el("td", {}, c.parent ?? "–"), el("td", {}, c.created_at ?? "–"),
      el("td", {}, c.version === list.active ? "" : el("button", { class: "secondary activate",
        onclick: act(`activate ${c.version}`, `v1/checkpoints/${encodeURIComponent(c.version)}/activate`) }, "activate"))));
    const path = el("input", { placeholder: "folder under the checkpoint root", class: "register-path" });
    card.replaceChildren(el("h3", {}, name),
      el("div", { class: "meta" }, `active ${list.active} · previous ${list.previous ?? "–"}` +
         (list.pending ? ` · preparing ${list.pending}` : "")),
      el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {},
        ["version", "kind", "parent", "created", ""].map((h) => el("th", {}, h)))), el("tbody", {}, rows))),
      el("div", { class: "row" },
        el("button", { class: "rollback", disabled: list.previous ? null : "", onclick: act("rollback", "v1/checkpoints/rollback") },
           "roll back"),
        path, el("button", { class: "secondary register", onclick: async () => {
          try {
            const m = await api(name, "v1/checkpoints", { method: "POST", kind: "admin", body: { path: path.value } });
            status("ckpt-status", `${name}: registered ${m.version}`);
          } catch (err) { status("ckpt-status", `${name}: register refused: ${err.message}`, true); }
          renderCheckpoints(name);
        } }, "register")));
  } catch (err) { card.append(el("div", { class: "error" }, String(err.message))); }
}

// ---- Health ----
loaders.health = async () => {
  status("health-status", "probing…");
  try {
    const report = await fetch("/api/health").then((r) => r.json());
    $("health-table").tBodies[0].replaceChildren(...report.components.map((c) => el("tr", { "data-component": c.name },
      el("td", {}, c.name), el("td", { class: { ok: "ok", unknown: "meta" }[c.state] || "down" }, c.state),
      el("td", {}, c.detail))));
    status("health-status", `checked ${new Date().toLocaleTimeString()}`);
  } catch (err) { status("health-status", String(err.message), true); }
};

// ---- start ----
document.addEventListener("DOMContentLoaded", () => {
  $("ask-form").addEventListener("submit", ask);
  $("traj-filter").addEventListener("submit", (e) => { e.preventDefault(); loaders.trajectories(); });
  $("admin-token").value = creds.admin; $("api-key").value = creds.apiKey;
  $("credentials-form").addEventListener("submit", (e) => {
    e.preventDefault(); creds.save($("admin-token").value.trim(), $("api-key").value.trim());
    $("credentials").open = false; route();
  });
  $("forget").addEventListener("click", () => { creds.save("", ""); $("admin-token").value = ""; $("api-key").value = ""; route(); });
  window.addEventListener("hashchange", route);
  route();
});
