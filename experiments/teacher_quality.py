"""Does the lower level's teacher know more than its student? Before training the retriever on Q_theta, measure it.

On training-pool questions (never the evaluation split), each question's first search is scored exactly as a
round scores it (`build_batch`'s Q samples: the `q_candidates` best of M candidates under the start tower, the
frozen warm-started policy's log pi(y* | x, d) per candidate). Over those candidates, the probability mass on
the question's gold supporting passages under

- the student, p_phi0 (softmax of the served scores at the retrieval temperature),
- the teacher without a prior, Q_theta(d) ∝ pi(y* | x, d)^(1 / beta_Q) (what section 18 trained on),
- the teacher with the prior (`q_prior`), p_phi0(d) pi(y* | x, d)^(1 / beta_Q) / Z, the posterior,

and how often each one's top candidate is gold. Only questions with a gold passage among the candidates and a
non-gold one as well can tell anything; the rest are counted and left out. A teacher with less gold mass than the
student can only move the retriever away from the supporting passages: the target would unlearn, as it did.

    python -m experiments.teacher_quality --qa-dir ../shared/data/qa --corpus-dir ../shared/data/corpus \
        --questions 96 --out docs/results/teacher-quality
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bench.script import REPO
from experiments.lower_level import doc_matrix, frozen_warm_start, load_corpora, rollouts, supporting, train_questions
from services.common.answers import contains_gold, label_answer
from services.data.split import training_rows
from services.eval.stats import bootstrap_questions, sign_test
from services.modeling.shipped import SHIPPED_ADAPTERS
from services.trainer.algo.batch import build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.algo.losses import q_target
from services.trainer.models import RetrieverModel
from services.trainer.warmstart.adapter import shipped_trained_ids

DISTRIBUTIONS = ("student", "teacher", "posterior")
BETA_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)


def score_batch(policy, retriever, doc_vecs, ids, docs, rows, args, rng) -> list[dict]:
    """One Q sample per question (G = 1, q_steps = the batch), its three distributions over the candidates. An odd
    batch (the last one) scores its last question twice, as GRPO's pairs need, and keeps it once."""
    records = rollouts(policy, retriever, doc_vecs, ids, docs, rows + rows[-1:] * (len(rows) % 2), args, rng,
                       generate=False)  # fmt: skip
    # group_size only shapes GRPO's advantages, unused here (the config asks for >= 2; each question has one search)
    cfg = AlgoConfig(algo="retriever-only", retriever_objective="target", group_size=2, q_steps=len(records),
                     q_candidates=args.q_candidates, beta_q=args.beta_q, seed=args.seed)  # fmt: skip
    batch = build_batch(records, cfg, policy.tokenizer, docs)
    by_item = {str(r["id"]): r for r in rows}
    out = []
    for q in batch.q_samples:
        search = batch.searches[q.search]
        record = batch.records[search.trajectory]
        if any(o["item"] == record.item_id for o in out):
            continue
        candidates = [search.candidate_ids[c] for c in q.candidates]
        gold = set(supporting(by_item[record.item_id]))
        with torch.no_grad():
            answer_lp = policy.answer_logprobs(q.context_ids, q.answer_ids).float()
        dists = {
            "student": q.log_prior.exp(),
            "teacher": q_target(answer_lp, args.beta_q),
            "posterior": q_target(answer_lp, args.beta_q, q.log_prior),
        }
        is_gold = torch.tensor([c in gold for c in candidates])
        out.append({
            "item": record.item_id, "candidates": candidates, "gold": is_gold.tolist(),
            "holds_answer": holds_answer(candidates, by_item[record.item_id]["golden_answers"], docs),
            "yes_no": label_answer(by_item[record.item_id]["golden_answers"]),
            "answer_logprobs": answer_lp.tolist(), "log_prior": q.log_prior.tolist(),
            **{f"mass/{k}": float(v[is_gold].sum()) for k, v in dists.items()},
            **{f"top_gold/{k}": bool(is_gold[int(v.argmax())]) for k, v in dists.items()},
        })  # fmt: skip
    return out


