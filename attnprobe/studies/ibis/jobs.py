"""The two IBIS stages as jobs: behaviour (greedy decisions) and attention (capture at the decision).

Work items are (item, framing) pairs. Behaviour results are returned, not written, and appended to
``FOLDER/decisions.jsonl`` by :meth:`BehaviourJob.collect` where the job was started, so that file
has one writer however many replicas generate. Attention captures are written by whoever computes
them, one folder per pair (``FOLDER/captures/<item>/<framing>/``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.execution.job import JobBase, WorkItem
from attnprobe.execution.local import in_process
from attnprobe.generation.factory import ChatJob
from attnprobe.io import append_jsonl, recover_atomic_dirs
from attnprobe.studies.ibis.behaviour import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NO_CALL_TOKENS,
    BehaviourBackend,
    check_generation_settings,
    decide_many,
    generation_settings,
)
from attnprobe.studies.ibis.framings import FRAMINGS, IbisProtocol, as_protocol, build_framing, segment_categories
from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.layout import ModelFolderLayout
from attnprobe.studies.ibis.position import SHIFTED, shifted_observer


def capture_dir(folder: Path, item_id: str, framing: str) -> Path:
    """``captures/<item>/<framing>/`` of a model folder (:meth:`ModelFolderLayout.capture`)."""
    return ModelFolderLayout(Path(folder)).capture(item_id, framing)


def _pairs(items: Sequence[IbisItem], framings: Sequence[str], protocol: IbisProtocol) -> list[WorkItem]:
    return [WorkItem(key=f"{it.id}/{fr}", tokens=build_framing(it, "observer" if fr == SHIFTED else fr,
                                                            protocol).estimated_tokens(),
                     describe={"item_id": it.id, "framing": fr}, data=(it, fr)) for it in items for fr in framings]


def capture_framings(framings: Sequence[str], protocol: IbisProtocol) -> tuple[str, ...]:
    """The framings a capture stage captures: ``framings`` plus, under the matched protocol with both the
    agentic and the observer framing, the position control's observer_shifted (position.py)."""
    extra = (SHIFTED,) if protocol.name == "matched" and {"agentic", "observer"} <= set(framings) else ()
    return tuple(f for f in framings if f != SHIFTED) + extra


@dataclass
class BehaviourJob(ChatJob):
    """Decide every (item, framing) not yet in ``folder/decisions.jsonl``. The model it runs on is a
    chat backend (in process or an endpoint) or a loaded model, wrapped in :class:`BehaviourBackend`;
    ``batch_size`` pairs are generated in one left-padded batch where the backend supports it.
    ``no_call_tokens``: stop a row after that many tokens without a call (in process; None for an
    endpoint or off). Unless ``force``, a folder whose decisions were made with other generation
    settings is refused here, before any model loads (:func:`check_generation_settings`)."""

    folder: Path
    ibis_items: Sequence[IbisItem]
    framings: Sequence[str] = FRAMINGS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    protocol: IbisProtocol = field(default_factory=IbisProtocol)  # a name: that protocol, its default reminder
    batch_size: int = 1
    early_stop: bool = True
    forced_choice: bool = True
    no_call_tokens: int | None = DEFAULT_NO_CALL_TOKENS
    force: bool = False
    stage: str = "behaviour"
    unit: str = "call"
    _finished: set = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.out = self.folder
        self.protocol = as_protocol(self.protocol)
        self.layout = ModelFolderLayout(self.folder)
        if not self.force:
            check_generation_settings(self.folder, generation_settings(
                self, max_new_tokens=self.max_new_tokens, protocol=self.protocol))
        self._finished = self.layout.decided()

    @property
    def decisions(self) -> Path:
        return self.layout.decisions

    def items(self) -> list[WorkItem]:
        return _pairs(self.ibis_items, self.framings, self.protocol)

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        it, fr = item.data
        return self.layout.decision_done(self._finished, it.id, fr, since)

    @property
    def prepare_key(self) -> Any:
        return ("behaviour", self.early_stop, self.forced_choice, self.no_call_tokens)

    def prepare_chat(self, chat) -> BehaviourBackend:
        """The chat (:class:`ChatJob` made a loaded model one) in IBIS's wrapper; a wrapper handed in is kept."""
        if isinstance(chat, BehaviourBackend):
            return chat
        return BehaviourBackend(chat, early_stop=self.early_stop, forced_choice=self.forced_choice,
                                no_call_tokens=self.no_call_tokens)

    def run(self, backend: BehaviourBackend, batch: Sequence[WorkItem]) -> list[dict]:
        def progress(n_new: int, stopped: int, rows: int) -> None:
            self.note(f"token {n_new}/{self.max_new_tokens}, {stopped}/{rows} rows stopped")

        live = progress if getattr(backend, "in_process", False) else None
        return list(decide_many(backend, [it.data for it in batch], max_new_tokens=self.max_new_tokens,
                                protocol=self.protocol, batched=len(batch) > 1,
                                on_progress=live))

    def collect(self, item: WorkItem, result: dict) -> None:
        append_jsonl(self.decisions, result)


