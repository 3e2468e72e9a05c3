"""Capture in the loop (``study interference --capture-in-loop``, issue 40): every recorded call's attention
scored from the agent's own forward passes while it generates, written where ``study attention`` writes its
captures and in its format, so ``study attention`` finds them done and prefills nothing for them.

How (docs/loop.md, "Captured in the loop"; docs/methods.md, "Captured in the loop"):

1. :class:`CapturingChat` wraps the in-process chat. Before each call it renders the prompt as the chat does
   (or takes a Search-R1 sequence's token ids), finds the query positions a post-hoc capture of the call will
   score in the prompt (the decision, the last prompt token, and the reasoning starts of past turns) and asks
   the generator to score those that no earlier call of the episode scored on the same tokens
   (:class:`attnprobe.generation.capturing.CaptureSpec`), plus the reply's first token. Rows come back per key
   (every key position its own segment): no segmentation is needed before the reply exists.
2. When the episode is written, :func:`capture_call` renders each recorded call exactly as ``study attention``
   does (:func:`attnprobe.capture.api.prepare`, :func:`~attnprobe.capture.api.select_queries`), takes each
   query's row from the call's own capture or from an earlier call of the episode whose tokens agree up to
   that position (a row at position p depends on tokens 0..p only), checks the tokens, sums the rows into the
   rendering's segments and assembles the result with :func:`attnprobe.capture.api.assemble`: the same
   folder, meta.json (``cli_settings`` as ``study attention`` records them, plus ``captured: "captured in the
   loop"``), scores. A call whose rendering does not reproduce the tokens the model ran (a position no pass
   scored) is not written: ``study attention`` captures it afterwards (counted as ``left_post_hoc``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attnprobe.generation.capturing import CAPTURED_IN_THE_LOOP, CaptureSpec, LoopCapture, SidePlan
from attnprobe.generation.chat import ChatRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InLoopOptions:
    """What the captures are made with: the capture options ``study attention`` will compare
    (``queries``, ``layers``, ``rendering``) and the model as it records it (``spec``, ``dtype``, and the
    ``backend`` that generates and scores: transformers, or vllm's one engine)."""

    capture: Any  # attnprobe.capture.job.CaptureOptions
    spec: str
    dtype: str
    weights: str | None = None  # the weights' fingerprint (attnprobe.capture.api.weights_hash(spec))
    backend: str = "transformers"

    @classmethod
    def of(cls, capture, spec: str, dtype: str, backend: str = "transformers") -> InLoopOptions:
        from attnprobe.capture.api import weights_hash

        return cls(capture, spec, dtype, weights_hash(spec), backend)

    def settings(self) -> dict:
        """``cli_settings`` as ``study attention``'s capture job writes them (:attr:`CaptureJob.settings`)."""
        from attnprobe.capture.job import CaptureJob

        job = CaptureJob.__new__(CaptureJob)  # only its settings: no weights hash, no folder
        job.options, job.model, job.backend, job.dtype = self.capture, self.spec, self.backend, self.dtype
        return CaptureJob.settings.fget(job)


@dataclass
class CapturingChat:
    """The chat, with every request of an episode asking for its capture (module docstring, step 1).
    ``ended[episode]``: the episode's captures in call order, once it ended (taken by :meth:`take`)."""

    chat: Any  # a TransformersChat (or any in-process backend that honours ChatRequest.capture)
    options: InLoopOptions
    loops: dict[str, Any] = field(default_factory=dict)  # episode -> its Loop (the calls it has recorded)
    episodes: dict[str, list[LoopCapture]] = field(default_factory=dict)
    ended: dict[str, list[LoopCapture]] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)  # episode -> its calls whose side plans were sent

    def __post_init__(self) -> None:
        from attnprobe.capture.api import check_layers

        self.layers = check_layers(self.chat.loaded, self.options.capture.layers)
        queries = self.options.capture.queries
        if not isinstance(queries, str):
            raise ValueError("capture in the loop takes --queries reasoning, decision or reasoning+decision, "
                             "not positions")
        self.decision, self.reasoning = "decision" in queries, "reasoning" in queries

    def __getattr__(self, name: str) -> Any:  # name, kind, tokenizer, stats ... are the chat's
        return getattr(self.chat, name)

    def spec(self, request: ChatRequest) -> tuple[CaptureSpec, list[int]]:
        """The capture spec of ``request`` and its prompt's token ids; its side plans: the rows the episode's
        previous call's rendering needs that no pass scored (:meth:`pending`)."""
        from attnprobe.render.rendering import render
        from attnprobe.trajectory.schema import Trajectory

        if request.prompt_ids is not None:  # a Search-R1 sequence: reasoning starts come from earlier calls
            ids, starts = [int(t) for t in request.prompt_ids], []
        else:
            r = render(Trajectory(id="prompt", messages=request.messages, tools=request.tools), self.chat.tokenizer,
                       add_generation_prompt=True)
            ids = r.input_ids.tolist()
            starts = [q.position for q in r.queries_reasoning] if self.reasoning else []
        n = len(ids)
        want = sorted({*starts, *([n - 1] if self.decision else [])})
        done = rows_of(self.episodes.get(request.episode or "", []))
        positions = tuple(p for p in want if p < n and _row_source(done, ids, p) is None)
        return CaptureSpec(positions=positions, reply_start=self.reasoning,
                           layers=None if self.layers is None else tuple(self.layers),
                           before=tuple(self.pending(request.episode or ""))), ids

    def pending(self, episode: str) -> list[SidePlan]:
        """Side plans for the episode's recorded calls not yet looked at: each call rendered as ``study
        attention`` renders it, and the rows at its query positions that no pass scored on its tokens (the
        reply as rendered, where it differs from what the model wrote: module docstring)."""
        from attnprobe.capture.api import prepare, select_queries

        loop, caps = self.loops.get(episode), self.episodes.get(episode, [])
        calls = loop.ep.calls if loop is not None else []
        plans, pool = [], rows_of(caps)
        for i in range(self.checked.get(episode, 0), min(len(calls), len(caps))):
            self.checked[episode] = i + 1
            rendered = prepare(self.chat.loaded, as_read(calls[i]), rendering=self.options.capture.rendering,
                               max_tokens=self.options.capture.max_tokens, truncate=self.options.capture.truncate)
            ids = rendered.input_ids.tolist()
            missing = [q.position for q in select_queries(rendered, self.options.capture.queries)
                       if _row_source(pool, ids, q.position) is None]
            if missing:
                plans.append(SidePlan(tuple(ids[:missing[-1] + 1]), tuple(missing)))
        return plans

    def complete_batch(self, requests):
        asked = [replace(r, capture=self.spec(r)[0]) for r in requests]
        replies = self.chat.complete_batch(asked)
        for r, rep in zip(asked, replies):
            if rep.capture is None:
                raise RuntimeError(f"{type(self.chat).__name__} returned no capture for a request that asked for one")
            self.episodes.setdefault(r.episode or "", []).append(rep.capture)
        return replies

    def complete(self, *args, **kwargs):
        raise ValueError("capture in the loop steps episodes through complete_batch")

    def end_episode(self, episode: str) -> None:
        """The last call's side plans (on the episode's cache, before it is freed: a request of its last prompt,
        1 token prefilled, its reply dropped), then the episode's end."""
        caps = self.episodes.get(episode, [])
        try:
            plans = self.pending(episode)
            if plans and caps:
                last = caps[-1].token_ids[:-1]
                req = ChatRequest([], max_new_tokens=1, episode=episode, prompt_ids=last,
                                  capture=CaptureSpec(positions=(), reply_start=False, before=tuple(plans),
                                                      layers=None if self.layers is None else tuple(self.layers)))
                caps[-1].side.extend(self.chat.complete_batch([req])[0].capture.side)
        except Exception as exc:  # noqa: BLE001 - an episode ended by a failure: its calls go to study attention
            log.info("capture in the loop: %s: the last call's side plans were not run (%s)", episode, exc)
        self.chat.end_episode(episode)
        self.ended[episode] = self.episodes.pop(episode, [])
        self.checked.pop(episode, None)

    def take(self, episode: str) -> list[LoopCapture]:
        self.loops.pop(episode, None)
        return self.ended.pop(episode, [])


