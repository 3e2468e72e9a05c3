"""A context policy inside an agent loop: what the model is sent at each step, and the full history beside it.

Shared by every scaffold that runs a policy in the loop (the seeds' scaffolds in :mod:`attnprobe.studies.loop`
and the NIS-Agent runner's search worker), so both send, refine and link exactly the same way.

A setting is ``none`` or policies joined by ``+`` (e.g. ``ircot:oq+refine:bm25:3``):

- *view* policies (``mask:K``, ``mask-obs:K``, ``ircot:o|oq|oqp``) map the history to what the model is
  sent, afresh at every step (:func:`attnprobe.agents.policies.parse_policy`, used as is);
- a *refine* policy (``refine:bm25[:N]``, ``refine:openai:URL:MODEL``) runs once per round, right after that
  round's documents arrive: seed 004 §3.3, "in each round i, refine the context to preserve the most relevant
  information d~_i = F(q_{i-1}, d_i) to search query q_{i-1} from the latest retrieved documents d_i. d~_i is
  served as the i-th observation o_i and then appended to s_i". The refined text replaces the observation in
  the history every later step sees; the full history keeps d_i. (Applying ``refine_latest`` afresh at each
  step would instead refine only the newest observation and show older ones raw.)

Masking counts (seed 002 §2.2, "The retention window K preserves the most recent observations"): ``mask:K``
counts turns as seed 002's released scaffold does (the results of the K most recent turns with a non-error call
stay, parallel calls together); ``mask-obs:K`` keeps the K most recent observations (one per tool message: a
turn of 3 parallel calls is 3 observations). Errors are exempt in both.

:class:`ContextHistory` keeps one agent's two copies of its history (``full``: every observation as the tool
returned it; ``work``: observations replaced by the refiner's output) and gives, per recorded call, the
``meta.history`` link from the messages sent to the full history (:meth:`ContextHistory.link`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from attnprobe.agents.policies import Counterfactual, Policy, compose, parse_policy
from attnprobe.agents.policy_specs import canonical_setting, canonical_settings


def _one(part: str) -> Policy:
    """A view policy as :func:`parse_policy` reads it; a refiner as its latest-round form, because the
    loop runs it once per round on that round's documents (the earlier ones are refined already)."""
    if part.startswith("refine:"):
        return parse_policy("refine-latest:" + part.removeprefix("refine:"))
    return parse_policy(part)


class Setting:
    """A parsed setting, a value: ``spec`` (its one spelling, :func:`attnprobe.agents.policy_specs.canonical_setting`),
    ``view`` (None = the history as it is), ``refine`` (None = no refiner), ``parts`` (the policies of the spec).

    Parsed once where it enters (the CLI, or :func:`as_setting` for a Python caller) and carried as is: equal and
    hashed by its spec (``mask:05`` is ``mask:5``), ``str()`` is the spec, immutable. It crosses processes and
    Ray as its spec (``__reduce__`` parses it again there: a refiner's client is never serialised), and a copy
    is the value itself (its policies are stateless functions of the history)."""

    __slots__ = ("spec", "view", "refine", "parts")

    def __init__(self, spec: str, view: Policy | None = None, refine: Policy | None = None,
                 parts: Sequence[str] = ()):
        for name, value in (("spec", spec), ("view", view), ("refine", refine), ("parts", tuple(parts))):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"a Setting is immutable; parse another ({name!r})")

    def __eq__(self, other) -> bool:
        return isinstance(other, Setting) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(("setting", self.spec))

    def __str__(self) -> str:
        return self.spec

    def __repr__(self) -> str:
        return f"Setting({self.spec!r})"

    def __reduce__(self):
        return parse_setting, (self.spec,)

    def __copy__(self) -> Setting:
        return self

    def __deepcopy__(self, memo) -> Setting:
        return self

    @property
    def active(self) -> bool:
        """Whether the setting changes anything (``none`` sends the history as it is)."""
        return self.view is not None or self.refine is not None

    def sees(self, history: list[dict]) -> Counterfactual:
        """What the model is sent: the view policy applied to the (refined) history."""
        if self.view is None:
            return Counterfactual([dict(m) for m in history], list(range(len(history))),
                                  {i: "kept" for i in range(len(history))}, "none")
        return self.view(history)

    def refine_round(self, history: list[dict]) -> tuple[list[dict], list[int]]:
        """Refine this round's observations (the tool messages after the last assistant turn) once; returns
        the new history and the indices that were refined."""
        if self.refine is None:
            return history, []
        cf = self.refine(history)
        refined = cf.indices("refined")
        if not refined:
            return history, []
        new = list(history)
        for k, i in enumerate(cf.source):
            if cf.changes[i] == "refined":
                new[i] = cf.messages[k]
        return new, refined