def holds_answer(candidates: list[str], golden_answers: list[str], docs: dict[str, tuple[str, str]]) -> list[bool]:
    """Per candidate: does its title or text hold a gold alias? A multi-hop question's bridge passage is gold
    (supporting) without holding y*, and a non-supporting passage may hold it: the teacher scores y*, so this is
    what it can know."""
    return [contains_gold(golden_answers, " ".join(docs.get(c, ("", "")))) for c in candidates]


def answer_view(scored: list[dict], beta_q: float) -> dict:
    """The three distributions judged by the answer-bearing candidates instead of the supporting ones, on the
    questions where some candidates hold y* and some do not."""
    informative = [s for s in scored if 0 < sum(s["holds_answer"]) < len(s["holds_answer"])]
    view: dict = {"informative": len(informative)}
    if not informative:
        return view
    masses: dict[str, list[float]] = {}
    for name in DISTRIBUTIONS:
        masses[name] = []
        top = []
        for s in informative:
            dist = distribution(s, name, beta_q)
            holds = torch.tensor(s["holds_answer"])
            masses[name].append(float(dist[holds].sum()))
            top.append(bool(holds[int(dist.argmax())]))
        interval = bootstrap_questions([[m] for m in masses[name]])
        view[name] = {"answer_mass": interval.value, "ci95": [interval.low, interval.high],
                      "top_holds_answer": float(np.mean(top))}  # fmt: skip
    for name in ("teacher", "posterior"):
        test = sign_test(masses["student"], masses[name])
        view[name]["vs_student"] = {"more": test.better, "less": test.worse, "p": test.p}
    return view


EVIDENCE_CASES = ("supporting_holds_answer", "only_other_holds_answer", "yes_no_answer", "no_candidate_holds_answer")


def evidence_case(s: dict) -> str:
    """Where y* is written among a question's candidates: the teacher scores y*, so it can single out a supporting
    passage by reading where one of them holds it (or, for a yes/no answer, where one makes it likelier); where
    none does (a bridge passage, the answer's passage not retrieved) it can only guess."""
    pairs = list(zip(s["gold"], s["holds_answer"], strict=True))
    if any(gold and holds for gold, holds in pairs):
        return EVIDENCE_CASES[0]
    if any(holds for _, holds in pairs):
        return EVIDENCE_CASES[1]
    return EVIDENCE_CASES[2] if s.get("yes_no") else EVIDENCE_CASES[3]


def evidence_view(informative: list[dict]) -> dict:
    """How often each distribution's top candidate is supporting, split by `evidence_case`, beside chance (a
    uniform pick: the supporting share of the candidates), and the ceiling of a y*-scored teacher that reads
    perfectly: top-gold wherever a supporting candidate holds y* or the answer is yes/no, and elsewhere chance or this
    teacher's own top."""
    view: dict = {}
    for case in EVIDENCE_CASES:
        rows = [s for s in informative if evidence_case(s) == case]
        view[case] = {"questions": len(rows)}
        if rows:
            view[case]["chance"] = float(np.mean([sum(s["gold"]) / len(s["gold"]) for s in rows]))
            view[case].update({name: float(np.mean([s[f"top_gold/{name}"] for s in rows])) for name in DISTRIBUTIONS})
            test = sign_test([s["mass/student"] for s in rows], [s["mass/posterior"] for s in rows])
            view[case]["posterior_vs_student"] = {"more_gold": test.better, "less_gold": test.worse, "p": test.p}
    reads = [evidence_case(s) in (EVIDENCE_CASES[0], EVIDENCE_CASES[2]) for s in informative]
    view["perfect_reader_top_is_gold"] = float(
        np.mean([1.0 if r else sum(s["gold"]) / len(s["gold"]) for r, s in zip(reads, informative, strict=True)])
    )
    view["perfect_reader_else_teacher"] = float(
        np.mean([1.0 if r else float(s["top_gold/teacher"]) for r, s in zip(reads, informative, strict=True)])
    )
    return view


