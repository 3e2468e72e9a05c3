"""Per-step counterfactual capture: what a context policy does to attention and to the next action.

For a chosen step t (the assistant message at index i; default every reasoning step with >= 5
past turns, seed 002 E.5's filter) the *original* context is the recorded prefix ``messages[:i]``
and the *counterfactual* context is ``policy(messages[:i])`` (on tag text, the policy acts on the rounds the
text holds and the result is tag text again: :func:`attnprobe.agents.tagtext.apply_policy`). Both are captured with the step's own
message appended (teacher forcing), at two queries: the **decision** position (the last token of
the generation prompt, where step t's action is predicted) and the step's **reasoning start** (its
first token, seed 002 E.2/E.3's query).

Costs: one capture of the original trajectory serves the original rows of every step (causal
attention: later tokens never change an earlier query's row), plus one plan per (step, policy). All
plans of a batch (every step of a trajectory: :mod:`~attnprobe.counterfactual.job`) go to the capture
backend in one ``run`` call, which prefills each unique token once (transformers) or batches them
(vLLM). With ``actions`` on transformers, each next action continues greedily from the cache the
capture built (:func:`cache_requests`): 1 token prefilled per generation instead of the prompt.

The rows are analysed in :mod:`~attnprobe.counterfactual.analysis`:

- removed mass: the original attention on the tokens absent from the counterfactual context;
- mass on changed messages: the original attention on the tokens of removed, masked (placeholder) or
  refined messages and on dropped tool calls (``calls_removed``), markers and kept text included;
  kept + changed = 1;
- redistribution: per destination (original turn x role, and coarse groups), counterfactual mass
  minus the original mass on the kept tokens; it sums to the mass on changed messages (both rows sum to 1);
- optionally the greedy next action in both contexts (parsed with the IBIS parser) and whether it
  changed; the tokens saved.

Output: one folder per (step, policy), :mod:`~attnprobe.counterfactual.store`. The run itself is a
job (:mod:`~attnprobe.counterfactual.job`) that any executor runs."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe._version import __version__
from attnprobe.agents.policies import Counterfactual, Policy, policy_name
from attnprobe.agents.tagtext import apply_policy
from attnprobe.capture.api import Prepared, check_layers, run_prepared, weights_hash
from attnprobe.capture.job import CaptureOptions
from attnprobe.capture.models import LoadedModel
from attnprobe.counterfactual.actions import classify_action, tool_vocabulary
from attnprobe.counterfactual.analysis import CF_ROLES, GROUPS, step_analysis
from attnprobe.counterfactual.contexts import Context, build_context
from attnprobe.counterfactual.extras import extra_fields
from attnprobe.counterfactual.steps import Step
from attnprobe.counterfactual.store import step_dir, step_done, write_step
from attnprobe.errors import AttnprobeError
from attnprobe.io.options import option, positive_int, same_as
from attnprobe.render.rendering import message_turns
from attnprobe.render.segments import QueryPoint
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory, call_arguments

log = logging.getLogger(__name__)

# What a step's numbers mean, in its resume settings: 2 = refiners per round (seed 004 §3.3), errors
# exempt from masking windows, actions named by the trajectory's own tools. Folders of 1 are redone.
SEMANTICS = 2


# ------------------------------------------------------------------ next action
def next_action(chat, messages: list[dict], tools, max_new_tokens: int, vocabulary: Sequence[str],
                reply=None, prefilled: int | None = None) -> dict:
    """Greedy next action, named by the trajectory's own tools or seed 004's tags
    (:func:`attnprobe.counterfactual.actions.classify_action`: ``decision``, ``method`` = its kind),
    plus the exact first structured tool call and the reply text. ``reply``: the chat's reply already
    generated (from the captured cache, :func:`cache_requests`; ``prefilled``: the prompt tokens its
    generation prefilled); else ``chat.complete`` generates it, prefilling the whole prompt."""
    if reply is None:
        reply = chat.complete(messages, tools, max_new_tokens=max_new_tokens, temperature=0.0)
        prefilled = reply.input_tokens
    text = reply.raw_text or reply.content or ""
    parsed = classify_action(text, reply.tool_calls, vocabulary)
    call = None
    if reply.tool_calls:
        fn = reply.tool_calls[0]["function"]
        args = fn.get("arguments")
        call = {"name": fn.get("name"), "arguments": call_arguments(fn, on_error="raw") if isinstance(args, str)
                else args}
    return {"decision": parsed["action"], "method": parsed["kind"], "call": call, "text": text[:2000],
            "output_tokens": reply.output_tokens,
            "generation": {"prompt_tokens": reply.input_tokens, "prefilled_tokens": prefilled}}


def cache_requests(chat, contexts: Sequence[Context], wanted: Sequence[tuple[Any, int, list[dict], Any]],
                   max_new_tokens: int):
    """Which next actions can continue from the capture's KV cache: those whose chat prompt (the
    messages rendered with the generation prompt, as ``chat.complete`` renders them) is a token prefix
    of a captured context. ``wanted``: (key, context index, messages, tools). Returns (generation requests,
    and per request (key, prompt, messages, tools, stopping criterion)); the rest generate in full."""
    from attnprobe_hooks.backend import GenerationRequest

    if not hasattr(chat, "generation_settings"):
        return [], []
    requests, pending = [], []
    for key, ci, messages, tools in wanted:
        prompt = chat.prompt(messages, tools)
        n = len(prompt.ids)
        ids = np.asarray(contexts[ci].rendered.input_ids)
        if n <= len(ids) and np.array_equal(ids[:n], prompt.ids):
            kw, stop = chat.generation_settings(n, tools, max_new_tokens=max_new_tokens)
            kw = {k: v for k, v in kw.items() if k not in ("max_new_tokens", "do_sample")}
            requests.append(GenerationRequest(ci, n, max_new_tokens, kw))
            pending.append((key, prompt, messages, tools, stop))
    return requests, pending


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
    """A counterfactual run's options; the capture ones are :class:`CaptureOptions`' own fields (one
    declaration, one default), the others the "counterfactual" group's (``attnprobe counterfactual``)."""

    rendering: str = same_as(CaptureOptions, "rendering")
    max_tokens: int | None = same_as(CaptureOptions, "max_tokens")
    layers: Sequence[int] | None = same_as(CaptureOptions, "layers")
    chunk_size: int | None = same_as(CaptureOptions, "chunk_size")  # None: chosen for the device
    actions: bool = option(False, flag="--actions", action="store_true",
                           help="also generate the next action (greedy) in both contexts and compare (transformers)")
    max_new_tokens: int = option(96, flag="--max-new-tokens", type=positive_int,
                                 help="generation limit for --actions (default {default})")
    logprob: bool = option(  # teacher-forced log p of the recorded step in both contexts (one forward each)
        False, flag="--logprob", action="store_true",
        help="also the teacher-forced log-probability of the recorded step in both contexts "
             "(one forward pass each; transformers)")
    share_prefixes: bool = same_as(CaptureOptions, "share_prefixes")  # the batch's contexts share prefills (exact)
    progress: bool = False


