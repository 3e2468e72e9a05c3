"""Per-step counterfactual capture: what a context policy does to attention and to the next action.

For a chosen step t (the assistant message at index i; default every reasoning step with >= 5
past turns, seed 002 E.5's filter) the *original* context is the recorded prefix ``messages[:i]``
and the *counterfactual* context is ``policy(messages[:i])``. Both are captured with the step's own
message appended (teacher forcing), at two queries: the **decision** position (the last token of
the generation prompt, where step t's action is predicted) and the step's **reasoning start** (its
first token, seed 002 E.2/E.3's query).

Costs: one prefill of the whole original trajectory serves the original rows of every step (causal
attention: later tokens never change an earlier query's row), plus one prefill per (step, policy).
All plans of a batch of steps go to the capture backend in one ``run`` call, so vLLM batches them.

Every token of both contexts is owned by one ORIGINAL message under the seed-002 convention
(:func:`attnprobe.results.analysis.token_owners`: markers belong to the message they delimit, token 0
to the system prompt) and takes that message's original turn; tokens of a placeholder or a refined
observation get role ``placeholder`` / ``refined`` (:data:`CF_ROLES`). From the rows:

- removed mass: the original attention on the tokens of removed, masked (placeholder) or refined
  messages and on dropped tool calls (``calls_removed``); kept + removed = 1;
- redistribution: per destination (original turn x role, and coarse groups), counterfactual mass
  minus the original mass on the kept tokens; it sums to the removed mass (both rows sum to 1);
- optionally the greedy next action in both contexts (parsed with the IBIS parser) and whether it
  changed; the tokens saved.

Output: ``OUT/<trajectory>/<policy>/step_<i>/`` (atomic; ``record.json`` last) with
``record.json``, ``masses.safetensors`` and the two capture results ``original/`` and
``counterfactual/`` in the usual safetensors + JSON layout.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe._version import __version__
from attnprobe.capture.api import CaptureSettings, assemble, check_layers, make_plan, prepare, weights_hash
from attnprobe.capture.models import LoadedModel
from attnprobe.counterfactual.policies import Counterfactual, Policy, policy_name
from attnprobe.errors import AttnprobeError
from attnprobe.io import AtomicDir, load_json, run_resumable, safe_name
from attnprobe.render.rendering import Rendered, message_turns
from attnprobe.render.segments import ROLES, QueryPoint
from attnprobe.results.analysis import token_owners
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory, message_text

log = logging.getLogger(__name__)

CF_ROLES = (*ROLES, "placeholder", "refined")
RI = {r: i for i, r in enumerate(CF_ROLES)}
QUERY_NAMES = ("decision", "reasoning")
GROUPS = ("system", "task", "past_reasoning", "past_tool_call", "past_observation", "placeholder", "refined",
          "current_step")
REMOVING = ("removed", "placeholder", "refined")
RECORD_FILE, MASSES_FILE = "record.json", "masses.safetensors"


# ------------------------------------------------------------------ steps
@dataclass(frozen=True)
class Step:
    """Step t of a trajectory: the assistant message at ``message_index``, in turn ``turn``."""

    trajectory: Trajectory
    message_index: int
    turn: int

    @property
    def key(self) -> str:
        return f"step_{self.message_index:04d}"


def is_reasoning_message(msg: dict) -> bool:
    """Seed 002: a reasoning step is an assistant message with reasoning text (not only tool calls)."""
    return msg["role"] == "assistant" and bool(
        message_text(msg.get("content")).strip() or (msg.get("reasoning_content") or "").strip())


def choose_steps(traj: Trajectory, *, min_past: int = 5, include_actions: bool = False,
                 turns: Sequence[int] | None = None, max_steps: int | None = None) -> list[Step]:
    """Steps with at least ``min_past`` past turns (reasoning steps only unless ``include_actions``),
    or exactly the given ``turns``; at most ``max_steps`` (the first ones)."""
    tt = message_turns(traj.messages)
    out = []
    for i, m in enumerate(traj.messages):
        if m["role"] != "assistant" or i == 0:
            continue
        if not (include_actions or is_reasoning_message(m)):
            continue
        if (tt[i] in turns) if turns is not None else tt[i] >= min_past:
            out.append(Step(traj, i, tt[i]))
    return out[:max_steps] if max_steps is not None else out


# ------------------------------------------------------------------ rendering one context
@dataclass
class Context:
    """One rendered context (prefix + the step's message) and its two query positions."""

    trajectory: Trajectory
    rendered: Rendered
    points: list[QueryPoint]  # [decision, reasoning start]
    decision_exact: bool  # the prefix's own rendering is a token prefix of this one
    prefix_tokens: int  # tokens the model reads before generating step t


def build_context(model: LoadedModel, base: Trajectory, prefix: list[dict], step_msg: dict, tag: str, *,
                  rendering: str, max_tokens: int | None) -> Context:
    """Render ``prefix + [step_msg]`` and find the decision and reasoning-start positions.

    The decision position is the last token of the prefix rendered with the generation prompt; when
    that rendering is not a token prefix of the full one (a template that re-renders history when a
    message follows), the token just before the step's first token is used and ``decision_exact``
    is False."""
    k = len(prefix)
    full = Trajectory(id=f"{base.id}#{tag}", messages=[*prefix, step_msg], task=base.task, model=base.model,
                      framing=base.framing, tools=base.tools, labels=base.labels, meta=base.meta)
    r = prepare(model, full, rendering=rendering, max_tokens=max_tokens)
    starts = [q for q in r.queries_reasoning if q.message_index == k]
    if not starts:
        raise AttnprobeError(f"trajectory {base.id!r}, message {k}: the step message has no reasoning or "
                             f"tool-call tokens to query")
    rs = starts[0]
    pre = prepare(model, replace(full, messages=list(prefix)), rendering=r.rendering, max_tokens=max_tokens)
    n = len(pre.input_ids)
    exact = n <= rs.position and np.array_equal(r.input_ids[:n], pre.input_ids)
    dpos = n - 1 if exact else rs.position - 1
    dec = QueryPoint(int(dpos), "decision", rs.turn, k)
    return Context(full, r, [dec, QueryPoint(rs.position, "reasoning", rs.turn, k)], bool(exact), int(dpos + 1))


# ------------------------------------------------------------------ token ownership and masses
def token_messages(result: CaptureResult) -> np.ndarray:
    """Message index owning every token under the seed-002 convention (-1: the trailing generation
    prompt); :func:`token_owners` run on segments whose turn is their message index."""
    segs = [replace(s, turn=s.message_index) for s in result.segments]
    owner, _ = token_owners(replace(result, segments=segs))
    return owner


def token_labels(result: CaptureResult, source: Sequence[int], step_index: int, statuses: dict[int, str],
                 orig_turns: Sequence[int], *, counterfactual: bool = True) -> dict[str, np.ndarray]:
    """Per token: original message, original turn, role in :data:`CF_ROLES`, and whether it belongs
    to a removed span (its message was removed / masked / refined, or it is a dropped tool call).

    ``source[k]`` is the original index of local message k; a local index past ``source`` (the
    appended step message) or -1 (the generation prompt) maps to ``step_index``. In a counterfactual
    context the tokens of placeholder / refined messages get those roles; in the original they keep
    their own (observation)."""
    local = token_messages(result)
    _, role = token_owners(result)
    src = np.asarray([*source, step_index], dtype=np.int64)
    orig = np.where((local >= 0) & (local < len(src)), src[np.clip(local, 0, len(src) - 1)], step_index)
    turns = np.asarray(orig_turns, dtype=np.int64)[orig]
    status = np.asarray([statuses.get(int(m), "kept") for m in orig], dtype=object)
    role = role.copy()
    if counterfactual:
        role[status == "placeholder"] = RI["placeholder"]
        role[status == "refined"] = RI["refined"]
    removed = np.isin(status, REMOVING) | ((status == "calls_removed") & (role == RI["tool_call"]))
    return {"message": orig, "turn": turns, "role": role, "removed": removed, "status": status}


def turn_role_mass(rows: np.ndarray, turn: np.ndarray, role: np.ndarray, num_turns: int) -> np.ndarray:
    """[nq, T, len(CF_ROLES)] sums of the per-token rows (float64)."""
    keys = turn * len(CF_ROLES) + role
    size = num_turns * len(CF_ROLES)
    out = np.stack([np.bincount(keys, weights=r, minlength=size)[:size] for r in np.asarray(rows, np.float64)])
    return out.reshape(len(rows), num_turns, len(CF_ROLES))


def groups(mass: np.ndarray, turn: int) -> dict[str, float]:
    """Coarse destinations of one [T, R] table for step ``turn`` (seed 002's headline split, plus
    placeholder and refined text)."""
    past = mass[:turn]
    return {
        "system": float(mass[:, RI["system"]].sum()), "task": float(mass[:, RI["task"]].sum()),
        "past_reasoning": float(past[:, RI["reasoning"]].sum()),
        "past_tool_call": float(past[:, RI["tool_call"]].sum()),
        "past_observation": float(past[:, RI["observation"]].sum()),
        "placeholder": float(mass[:, RI["placeholder"]].sum()), "refined": float(mass[:, RI["refined"]].sum()),
        "current_step": float(mass[turn:, [RI["reasoning"], RI["tool_call"], RI["observation"],
                                           RI["template"]]].sum()),
    }


def step_analysis(original: CaptureResult, counterfactual: CaptureResult, cf: Counterfactual, step: Step,
                  orig_turns: Sequence[int]) -> tuple[dict, dict[str, np.ndarray]]:
    """The per-query numbers of one (step, policy): removed mass, redistribution, conservation."""
    T = step.turn + 1
    n_all = len(step.trajectory.messages)
    lo = token_labels(original, list(range(n_all)), step.message_index, cf.changes, orig_turns, counterfactual=False)
    lc = token_labels(counterfactual, cf.source, step.message_index, cf.changes, orig_turns)
    # Tokens after the step belong to later turns; causal attention gives them exactly zero mass.
    ro, rc = np.asarray(original.token_attention, np.float64), np.asarray(counterfactual.token_attention, np.float64)
    to, tc = np.minimum(lo["turn"], T - 1), np.minimum(lc["turn"], T - 1)
    m_orig = turn_role_mass(ro, to, lo["role"], T)
    kept_w = ro * ~lo["removed"][None, :]
    m_kept = turn_role_mass(kept_w, to, lo["role"], T)
    m_cf = turn_role_mass(rc, tc, lc["role"], T)
    obs_removed = lo["removed"] & (lo["role"] == RI["observation"])
    queries = {}
    for q, name in enumerate(QUERY_NAMES):
        removed = float(ro[q][lo["removed"]].sum())
        by_status = {s: float(ro[q][lo["removed"] & (lo["status"] == s)].sum())
                     for s in (*REMOVING, "calls_removed") if np.any(lo["removed"] & (lo["status"] == s))}
        by_msg = {}
        for m in np.unique(lo["message"][lo["removed"]]):
            by_msg[str(int(m))] = float(ro[q][lo["removed"] & (lo["message"] == m)].sum())
        g_orig, g_kept, g_cf = groups(m_orig[q], step.turn), groups(m_kept[q], step.turn), groups(m_cf[q], step.turn)
        queries[name] = {
            "original_total": float(ro[q].sum()), "counterfactual_total": float(rc[q].sum()),
            "removed_mass": removed, "kept_mass": float(kept_w[q].sum()),
            "removed_observation_mass": float(ro[q][obs_removed].sum()),
            "removed_by_status": by_status, "removed_by_message": by_msg,
            "original": g_orig, "original_kept": g_kept, "counterfactual": g_cf,
            "redistribution": {k: g_cf[k] - g_kept[k] for k in GROUPS},
        }
    arrays = {"mass_original": m_orig.astype(np.float32), "mass_original_kept": m_kept.astype(np.float32),
              "mass_counterfactual": m_cf.astype(np.float32),
              "removed_tokens": lo["removed"].astype(np.int8), "counterfactual_roles": lc["role"].astype(np.int8),
              "counterfactual_turns": lc["turn"].astype(np.int64)}
    return queries, arrays


# ------------------------------------------------------------------ next action
def next_action(chat, messages: list[dict], tools, max_tokens: int) -> dict:
    """Greedy next action parsed with the IBIS parser (decision) plus the exact first tool call."""
    from attnprobe.studies.ibis.behaviour import classify_reply

    reply = chat.complete(messages, tools, max_tokens=max_tokens, temperature=0.0)
    prompt_text = reply.prompt.text if reply.prompt is not None else ""
    parsed = classify_reply(reply.raw_text or reply.content, reply.tool_calls, prompt_text)
    call = None
    if reply.tool_calls:
        fn = reply.tool_calls[0]["function"]
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        call = {"name": fn.get("name"), "arguments": args}
    return {"decision": parsed["decision"], "method": parsed["method"], "call": call,
            "text": (reply.raw_text or reply.content)[:2000], "output_tokens": reply.output_tokens}


def actions_chat(model: LoadedModel):
    """The in-process chat that generates next actions with the capture model; refused for a model
    that is not a torch module (a vLLM engine has no in-process generate of ours)."""
    import torch

    from attnprobe.generation.transformers_chat import TransformersChat

    if not isinstance(model.model, torch.nn.Module):
        raise AttnprobeError("--actions generates in process with the capture model: use the transformers backend")
    return TransformersChat(model)


# ------------------------------------------------------------------ the run
@dataclass
class RunOptions:
    rendering: str = "auto"
    max_tokens: int | None = None
    layers: Sequence[int] | None = None
    chunk_size: int | None = None
    actions: bool = False
    max_new_tokens: int = 96
    progress: bool = False


def settings_dict(model: LoadedModel, policy: str, opts: RunOptions) -> dict:
    """What must match for a finished step to be skipped on resume."""
    return json.loads(json.dumps({
        "model": model.spec, "backend": model.backend, "dtype": model.dtype, "policy": policy,
        "rendering": opts.rendering, "layers": None if opts.layers is None else list(opts.layers),
        "chunk_size": opts.chunk_size or model.default_chunk_size, "actions": opts.actions,
        "max_new_tokens": opts.max_new_tokens if opts.actions else None,
    }))


def step_dir(out: Path, step: Step, policy: str) -> Path:
    return Path(out) / safe_name(step.trajectory.id) / safe_name(policy) / step.key


def step_done(out: Path, step: Step, policy: str, settings: dict) -> bool:
    path = step_dir(out, step, policy) / RECORD_FILE
    if not path.is_file():
        return False
    try:
        record = load_json(path)
    except AttnprobeError:  # unreadable (torn, not UTF-8, too large): redo the step
        return False
    return isinstance(record, dict) and record.get("settings") == settings


def _slice(full: CaptureResult, idx: Sequence[int], points: list[QueryPoint]) -> CaptureResult:
    idx = list(idx)
    return replace(full, queries=points, segment_attention=full.segment_attention[idx],
                   layer_head_attention=full.layer_head_attention[idx], token_attention=full.token_attention[idx],
                   meta=dict(full.meta))


def run_batch(model: LoadedModel, steps: Sequence[Step], policies: Sequence[Policy], out: Path, opts: RunOptions,
              chat=None) -> None:
    """Capture every (step, policy) of ``steps`` not yet done, writing one folder each."""
    from attnprobe_hooks.backend import get_backend

    names = [policy_name(p) for p in policies]
    settings = {n: settings_dict(model, n, opts) for n in names}
    todo = [(s, p, n) for s in steps for p, n in zip(policies, names) if not step_done(out, s, n, settings[n])]
    if not todo:
        return
    by_traj: dict[str, list[Step]] = {}
    for s, _, _ in todo:
        if s not in by_traj.setdefault(s.trajectory.id, []):
            by_traj[s.trajectory.id].append(s)
    # Original contexts: one capture of each trajectory, up to the end of its latest step in this batch,
    # at the decision and reasoning start of every step (each checked to be a token prefix of it).
    contexts: list[Context] = []
    orig_slot: dict[tuple[str, int], tuple[int, list[int], list[QueryPoint], Context]] = {}
    for tid, ss in by_traj.items():
        traj = ss[0].trajectory
        ss = sorted(ss, key=lambda s: s.message_index)
        per = [(s, build_context(model, traj, traj.messages[: s.message_index], traj.messages[s.message_index],
                                 f"{s.key}:original", rendering=opts.rendering, max_tokens=opts.max_tokens))
               for s in ss]
        whole = per[-1][1].rendered
        pts: list[QueryPoint] = []
        for s, c in per:
            n = len(c.rendered.input_ids)
            if c.rendered.rendering != whole.rendering or not np.array_equal(whole.input_ids[:n], c.rendered.input_ids):
                raise AttnprobeError(f"trajectory {tid!r}: the rendering up to message {s.message_index} is not a "
                                     f"prefix of the rendering of later messages (the chat template re-renders "
                                     f"history); this template is not supported for counterfactuals")
            pts += c.points
        order = sorted(range(len(pts)), key=lambda j: pts[j].position)
        uniq: list[QueryPoint] = []
        where = {}
        for j in order:
            if not uniq or uniq[-1].position != pts[j].position:
                uniq.append(pts[j])
            where[j] = len(uniq) - 1
        ci = len(contexts)
        contexts.append(replace(per[-1][1], points=uniq))
        for k, (s, c) in enumerate(per):
            orig_slot[(tid, s.message_index)] = (ci, [where[2 * k], where[2 * k + 1]], c.points, c)
    # Counterfactual contexts.
    cf_slot: dict[tuple[str, int, str], tuple[int, Counterfactual]] = {}
    for s, p, n in todo:
        traj = s.trajectory
        cfx = p(traj.messages[: s.message_index])
        rendering = contexts[orig_slot[(traj.id, s.message_index)][0]].rendered.rendering
        c = build_context(model, traj, cfx.messages, traj.messages[s.message_index], f"{s.key}:{n}",
                          rendering=rendering if opts.rendering == "auto" else opts.rendering,
                          max_tokens=opts.max_tokens)
        cf_slot[(traj.id, s.message_index, n)] = (len(contexts), cfx)
        contexts.append(c)
    chosen = check_layers(model, opts.layers)
    chunk = opts.chunk_size or model.default_chunk_size
    plans = [make_plan(c.rendered, c.points, chosen, desc=c.trajectory.id) for c in contexts]
    t0 = time.perf_counter()
    outputs = get_backend(model.backend).run(model, plans, chunk_size=chunk, progress=opts.progress)
    cs = CaptureSettings(queries="positions", layers=chosen, chunk_size=chunk,
                         seconds=(time.perf_counter() - t0) / max(1, len(plans)), weights_hash=weights_hash(model.spec))
    results = [assemble(model, c.trajectory, c.rendered, c.points, o, cs) for c, o in zip(contexts, outputs)]
    actions_orig: dict[tuple[str, int], dict] = {}
    for s, _p, n in todo:
        traj = s.trajectory
        ci, rows, points, oc = orig_slot[(traj.id, s.message_index)]
        original = _slice(results[ci], rows, points)
        k, cfx = cf_slot[(traj.id, s.message_index, n)]
        cres, cctx = results[k], contexts[k]
        queries, arrays = step_analysis(original, cres, cfx, s, message_turns(traj.messages))
        record: dict[str, Any] = {
            "trajectory_id": traj.id, "policy": n, "step_message_index": s.message_index, "turn": s.turn,
            "changes": {str(i): v for i, v in sorted(cfx.changes.items())}, "source": cfx.source,
            "changed": cfx.changed, "roles": list(CF_ROLES), "groups": list(GROUPS),
            "tokens": {"original": oc.prefix_tokens, "counterfactual": cctx.prefix_tokens,
                       "saved": oc.prefix_tokens - cctx.prefix_tokens,
                       "saved_share": (oc.prefix_tokens - cctx.prefix_tokens) / oc.prefix_tokens},
            "decision_exact": {"original": oc.decision_exact, "counterfactual": cctx.decision_exact},
            "queries": queries, "settings": settings[n], "attnprobe_version": __version__,
            "rendering": {"original": oc.rendered.rendering, "counterfactual": cctx.rendered.rendering},
        }
        if opts.actions and chat is not None:
            key = (traj.id, s.message_index)
            if key not in actions_orig:
                actions_orig[key] = next_action(chat, traj.messages[: s.message_index], traj.tools,
                                                opts.max_new_tokens)
            a_o = actions_orig[key]
            a_c = next_action(chat, cfx.messages, traj.tools, opts.max_new_tokens)
            record["action"] = {"original": a_o, "counterfactual": a_c,
                                "changed": a_o["decision"] != a_c["decision"],
                                "call_changed": a_o["call"] != a_c["call"]}
        write_step(step_dir(out, s, n), record, arrays, original, cres)


def write_step(directory: Path, record: dict, arrays: dict[str, np.ndarray], original: CaptureResult,
               counterfactual: CaptureResult) -> None:
    from safetensors.numpy import save_file

    with AtomicDir(directory) as tmp:
        original.save(tmp / "original")
        counterfactual.save(tmp / "counterfactual")
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp / MASSES_FILE))
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")