def as_read(record: dict):
    """A recorded call as ``study attention`` reads it (JSON, then the trajectory schema)."""
    import json

    from attnprobe.trajectory.schema import Trajectory

    return Trajectory.from_dict(json.loads(json.dumps(record, ensure_ascii=False)))


def rows_of(caps: list[LoopCapture]) -> list[LoopCapture]:
    """Every pass of an episode's captures: each call's own and its side plans'."""
    return [c for cap in caps for c in (cap, *cap.side)]


def _row_source(caps: list[LoopCapture], ids: list[int], p: int) -> tuple[LoopCapture, int] | None:
    """(capture, row index) of the latest capture that scored position ``p`` on the tokens ``ids[:p + 1]``."""
    for cap in reversed(caps):
        qpos = cap.scorer.qpos
        k = int(np.searchsorted(qpos, p))
        if k < len(qpos) and int(qpos[k]) == p and len(cap.token_ids) > p and cap.token_ids[:p + 1] == list(ids[:p + 1]):
            return cap, k
    return None


def capture_call(model, trajectory, own: LoopCapture, caps: list[LoopCapture], options: InLoopOptions,
                 weights: str | None):
    """The :class:`~attnprobe.results.result.CaptureResult` of one recorded call from the rows scored in the
    loop (``own``: the call's capture; ``caps``: every capture of the episode, side plans included: a row at
    p is the same whichever pass computed it on tokens 0..p), or the reason it cannot be made (a str) when a
    query's row was not scored on the rendering's tokens (module docstring, step 2)."""
    import torch

    from attnprobe.capture.api import CaptureSettings, assemble, check_layers, prepare, select_queries
    from attnprobe_hooks.backend import BackendOutput
    from attnprobe_hooks.scoring import QueryScorer

    o = options.capture
    rendered = prepare(model, trajectory, rendering=o.rendering, max_tokens=o.max_tokens, truncate=o.truncate)
    points = select_queries(rendered, o.queries)
    ids = rendered.input_ids.tolist()
    sources = []
    pool = [own, *own.side, *rows_of(caps)]  # the call's own passes first
    for q in points:
        src = _row_source(pool, ids, q.position)
        if src is None:
            return f"{trajectory.id}: no pass scored position {q.position} ({q.kind}) on these tokens"
        sources.append(src)
    seg = torch.as_tensor(np.asarray(rendered.token_segment), dtype=torch.long)
    num_seg, n = len(rendered.segments), len(ids)
    scorer = QueryScorer(seg_ids=seg, num_segments=num_seg, query_positions=[q.position for q in points],
                         layers=None if own.scorer.layers is None else list(own.scorer.layers))
    layers = sorted(own.scorer.per_layer)
    for li in layers:
        heads = int(own.scorer.per_layer[li].shape[1])
        out = torch.zeros(len(points), heads, num_seg, dtype=torch.float32)
        for k, (q, (cap, row)) in enumerate(zip(points, sources)):
            keys = q.position + 1  # the row's keys: positions 0..p (per-key segments in the loop)
            out[k].index_add_(1, seg[:keys], cap.scorer.per_layer[li][row, :, :keys].float())
        scorer.per_layer[li] = out
    tok = torch.zeros(len(points), n, dtype=torch.float32)
    for k, (q, (cap, row)) in enumerate(zip(points, sources)):
        tok[k, :q.position + 1] = cap.scorer.token_sum[row, :q.position + 1]
    scorer.token_sum = tok
    info = {**own.info, "captured": CAPTURED_IN_THE_LOOP,
            "loop_capture": {"prefilled": own.prefilled, "prompt_tokens": len(own.token_ids) - 1,
                             "rows_from_other_passes": sum(cap is not own for cap, _ in sources),
                             "side_tokens": sum(c.prefilled for c in own.side)}}
    chosen = check_layers(model, o.layers)
    settings = CaptureSettings(queries=o.queries, layers=chosen, chunk_size=len(own.token_ids) - 1,
                               chunk_reason="captured in the loop: the generator's own forward passes (its prefill "
                                            "from the episode's kept cache, then the reply's first decode step)",
                               seconds=0.0, weights_hash=weights,
                               layer_selection=o.layers if isinstance(o.layers, str) else None)
    result = assemble(model, trajectory, rendered, points, BackendOutput(scorer, {}, info), settings)
    result.meta["cli_settings"] = options.settings()
    return result