def settings_dict(model: LoadedModel, policy: str, opts: RunOptions) -> dict:
    """What must match for a finished step to be skipped on resume (with the trajectory's content
    hash, which the record keeps): model, weights fingerprint, policy and capture settings."""
    return json.loads(json.dumps({
        "model": model.spec, "weights": weights_hash(model.spec), "backend": model.backend, "dtype": model.dtype,
        "policy": policy,
        "rendering": opts.rendering,
        "layers": opts.layers if opts.layers is None or isinstance(opts.layers, str) else list(opts.layers),
        # a chunk changes scores only by float rounding: an automatic one (None) resumes any folder
        **({"chunk_size": opts.chunk_size} if opts.chunk_size else {}), "actions": opts.actions,
        "max_new_tokens": opts.max_new_tokens if opts.actions else None, "logprob": opts.logprob,
        "semantics": SEMANTICS,
    }))


def _slice(full: CaptureResult, idx: Sequence[int], points: list[QueryPoint]) -> CaptureResult:
    idx = list(idx)
    return replace(full, queries=points, segment_attention=full.segment_attention[idx],
                   layer_head_attention=full.layer_head_attention[idx], token_attention=full.token_attention[idx],
                   meta=dict(full.meta))


@dataclass
class Original:
    """A step's original context: its trajectory's one capture (``context``, an index into
    :attr:`Batch.contexts`), this step's rows there (decision, reasoning start) and its own context."""

    context: int
    rows: list[int]
    points: list[QueryPoint]
    own: Context


@dataclass
class Batch:
    """The (step, policy) pairs of one backend call and the contexts captured for them: one original
    context per trajectory, then one counterfactual context per pair."""

    todo: list[tuple[Step, Policy, str]]
    contexts: list[Context] = field(default_factory=list)
    original: dict[tuple[str, int], Original] = field(default_factory=dict)
    counterfactual: dict[tuple[str, int, str], tuple[int, Counterfactual]] = field(default_factory=dict)

    @property
    def trajectories(self) -> dict[str, Trajectory]:
        return {s.trajectory.id: s.trajectory for s, _, _ in self.todo}


