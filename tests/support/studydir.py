"""A hand-built ``attnprobe study interference`` folder with known numbers, for the Study page tests.

Two settings on two questions, written with the study's own pieces (``summarize`` for study.json,
``StudyLayout`` for the folders, ``CaptureResult.save`` for the one capture), so the files have the real
format while every number is known:

- ``none`` (baseline): q1 right (tool calls 1, retrievals 1), q2 no answer (tool calls 3, retrievals 3);
- ``mask:1+refine:bm25``: q1 and q2 right (tool calls 1 and 1) -> fixes q2, breaks nothing;
- q1 under ``mask:1+refine:bm25``: three recorded calls (written out of order in the file); step 3
  masks history message 3 (placeholder) and shows message 5 refined; step 3 has a capture, step 1 a
  capture folder of another trajectory, step 2 none. In step 3's capture message 3 (turn 0's observation)
  is the placeholder and message 5 (turn 1's observation) the refined text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnprobe.io import finite_json, safe_name
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.layout import StudyLayout
from attnprobe.studies.loop.metrics import summarize

BASE, OTHER = "none", "mask:1+refine:bm25"
N = 12  # capture tokens


def _result(qid: str, setting: str, correct: bool, answer, calls: int) -> dict:
    return {"question_id": qid, "question": f"question {qid}?", "type": "single", "setting": setting,
            "answer": answer, "no_answer": answer is None, "correct": correct, "retrievals": calls,
            "tool_calls": calls, "model_calls": calls + 1, "refiner_calls": 0, "input_tokens": 100 * (calls + 1),
            "output_tokens": 10 * (calls + 1), "context_tokens": 50.0, "context_chars": 200.0, "seconds": 1.5}


def call_id(setting: str, qid: str, step: int) -> str:
    from attnprobe.studies.loop.context import slug

    return f"{slug(setting)}/{qid}/step-{step}"


def _call(setting: str, qid: str, step: int, n_hist: int, source: list[int], changes: dict, refined: list[int],
          reply: dict) -> dict:
    sent = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"question {qid}?"}]
    sent += [{"role": "assistant", "content": f"m{i}"} for i in source[2:]]
    return {"id": call_id(setting, qid, step), "task": f"question {qid}?", "model": "toy-model", "framing": "trace",
            "messages": sent + [reply], "labels": {},
            "meta": {"runner": "loop-seed002", "setting": setting, "question_id": qid, "step": step,
                     "history": {"id": f"{qid}/history", "messages": n_hist, "source": source,
                                 "changes": changes, "refined": refined},
                     "usage": {"input_tokens": 40 * step, "output_tokens": 5}}}


def toy_capture(trajectory_id: str, history: dict | None = None) -> CaptureResult:
    """3 turns over 12 tokens; query t attends with weight k+1 to token k <= its position (normalised).
    ``history``: the call's ``meta.history`` (kept in ``trajectory_meta`` as a capture of a call keeps it)."""
    text = "".join(f"t{i:02d} " for i in range(N))
    seg = [("system", "external", 0, 0, 0, 2), ("task", "external", 0, 1, 2, 4), ("reasoning", "self", 0, 2, 4, 6),
           ("observation", "external", 0, 3, 6, 8), ("reasoning", "self", 1, 4, 8, 10),
           ("observation", "external", 1, 5, 10, 11), ("reasoning", "self", 2, 6, 11, 12)]
    segments = [Segment(role=r, author=a, turn=t, message_index=m, start=s, end=e) for r, a, t, m, s, e in seg]
    queries = [QueryPoint(position=p, kind="reasoning", turn=t, message_index=m)
               for p, t, m in ((4, 0, 2), (8, 1, 4), (11, 2, 6))]
    tok = np.zeros((3, N), dtype=np.float32)
    for qi, q in enumerate(queries):
        w = np.arange(1, q.position + 2, dtype=np.float32)
        tok[qi, : q.position + 1] = w / w.sum()
    seg_att = np.stack([tok[:, s.start:s.end].sum(1) for s in segments], axis=1)
    lh = np.broadcast_to(seg_att[:, None, None, :], (3, 2, 2, len(segments))).copy()
    return CaptureResult(trajectory_id=trajectory_id, input_ids=np.arange(100, 100 + N), segments=segments,
                         queries=queries, layers=[0, 1], segment_attention=seg_att, layer_head_attention=lh,
                         token_attention=tok, meta={"model": "toy-model", "dtype": "float32",
                                                       **({"trajectory_meta": {"history": history}} if history else {})},
                         text=text,
                         offsets=np.array([[4 * i, 4 * i + 4] for i in range(N)]))


def make_study(out: Path) -> Path:
    results = {BASE: [_result("q1", BASE, True, "Paris", 1), _result("q2", BASE, False, None, 3)],
               OTHER: [_result("q1", OTHER, True, "Paris", 1), _result("q2", OTHER, True, "Rome", 1)]}
    summary = summarize(results, BASE, n_boot=2000, seed=0)
    study = {"config": {"scaffold": "seed002"}, "settings": [BASE, OTHER], "models": ["toy-model"], "scorer": "em",
             "questions_total": 2, **summary,
             "results": {s: {r["question_id"]: f"stamp-{r['question_id']}" for r in rs} for s, rs in results.items()}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.json").write_text(json.dumps(finite_json(study), indent=1))
    search = {"role": "assistant", "content": "",
              "tool_calls": [{"id": "call1", "type": "function",
                              "function": {"name": "search", "arguments": '{"query": "capital"}'}}]}
    final = {"role": "assistant", "content": "Exact Answer: Paris"}
    calls = [_call(OTHER, "q1", 2, 4, [0, 1, 2, 3], {}, [], search),
             _call(OTHER, "q1", 1, 2, [0, 1], {}, [], search),
             _call(OTHER, "q1", 3, 6, [0, 1, 2, 3, 4, 5], {"3": "placeholder"}, [5], final)]
    base_calls = [_call(BASE, "q1", 1, 2, [0, 1], {}, [], search), _call(BASE, "q1", 2, 4, [0, 1, 2, 3], {}, [], final)]
    for setting, recs in ((OTHER, calls), (BASE, base_calls)):
        folder = StudyLayout(out).setting_dir(setting)
        (folder / "calls").mkdir(parents=True)
        (folder / "calls" / "q1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cap = StudyLayout(out).setting_dir(OTHER) / "capture"
    toy_capture(call_id(OTHER, "q1", 3), calls[2]["meta"]["history"]).save(cap / safe_name(call_id(OTHER, "q1", 3)))
    toy_capture("someone-else").save(cap / safe_name(call_id(OTHER, "q1", 1)))
    return out