def update_view(scored: list[dict], beta_q: float) -> dict:
    """What the posterior target asks of the retriever, by where y* is written: how far it is from the student
    (total variation: 0 is no gradient) and whether it moves mass to the supporting passages and to the passages
    that hold y* (per question, posterior minus student, a sign test). A case whose update is large but moves
    neither mass is noise the lower level should skip."""
    view: dict = {}
    for case in EVIDENCE_CASES:
        rows = [s for s in scored if evidence_case(s) == case]
        view[case] = {"questions": len(rows)}
        if not rows:
            continue
        student = [distribution(s, "student", beta_q) for s in rows]
        posterior = [distribution(s, "posterior", beta_q) for s in rows]
        distance = [0.5 * float((q - p).abs().sum()) for p, q in zip(student, posterior, strict=True)]
        view[case]["total_variation"] = float(np.mean(distance))
        for key, flag in (("gold", "gold"), ("answer", "holds_answer")):
            before = [float(p[torch.tensor(s[flag])].sum()) for p, s in zip(student, rows, strict=True)]
            after = [float(q[torch.tensor(s[flag])].sum()) for q, s in zip(posterior, rows, strict=True)]
            test = sign_test(before, after)
            view[case][f"{key}_mass_change"] = {"mean": float(np.mean(after) - np.mean(before)), "more": test.better,
                                                "less": test.worse, "p": test.p}  # fmt: skip
    return view


def distribution(s: dict, name: str, beta_q: float) -> torch.Tensor:
    """One of the three distributions over a question's candidates, from its stored log-probs (no forward)."""
    log_prior, answer_lp = torch.tensor(s["log_prior"]), torch.tensor(s["answer_logprobs"])
    if name == "student":
        return log_prior.exp()
    return q_target(answer_lp, beta_q, log_prior if name == "posterior" else None)


def rescore(path: Path, qa_dir: Path, datasets: list[str], corpus_dir: Path) -> tuple[dict, list[dict]]:
    """A stored results.json (scored before `holds_answer` was recorded) with the answer-bearing flags added."""
    stored = json.loads(path.read_text())
    answers = {str(row["id"]): row["golden_answers"] for d in datasets for _, row in training_rows(qa_dir, d)}
    docs = load_corpora(corpus_dir)
    for s in stored["questions"]:
        s["holds_answer"] = holds_answer(s["candidates"], answers[s["item"]], docs)
        s["yes_no"] = label_answer(answers[s["item"]])
    return stored, stored["questions"]


def summarise(scored: list[dict], beta_q: float = 1.0) -> dict:
    informative = [s for s in scored if 0 < sum(s["gold"]) < len(s["gold"])]
    summary = {"questions": len(scored), "informative": len(informative),
               "no_gold_in_candidates": sum(1 for s in scored if not any(s["gold"])),
               "all_gold": sum(1 for s in scored if all(s["gold"]))}  # fmt: skip
    if not informative:
        return summary
    for name in DISTRIBUTIONS:
        mass = [s[f"mass/{name}"] for s in informative]
        interval = bootstrap_questions([[m] for m in mass])
        summary[name] = {"gold_mass": interval.value, "ci95": [interval.low, interval.high],
                         "top_is_gold": float(np.mean([s[f"top_gold/{name}"] for s in informative]))}  # fmt: skip
    student = [s["mass/student"] for s in informative]
    for name in ("teacher", "posterior"):
        test = sign_test(student, [s[f"mass/{name}"] for s in informative])
        summary[name]["vs_student"] = {"more_gold": test.better, "less_gold": test.worse, "p": test.p}
    gaps = [np.mean([lp for lp, g in zip(s["answer_logprobs"], s["gold"], strict=True) if g])
            - np.mean([lp for lp, g in zip(s["answer_logprobs"], s["gold"], strict=True) if not g])
            for s in informative]  # fmt: skip
    summary["answer_logprob_gap_gold_minus_other"] = float(np.mean(gaps))
    summary["posterior_by_beta_q"] = {str(beta): posterior_gold_mass(informative, beta) for beta in BETA_GRID}
    if all("holds_answer" in s for s in scored):
        summary["answer_bearing"] = answer_view(scored, beta_q)
        summary["by_evidence"] = evidence_view(informative)
        summary["update_by_evidence"] = update_view(scored, beta_q)
    return summary


def posterior_gold_mass(informative: list[dict], beta_q: float) -> float:
    """Mean gold mass of the posterior at another beta_Q, from the stored log-probs (no forward): how strongly the
    policy's evidence may re-weight the retriever before it stops helping, chosen on training questions."""
    return float(
        np.mean([float(distribution(s, "posterior", beta_q)[torch.tensor(s["gold"])].sum()) for s in informative])
    )