def captured_in_the_loop(folders) -> int:
    """How many of the capture ``folders`` hold a capture made in the loop (their meta.json stamped
    :data:`CAPTURED_IN_THE_LOOP`), counted from the files: right whichever process or Ray replica wrote them."""
    from attnprobe.errors import AttnprobeError
    from attnprobe.io import load_json
    from attnprobe.results.layout import CaptureLayout

    n = 0
    for folder in folders:  # meta.json only
        meta = CaptureLayout.meta(folder)
        if meta.is_file() and not meta.is_symlink():
            try:
                n += (load_json(meta) or {}).get("captured") == CAPTURED_IN_THE_LOOP
            except AttnprobeError:
                pass
    return n


def log_capture_prefill(setting: str, job) -> None:
    """One line per setting: its calls captured in the loop before (``study interference --capture-in-loop``:
    nothing prefilled for them here), the calls captured now and the tokens prefilled for them."""
    in_loop = captured_in_the_loop(job.folder(t) for t in job.trajectories)
    t = job.tally
    log.info("study attention: %s: %d of %d calls were captured in the loop (0 tokens prefilled for them); %d "
             "tokens prefilled for the calls captured now (%d tokens in them)", setting, in_loop,
             len(job.trajectories), t["prefilled_tokens"], t["plan_tokens"])