def plan_steps(trajectories: Sequence[Trajectory], policies: Sequence, *, min_past: int = 5,
               include_actions: bool = False, turns: Sequence[int] | None = None,
               max_steps: int | None = None) -> tuple[list[str], list[Step]]:
    """(policy names, chosen steps) of a run; refuses no policy, duplicate names and no step at all.
    ``policies``: policy objects or specs (``"mask:5"``)."""
    from attnprobe.counterfactual.policies import parse_policy

    if not policies:
        raise ValueError("no policy given")
    names = [policy_name(parse_policy(p) if isinstance(p, str) else p) for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be distinct: {names}")
    steps = [s for t in trajectories for s in choose_steps(t, min_past=min_past, include_actions=include_actions,
                                                           turns=turns, max_steps=max_steps)]
    if not steps:
        what = f"turns {list(turns)}" if turns is not None else f"reasoning steps with >= {min_past} past turns"
        raise AttnprobeError(f"no step qualifies ({what}); lower --min-past or pick --turns")
    return names, steps


def clear_steps(out: Path, steps: Sequence[Step], names: Sequence[str]) -> None:
    """--force: remove the step folders of these steps and policies."""
    import shutil

    for s in steps:
        for n in names:
            shutil.rmtree(step_dir(out, s, n), ignore_errors=True)


def run_counterfactuals(model: LoadedModel, trajectories: Sequence[Trajectory], policies: Sequence[Policy],
                        out: str | Path, *, opts: RunOptions | None = None, chat=None, min_past: int = 5,
                        include_actions: bool = False, turns: Sequence[int] | None = None,
                        max_steps: int | None = None, batch_size: int = 1, force: bool = False) -> dict[str, int]:
    """Run every policy at every chosen step of every trajectory into ``out`` (resumable: finished
    (step, policy) folders with the same settings are skipped; failures go to ``out/errors.jsonl``).

    ``batch_size`` steps share one backend call (vLLM batches their prefills). ``chat``: a chat
    backend for the next action (``opts.actions``)."""
    opts = opts or RunOptions()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names, steps = plan_steps(trajectories, policies, min_past=min_past, include_actions=include_actions,
                              turns=turns, max_steps=max_steps)
    settings = {n: settings_dict(model, n, opts) for n in names}
    if force:
        clear_steps(out, steps, names)

    def done(s: Step) -> bool:
        return all(step_done(out, s, n, settings[n]) for n in names)

    return run_resumable(steps, lambda batch: run_batch(model, batch, policies, out, opts, chat), done=done,
                         describe=lambda s: {"trajectory_id": s.trajectory.id, "step": s.message_index},
                         errors_path=out / "errors.jsonl", stage="counterfactual", desc="counterfactual",
                         unit="step", batch_size=batch_size, progress=opts.progress)


# ------------------------------------------------------------------ reading back
def reanalyse_step(directory: str | Path, trajectory: Trajectory) -> dict:
    """Recompute a step folder's numbers from its stored captures (no model): after a change to the
    analysis, or to check a folder. Rewrites ``record.json`` and ``masses.safetensors``."""
    from safetensors.numpy import save_file

    from attnprobe.io import atomic_write_text

    directory = Path(directory)
    record, _ = load_step(directory)
    original = CaptureResult.load(directory / "original")
    counterfactual = CaptureResult.load(directory / "counterfactual")
    i = int(record["step_message_index"])
    cfx = Counterfactual([], list(record["source"]), {int(k): v for k, v in record["changes"].items()}, record["policy"])
    step = Step(trajectory, i, int(record["turn"]))
    queries, arrays = step_analysis(original, counterfactual, cfx, step, message_turns(trajectory.messages))
    record["queries"] = queries
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(directory / MASSES_FILE))
    atomic_write_text(directory / RECORD_FILE, json.dumps(record, indent=1, ensure_ascii=False))
    return record


def load_step(directory: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(record, arrays) of one finished step folder."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    path = directory / RECORD_FILE
    if not path.is_file():
        raise AttnprobeError(f"{directory}: not a counterfactual step (no {RECORD_FILE})")
    return load_json(path), load_file(str(directory / MASSES_FILE))


def iter_records(root: str | Path):
    """Every finished step record under ``root`` (``<trajectory>/<policy>/step_*/record.json``)."""
    for path in sorted(Path(root).glob(f"*/*/step_*/{RECORD_FILE}")):
        yield load_json(path)