CAPTURE_BATCH = 12  # pairs per sharing pass: 4 items x 3 framings, the size of an `ibis all` group


@dataclass
class AttentionJob(JobBase):
    """Capture every (item, framing) at the decision token into ``capture_dir``; a finished capture
    has meta.json. Under the matched protocol the position control's observer_shifted framing is
    captured too (:func:`capture_framings`); it needs the model's tokenizer to be built."""

    folder: Path
    ibis_items: Sequence[IbisItem]
    framings: Sequence[str] = FRAMINGS
    chunk_size: int | None = None
    protocol: IbisProtocol = field(default_factory=IbisProtocol)  # a name: that protocol, its default reminder
    force: bool = False
    batch_size: int = CAPTURE_BATCH  # (item, framing) pairs per backend call, which share the prefill of
    share_prefixes: bool = True      # their common prefix (system prompt, tools, ...; exact, issue 20)
    stage: str = "attention"
    unit: str = "capture"

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.out = self.folder
        self.protocol = as_protocol(self.protocol)
        self.layout = ModelFolderLayout(self.folder)

    def items(self) -> list[WorkItem]:
        return _pairs(self.ibis_items, capture_framings(self.framings, self.protocol), self.protocol)

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        it, fr = item.data
        return self.layout.capture_done(it.id, fr, since)

    def run(self, model, batch: Sequence[WorkItem]) -> list[None]:
        from attnprobe.capture.api import capture_many

        pairs = [work.data for work in batch]
        trajs = [shifted_observer(it, model.tokenizer, self.protocol)[0] if fr == SHIFTED
                 else build_framing(it, fr, self.protocol) for it, fr in pairs]
        results = capture_many(model, trajs, queries="decision", chunk_size=self.chunk_size,
                               share_prefixes=self.share_prefixes and len(trajs) > 1)
        for (it, fr), traj, res in zip(pairs, trajs, results):
            res.meta["ibis"] = {"item_id": it.id, "framing": fr, "label": it.label, "protocol": self.protocol.name,
                                "reminder": traj.meta["ibis"].get("reminder"),
                                **({"pad": traj.meta["ibis"].get("pad", 0)} if fr == SHIFTED else {}),
                                "categories": segment_categories(res.segments, traj)}
            res.save(self.layout.capture(it.id, fr))
        return [None] * len(batch)

    def finish(self) -> list[str]:
        root = self.layout.captures
        parents = [root, *(p for p in root.iterdir() if p.is_dir())] if root.is_dir() else []
        return [p for parent in parents for p in recover_atomic_dirs(parent)]


def run_behaviour(backend, items: list[IbisItem], folder: Path, *, framings=FRAMINGS,
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                  force: bool = False, progress: bool = True, batch_size: int = 1,
                  protocol: IbisProtocol | str = "paper") -> dict[str, int]:
    """Decide every (item, framing) not yet in the folder's decisions in this process
    (:class:`BehaviourJob` on the local executor); returns counts.

    Resumable: finished pairs are skipped; each decision is appended durably as soon as its batch
    exists. Failures are written to ``errors.jsonl`` and retried on the next run. ``backend``: a
    :class:`BehaviourBackend` or a chat backend."""
    batched = batch_size > 1 and getattr(backend, "supports_batch", getattr(backend, "in_process", False))
    job = BehaviourJob(Path(folder), items, framings=framings, max_new_tokens=max_new_tokens, protocol=protocol,
                       batch_size=batch_size if batched else 1, force=force,
                       no_call_tokens=getattr(backend, "no_call_tokens", DEFAULT_NO_CALL_TOKENS))
    counts = in_process(backend, progress=progress).run(job)
    return {"done_before": counts["done_before"], "decided": counts["done"], "failed": counts["failed"]}