def pending_steps(model: LoadedModel, steps: Sequence[Step], policies: Sequence[Policy], out: Path,
                  opts: RunOptions) -> tuple[list[tuple[Step, Policy, str]], dict[str, dict]]:
    """The (step, policy, name) not yet done in ``out`` and each policy's settings (:func:`settings_dict`)."""
    names = [policy_name(p) for p in policies]
    settings = {n: settings_dict(model, n, opts) for n in names}
    todo = [(s, p, n) for s in steps for p, n in zip(policies, names) if not step_done(out, s, n, settings[n])]
    return todo, settings


def original_contexts(model: LoadedModel, todo: list[tuple[Step, Policy, str]], opts: RunOptions) -> Batch:
    """One capture of each trajectory, up to the end of its latest step in the batch, at the decision and
    reasoning start of every step (each step's own rendering checked to be a token prefix of it)."""
    batch = Batch(todo)
    by_traj: dict[str, list[Step]] = {}
    for s, _, _ in todo:
        if s not in by_traj.setdefault(s.trajectory.id, []):
            by_traj[s.trajectory.id].append(s)
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
        ci = len(batch.contexts)
        batch.contexts.append(replace(per[-1][1], points=uniq))
        for k, (s, c) in enumerate(per):
            batch.original[(tid, s.message_index)] = Original(ci, [where[2 * k], where[2 * k + 1]], c.points, c)
    return batch


def counterfactual_contexts(model: LoadedModel, batch: Batch, opts: RunOptions) -> None:
    """One context per (step, policy): the policy applied to what the agent saw before the step (tag text
    included), rendered as the step's original was unless ``opts.rendering`` names one."""
    for s, p, n in batch.todo:
        traj = s.trajectory
        cfx = apply_policy(p, traj.messages[: s.message_index])
        rendering = batch.contexts[batch.original[(traj.id, s.message_index)].context].rendered.rendering
        c = build_context(model, traj, cfx.messages, traj.messages[s.message_index], f"{s.key}:{n}",
                          rendering=rendering if opts.rendering == "auto" else opts.rendering,
                          max_tokens=opts.max_tokens)
        batch.counterfactual[(traj.id, s.message_index, n)] = (len(batch.contexts), cfx)
        batch.contexts.append(c)


def capture_contexts(model: LoadedModel, batch: Batch, opts: RunOptions, chat=None) -> tuple[list[CaptureResult], dict]:
    """Capture every context of the batch in one backend call (:func:`attnprobe.capture.api.run_prepared`);
    (results in context order, replies). With ``--actions`` on a backend that can, the next actions continue
    from the cache the capture builds (the prompt is already prefilled there, so each generation prefills 1
    token instead of the prompt): ``replies`` maps ("o", trajectory, message) / ("c", trajectory, message,
    policy) to (the chat's reply, prompt tokens prefilled); the others generate in full later."""
    from attnprobe_hooks.backend import get_backend

    chosen = check_layers(model, opts.layers)
    trajs = batch.trajectories
    wanted = []
    if opts.actions and chat is not None and opts.share_prefixes and \
            hasattr(get_backend(model.backend), "capture_and_generate"):
        wanted = [(("o", tid, mi), o.context, trajs[tid].messages[:mi], trajs[tid].tools)
                  for (tid, mi), o in batch.original.items()]
        wanted += [(("c", tid, mi, n), k, cfx.messages, trajs[tid].tools)
                   for (tid, mi, n), (k, cfx) in batch.counterfactual.items()]
    requests, pending = cache_requests(chat, batch.contexts, wanted, opts.max_new_tokens)
    run = run_prepared(model, [Prepared(c.trajectory, c.rendered, c.points) for c in batch.contexts],
                       queries="positions", layers=chosen, chunk_size=opts.chunk_size, weights=weights_hash(model.spec),
                       layer_selection=opts.layers if isinstance(opts.layers, str) else None,
                       share_prefixes=opts.share_prefixes, progress=opts.progress, generate=requests,
                       what="counterfactual")
    tokens = sum(len(c.rendered.input_ids) for c in batch.contexts)
    log.info("counterfactual batch: captured %d contexts (%d of the originals' steps, %d edited): %d tokens, "
             "prefilled %d", len(batch.contexts), len(batch.original), len(batch.counterfactual), tokens,
             run.sharing.prefilled_tokens if run.sharing else tokens)
    replies: dict[Any, tuple[Any, int]] = {}
    for (key, prompt, messages, tools, stop), ids, c in zip(pending, run.generated, run.generation_counts):
        replies[key] = (chat.finish(prompt, ids, tools, opts.max_new_tokens, messages, stop), c.prefilled_tokens)
    if requests:
        counts = run.generation_counts
        log.info("counterfactual batch: %d next actions from the captured cache: %d prompt tokens, prefilled %d "
                 "(the rest were in the cache); %d by a full prefill", len(requests),
                 sum(c.prompt_tokens for c in counts), sum(c.prefilled_tokens for c in counts),
                 len(wanted) - len(requests))
    return run.results, replies


