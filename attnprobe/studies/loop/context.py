"""A setting's context policy inside the agent loop.

A setting is ``none`` or policies joined by ``+`` (e.g. ``ircot:oq+refine:bm25:3``):

- *view* policies (``mask:K``, ``mask-turns:K``, ``ircot:o|oq|oqp``) map the history to what the model is
  sent, afresh at every step (:func:`attnprobe.agents.policies.parse_policy`, used as is);
- a *refine* policy (``refine:bm25[:N]``, ``refine:openai:URL:MODEL``) runs once per round, right after that
  round's documents arrive: seed 004 §3.3, "in each round i, refine the context to preserve the most relevant
  information d~_i = F(q_{i-1}, d_i) to search query q_{i-1} from the latest retrieved documents d_i. d~_i is
  served as the i-th observation o_i and then appended to s_i". The refined text replaces the observation in
  the history every later step sees; the full history keeps d_i. (Applying ``refine_latest`` afresh at each
  step would instead refine only the newest observation and show older ones raw.)

Masking counts (seed 002 §2.2, "The retention window K preserves the most recent observations"): ``mask:K``
keeps the K most recent observations (one per tool message: a turn of 3 parallel calls is 3 observations);
``mask-turns:K`` keeps the observations of the K most recent tool-calling turns. Errors are exempt in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnprobe.agents.policies import Counterfactual, Policy, compose, parse_policy
from attnprobe.io import safe_name


def _one(part: str) -> Policy:
    """A view policy as :func:`parse_policy` reads it; a refiner as its latest-round form, because the
    loop runs it once per round on that round's documents (the earlier ones are refined already)."""
    if part.startswith("refine:"):
        return parse_policy("refine-latest:" + part.removeprefix("refine:"))
    return parse_policy(part)


@dataclass
class Setting:
    """A parsed setting: ``view`` (None = the history as it is) and ``refine`` (None = no refiner)."""

    spec: str
    view: Policy | None = None
    refine: Policy | None = None
    parts: list[str] = field(default_factory=list)

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
    """``none`` | parts joined by ``+``; at most one refiner. Raises ValueError with the accepted forms."""
    spec = spec.strip()
    if spec in ("none", ""):
        return Setting("none")
    parts = [p.strip() for p in spec.split("+") if p.strip()]
    views, refines = [], []
    for part in parts:
        (refines if part.startswith("refine:") else views).append(_one(part))
    if len(refines) > 1:
        raise ValueError(f"setting {spec!r}: at most one refine:... per setting")
    view = views[0] if len(views) == 1 else compose(*views) if views else None
    return Setting(spec, view, refines[0] if refines else None, parts)


def slug(spec: str) -> str:
    """A folder name for a setting (``ircot:oq+refine:bm25:3`` -> ``ircot-oq+refine-bm25-3``): readable,
    and injective through :func:`attnprobe.io.safe_name` (which hashes what is not already safe)."""
    return safe_name(spec.replace(":", "-").replace("/", "_"), "setting")