def table_rows(stats: dict, mass: str, top: str, versus_keys: tuple[str, str]) -> list[str]:
    """One markdown row per distribution: its mass (95 % CI), how often its top candidate counts, and the per-question
    sign test against the student."""
    rows = []
    for name in DISTRIBUTIONS:
        s = stats[name]
        versus = s.get("vs_student")
        more, less = versus_keys
        cell = f"+{versus[more]}/−{versus[less]}, p {versus['p']:.2g}" if versus else "—"
        rows.append(f"| {name} | {s[mass]:.3f} ({s['ci95'][0]:.3f}–{s['ci95'][1]:.3f}) | {s[top]:.3f} | {cell} |")
    return rows


def report(summary: dict, args, elapsed: float) -> str:
    lines = [f"# Teacher quality ({elapsed / 60:.1f} min wall)", "", f"`{args.command}`", "",
             f"{summary['questions']} training-pool questions of {', '.join(args.train_datasets)}; "
             f"{summary['informative']} informative (a gold passage and a non-gold one among the "
             f"{args.q_candidates} candidates; {summary['no_gold_in_candidates']} had no gold, {summary['all_gold']} "
             f"only gold). beta_Q {args.beta_q}, retrieval temperature {args.retrieval_temperature}.", ""]  # fmt: skip
    if summary["informative"]:
        lines += ["| distribution | gold mass (95 % CI) | top candidate is gold | vs student (more/less, p) |",
                  "|---|---|---|---|"]  # fmt: skip
        lines += table_rows(summary, "gold_mass", "top_is_gold", ("more_gold", "less_gold"))
        lines += ["", f"mean log pi(y* | x, gold) − log pi(y* | x, other): "
                      f"{summary['answer_logprob_gap_gold_minus_other']:+.3f} nats", "",
                  "posterior gold mass by beta_Q (student: "
                  f"{summary['student']['gold_mass']:.3f}): "
                  + ", ".join(f"{b}: {m:.3f}" for b, m in summary["posterior_by_beta_q"].items())]  # fmt: skip
    view = summary.get("answer_bearing")
    if view and view["informative"]:
        lines += ["", f"Judged by the candidates that hold y* (a gold alias in the title or text) instead of the "
                      f"supporting ones: {view['informative']} questions have some that do and some that do not.", "",
                  "| distribution | mass on answer-bearing candidates (95 % CI) | top candidate holds y* | "
                  "vs student (more/less, p) |", "|---|---|---|---|"]  # fmt: skip
        lines += table_rows(view, "answer_mass", "top_holds_answer", ("more", "less"))
    by_evidence = summary.get("by_evidence")
    if by_evidence:
        lines += ["", "Top candidate is supporting, by where y* is written among the candidates (chance: a uniform "
                      "pick), and the posterior's gold mass against the student's:", "",
                  "| candidates | questions | chance | student | teacher | posterior | posterior vs student |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for case in EVIDENCE_CASES:
            row = by_evidence[case]
            cells = [f"{row[k]:.3f}" for k in ("chance", *DISTRIBUTIONS)] if row["questions"] else ["—"] * 4
            versus = row.get("posterior_vs_student")
            cells.append(f"+{versus['more_gold']}/−{versus['less_gold']}, p {versus['p']:.2g}" if versus else "—")
            lines.append(f"| {case.replace('_', ' ')} | {row['questions']} | " + " | ".join(cells) + " |")
        lines += ["", "A teacher that reads perfectly (top-gold wherever a supporting candidate holds y* or the "
                      f"answer is yes/no, chance elsewhere) would have its top candidate supporting for "
                      f"{by_evidence['perfect_reader_top_is_gold']:.3f} (with this teacher's own top elsewhere: "
                      f"{by_evidence['perfect_reader_else_teacher']:.3f})."]  # fmt: skip
    updates = summary.get("update_by_evidence")
    if updates:
        lines += ["", "What the posterior target asks of the retriever, by where y* is written among the candidates "
                      "(all scored questions): its distance from the student (total variation; 0 is no gradient) and "
                      "the per-question change of the mass on supporting and on y*-holding candidates:", "",
                  "| candidates | questions | total variation | supporting mass change (+/−, p) | "
                  "y*-holding mass change (+/−, p) |", "|---|---|---|---|---|"]  # fmt: skip
        for case in EVIDENCE_CASES:
            row = updates[case]
            if not row["questions"]:
                lines.append(f"| {case.replace('_', ' ')} | 0 | — | — | — |")
                continue
            cells = [f"{row[k]['mean']:+.3f} (+{row[k]['more']}/−{row[k]['less']}, p {row[k]['p']:.2g})"
                     for k in ("gold_mass_change", "answer_mass_change")]  # fmt: skip
            lines.append(
                f"| {case.replace('_', ' ')} | {row['questions']} | {row['total_variation']:.3f} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qa-dir", type=Path, required=True)
    parser.add_argument("--corpus-dir", type=Path, required=True)
    parser.add_argument("--train-datasets", type=lambda s: s.split(","), default=["2wikimultihopqa", "hotpotqa"])
    parser.add_argument("--questions", type=int, default=96, help="Training-pool questions scored.")
    parser.add_argument("--batch", type=int, default=8, help="Questions scored per policy batch (even).")
    parser.add_argument("--candidates", type=int, default=20, help="M: candidates of the search.")
    parser.add_argument("--q-candidates", type=int, default=5, help="The round's Q candidates (its default).")
    parser.add_argument("--beta-q", type=float, default=1.0)
    parser.add_argument("--adapter", type=Path, help="The policy's LoRA adapter folder (default: the reading adapter).")
    parser.add_argument("--retrieval-temperature", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--held-out-of",
        type=lambda s: [n for n in s.split(",") if n],
        default=[],
        help="Comma-separated shipped adapters (reading, protocol): draw only questions none of them trained on, in "
        "any stage (then --questions is a cap). Each scored question records which shipped adapters trained on it.",
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        help="A stored results.json: add the answer-bearing view from its log-probs (no forward).",
    )
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "lower-level")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "teacher-quality")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    args.command = "python -m experiments.teacher_quality " + shlex.join(sys.argv[1:])
    if args.rescore:
        stored, scored = rescore(args.rescore, args.qa_dir, args.train_datasets, args.corpus_dir)
        summary = summarise(scored, args.beta_q)
        args.command = f"{stored['command']}`; rescored: `{args.command}"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({**stored, "summary": summary}, indent=1))
        text = report(summary, args, stored["wall_s"])
        (args.out / "results.md").write_text(text)
        print(text)
        return
    args.group, args.top_k, args.rollout_temperature = 1, 3, 1.0  # what `rollouts` reads; nothing is generated
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    models, policy = frozen_warm_start(args.work, args.seed, args.adapter)
    retriever = RetrieverModel(models.retriever, None, seed=args.seed)
    docs = load_corpora(args.corpus_dir)
    ids = list(docs)
    doc_vecs = doc_matrix(models.retriever, docs, args.work / "doc_vectors.pt")
    retriever.use_doc_vectors(ids, doc_vecs)
    unknown = [n for n in args.held_out_of if n not in SHIPPED_ADAPTERS]
    if unknown:
        raise SystemExit(f"--held-out-of {unknown[0]!r}: shipped adapters are {', '.join(SHIPPED_ADAPTERS)}")
    by_adapter = {name: shipped_trained_ids([name]) for name in SHIPPED_ADAPTERS}
    exclude: dict[str, set[str]] = {}
    for name in args.held_out_of:
        for dataset, ids in by_adapter[name].items():
            exclude.setdefault(dataset, set()).update(ids)
    questions = train_questions(args.qa_dir, args.train_datasets, args.questions, args.seed, exclude=exclude)
    dataset_of = {str(q["id"]): q["dataset"] for q in questions}
    scored = []
    for b in tqdm(range(0, len(questions), args.batch), desc="Q_theta", unit="batch"):
        rng = np.random.default_rng(args.seed * 1_000_003 + b)
        scored += score_batch(policy, retriever, doc_vecs, ids, docs, questions[b : b + args.batch], args, rng)
    for s in scored:
        s["dataset"] = dataset_of[s["item"]]
        s["trained_by"] = [n for n, seen in by_adapter.items() if s["item"] in seen.get(s["dataset"], ())]
    summary = summarise(scored, args.beta_q)
    elapsed = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"command": args.command, "summary": summary,
                                                       "questions": scored, "wall_s": elapsed}, indent=1))  # fmt: skip
    text = report(summary, args, elapsed)
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