def step_record(s: Step, name: str, cfx: Counterfactual, o: Original, cctx: Context, queries: dict,
                settings: dict) -> dict[str, Any]:
    """A step's record.json without the optional parts (next actions, extras)."""
    traj = s.trajectory
    oc = o.own
    return {
        "trajectory_id": traj.id, "trajectory_hash": traj.content_hash(), "policy": name,
        "step_message_index": s.message_index, "turn": s.turn,
        "changes": {str(i): v for i, v in sorted(cfx.changes.items())}, "source": cfx.source,
        "changed": cfx.changed, "roles": list(CF_ROLES), "groups": list(GROUPS),
        "tokens": {"original": oc.prefix_tokens, "counterfactual": cctx.prefix_tokens,
                   "saved": oc.prefix_tokens - cctx.prefix_tokens,
                   "saved_share": (oc.prefix_tokens - cctx.prefix_tokens) / oc.prefix_tokens},
        "decision_exact": {"original": oc.decision_exact, "counterfactual": cctx.decision_exact},
        "queries": queries, "settings": settings, "attnprobe_version": __version__,
        "rendering": {"original": oc.rendered.rendering, "counterfactual": cctx.rendered.rendering},
    }


def step_actions(chat, s: Step, name: str, cfx: Counterfactual, opts: RunOptions, replies: dict,
                 originals: dict) -> dict:
    """The next action in both contexts (the original's once per step, kept in ``originals``) and whether
    it changed: the record's ``action``."""
    traj = s.trajectory
    key = (traj.id, s.message_index)
    vocab = tool_vocabulary(traj.tools, traj.messages[: s.message_index])
    if key not in originals:
        originals[key] = next_action(chat, traj.messages[: s.message_index], traj.tools, opts.max_new_tokens, vocab,
                                     *replies.get(("o", *key), (None, None)))
    a_o = originals[key]
    a_c = next_action(chat, cfx.messages, traj.tools, opts.max_new_tokens, vocab,
                      *replies.get(("c", *key, name), (None, None)))
    return {"original": a_o, "counterfactual": a_c, "changed": a_o["decision"] != a_c["decision"],
            "call_changed": a_o["call"] != a_c["call"]}


def write_records(model: LoadedModel, batch: Batch, results: list[CaptureResult], replies: dict, out: Path,
                  opts: RunOptions, settings: dict[str, dict], chat=None) -> None:
    """Per (step, policy): the analysis of its two captures, its next actions and extras, one folder."""
    actions_orig: dict[tuple[str, int], dict] = {}
    logprob_orig: dict[tuple[str, int], dict] = {}
    for s, _p, n in batch.todo:
        traj = s.trajectory
        key = (traj.id, s.message_index)
        o = batch.original[key]
        original = _slice(results[o.context], o.rows, o.points)
        k, cfx = batch.counterfactual[(traj.id, s.message_index, n)]
        cres, cctx = results[k], batch.contexts[k]
        queries, arrays = step_analysis(original, cres, cfx, s, message_turns(traj.messages))
        record = step_record(s, n, cfx, o, cctx, queries, settings[n])
        if opts.actions and chat is not None:
            record["action"] = step_actions(chat, s, n, cfx, opts, replies, actions_orig)
        extra_fields(record, original, cfx, traj, s.message_index, model=model if opts.logprob else None,
                     rendering=o.own.rendered.rendering, max_tokens=opts.max_tokens,
                     original_logprob=logprob_orig.get(key))
        if "logprob" in record:
            logprob_orig[key] = record["logprob"]["original"]
        write_step(step_dir(out, s, n), record, arrays, original, cres)


def run_batch(model: LoadedModel, steps: Sequence[Step], policies: Sequence[Policy], out: Path, opts: RunOptions,
              chat=None) -> None:
    """Capture every (step, policy) of ``steps`` not yet done, writing one folder each: original contexts,
    counterfactual contexts, one capture of them all, next actions, records."""
    todo, settings = pending_steps(model, steps, policies, out, opts)
    if not todo:
        return
    batch = original_contexts(model, todo, opts)
    counterfactual_contexts(model, batch, opts)
    results, replies = capture_contexts(model, batch, opts, chat)
    write_records(model, batch, results, replies, out, opts, settings, chat)