def parse_setting(spec: str) -> Setting:
    """``none`` | parts joined by ``+``; at most one refiner. The spec is checked and normalised first
    (:func:`attnprobe.agents.policy_specs.canonical_setting`: one spelling, so one folder, per setting) and
    ``Setting.spec`` is that canonical form; a bad spec raises ValueError naming it."""
    spec = canonical_setting(spec)
    if spec == "none":
        return NO_SETTING
    parts = spec.split("+")
    views, refines = [], []
    for part in parts:
        (refines if part.startswith("refine:") else views).append(_one(part))
    view = views[0] if len(views) == 1 else compose(*views) if views else None
    return Setting(spec, view, refines[0] if refines else None, parts)


NO_SETTING = Setting("none")  # the history as it is (seed 002's and seed 004's baseline)


def as_setting(setting: Setting | str) -> Setting:
    """``setting`` parsed (:func:`parse_setting`) unless it is one already: for Python callers, which may pass
    the spec; the CLI parses at its edge."""
    return setting if isinstance(setting, Setting) else parse_setting(setting)


def parse_settings(specs: Iterable[Setting | str]) -> list[Setting]:
    """Each spec parsed once, in order; two that mean the same setting (``mask:5`` and ``mask:05``) are refused
    naming both (:func:`attnprobe.agents.policy_specs.canonical_settings`), since they would run one setting
    twice under one folder."""
    specs = list(specs)
    canonical_settings(s.spec if isinstance(s, Setting) else s for s in specs)
    return [as_setting(s) for s in specs]


def history_link(history_id: str, cf: Counterfactual, messages: int, refined, kept: list[int] | None = None) -> dict:
    """``meta.history`` of one recorded call: the full history's id, how many of its ``messages`` existed at
    that step, for every message sent the full-history message it came from (``source``; ``kept`` picks the
    messages of ``cf`` that were sent when a scaffold drops some, e.g. IRCoT's empty turns), what the policy
    did to each message it changed (``changes``) and which of those sent were refined earlier (``refined``)."""
    source = [cf.source[k] for k in (range(len(cf.source)) if kept is None else kept)]
    return {"id": history_id, "messages": messages, "source": source,
            "changes": {str(i): s for i, s in sorted(cf.changes.items()) if s != "kept"},
            "refined": [i for i in cf.source if i in refined]}


@dataclass
class ContextHistory:
    """One agent's history under a setting: ``full`` (as the tools returned it), ``work`` (refined), the view
    sent at each step (:meth:`view`), the once-per-round refinement (:meth:`refine`) and the links."""

    setting: Setting
    id: str
    full: list[dict] = field(default_factory=list)
    work: list[dict] = field(default_factory=list)
    refined: dict[int, str] = field(default_factory=dict)  # full-history index -> the refined text
    refiner_calls: int = 0  # rounds the refiner ran on
    acted_calls: int = 0  # calls whose context the policy changed (masked, dropped or refined text sent)
    steps: list[dict] = field(default_factory=list)  # {step, call_id, messages} per recorded call

    def append(self, msg: dict) -> None:
        self.full.append(copy.deepcopy(msg))
        self.work.append(copy.deepcopy(msg))

    def __len__(self) -> int:
        return len(self.full)

    def view(self) -> Counterfactual:
        """What the model is sent now."""
        return self.setting.sees(self.work)

    def link(self, cf: Counterfactual, kept: list[int] | None = None) -> dict:
        return history_link(self.id, cf, len(self.full), self.refined, kept)

    def record_step(self, step, call_id: str, messages: int | None = None) -> None:
        """Note a recorded call: its step, id and how many history messages existed when it was made."""
        self.steps.append({"step": step, "call_id": call_id,
                           "messages": len(self.full) if messages is None else messages})

    def refine(self) -> list[int]:
        """Run the refiner once on this round's observations (none without a refiner); returns the indices
        whose text changed. Call it once per round, when the round's observations have arrived."""
        before = [m.get("content") for m in self.work]
        self.work, refined = self.setting.refine_round(self.work)
        if self.setting.refine is not None:
            self.refiner_calls += 1
        changed = []
        for i in refined:
            if self.work[i].get("content") != before[i]:
                self.refined[i] = self.work[i]["content"]
                changed.append(i)
        return changed
