"""Context policies: what a context-management method would have shown the model before step t.

A policy maps the messages before a step (the *prefix*) to a new message list and records, for
every original message, what it did to it (:data:`STATUSES`). Policies are plain callables
``messages -> Counterfactual`` so users can write their own (:func:`make_policy`) and chain them
(:func:`compose`). None of the shipped policies touches a system or user message (the system
prompt and the task stay as they were); they edit only assistant turns and tool observations.

Seed 002, section 2.2 (observation masking): "Observation masking replaces older observation content
with fixed placeholders while retaining tool-call structure and exempting tool-call errors. The
retention window K preserves the most recent observations; error observations remain available for
adaptive debugging. Placeholders preserve which tool was called and its arguments." Its
limitations call it a "minimal turn-based observation masking policy"; its released scaffold
(i-DeepSearch/observation-masking, tools/context_management.py) says which turns: K assistant turns
with a non-error browser call. That is ``mask:K`` (:func:`mask_archive`, with the release's placeholder
text); :func:`mask_observations` (``mask-obs:K``) counts observations instead.

Seed 004, section 3.2 (context interference, on the history state s_i = [x, a_0..a_{i-1}, o_1..o_i]
with a_i = (p_i thought, q_i query)): "IRCoT-o (w/o o_{:-1}) only incorporates the latest observation
o_i"; "IRCoT-oq (w/o o_{:-1}, q_{:-1}) with context [x, p_0, p_1, ..., p_{i-1}, q_{i-1}, o_i]";
"IRCoT-oqp (w/o o_{:-1}, q_{:-1}, p_{:-1}) relies exclusively on the latest thinking, search query,
and observation as context [x, p_{i-1}, q_{i-1}, o_i]". Section 3.3 (refinement): a refiner F, "in each
round i, refine[s] the context to preserve the most relevant information d~_i = F(q_{i-1}, d_i) to
search query q_{i-1} from the latest retrieved documents d_i. d~_i is served as the i-th observation o_i
and then appended to s_i": every observation the model sees was refined in its own round, so
:func:`refine_rounds` (``refine:...``) refines each observation with the query that produced it, and
:func:`refine_latest` (``refine-latest:...``) only the latest round's.

Mapping onto OpenAI-format trajectories: a thought p is an assistant message's text (``content``
and ``reasoning_content``), a query q its ``tool_calls``, an observation o a ``tool`` message; "the
latest" is the latest *round* (:func:`rounds`): the last assistant message that made a call and the tool
messages that answer it (all of them when it made parallel calls). Invalid turns and their feedback belong
to the round in progress, so they never hide its documents (DESIGN.md §10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnprobe.agents.edits import (  # noqa: F401  (the policy interface, re-exported: one import for users)
    STATUSES,
    Counterfactual,
    Edit,
    Policy,
    apply_edits,
    arguments_text,
    calls_by_id,
    compose,
    default_is_error,
    make_policy,
    turns_of_observations,
)
from attnprobe.agents.masking import (  # noqa: F401  (seed 002's policies, parsed below)
    ARCHIVE_PLACEHOLDER,
    DEFAULT_PLACEHOLDER,
    archive_placeholder,
    mask_archive,
    mask_observations,
)
from attnprobe.agents.policy_specs import IRCOT_VARIANTS, canonical_policy
from attnprobe.trajectory.schema import call_arguments, message_text

# ------------------------------------------------------------------ seed 004: IRCoT variants, on rounds


@dataclass
class Rounds:
    """A history cut into seed 004's rounds (DESIGN.md §10). A round is an assistant turn that issued a
    retrieval (``tool_calls``) plus the tool messages answering it. An invalid turn (an assistant message
    with no call, e.g. neither ``<search>`` nor ``<answer>``) and the feedback after it (user messages after
    the first assistant message: Search-R1's "My previous action is invalid...", the NIS-Agent worker's
    no-call hint) belong to the round in progress, so they never make that round's documents "not the
    latest". ``task``: the leading system/user messages (x); ``latest``: the assistant message that opened
    the latest round (None before the first retrieval); ``latest_obs``: its observations; ``after``: what
    followed the latest round's observations (invalid turns and their feedback)."""

    task: list[int]
    latest: int | None
    latest_obs: list[int]
    after: list[int]


def rounds(messages: Sequence[dict]) -> Rounds:
    first_assistant = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    task = [i for i in range(first_assistant) if messages[i]["role"] in ("system", "user", "developer")]
    latest = next((i for i in range(len(messages) - 1, -1, -1)
                   if messages[i]["role"] == "assistant" and messages[i].get("tool_calls")), None)
    if latest is None:
        return Rounds(task, None, [], [i for i in range(first_assistant, len(messages))])
    ids = {c.get("id") for c in messages[latest]["tool_calls"]}
    obs, after = [], []
    for j in range(latest + 1, len(messages)):
        m = messages[j]
        # observations answering the latest call (by id, or any tool message when ids are missing)
        if m["role"] == "tool" and (not m.get("tool_call_id") or m.get("tool_call_id") in ids or None in ids):
            obs.append(j)
        else:
            after.append(j)
    return Rounds(task, latest, obs, after)


def ircot(variant: str = "o") -> Policy:
    """Seed 004 section 3.2 on rounds (:func:`rounds`): ``o`` keeps every thought and query and the latest
    round's documents (every other observation removed); ``oq`` keeps every thought, the latest query and
    its documents (earlier turns lose their tool calls; one with no text left is removed whole); ``oqp``
    keeps the task, the latest round, and any invalid turn and feedback after it (everything else removed).
    Invalid turns never replace a round, so after ``[x, a1(q1), o1, a_bad, feedback]`` every variant still
    shows q1's documents o1. Before the first retrieval no variant changes anything."""
    if variant not in IRCOT_VARIANTS:
        raise ValueError(f"ircot variant must be one of {', '.join(IRCOT_VARIANTS)}, not {variant!r}")

    def edits(messages: Sequence[dict]) -> dict[int, Edit]:
        r = rounds(messages)
        if r.latest is None:
            return {}
        keep = set(r.task) | {r.latest} | set(r.latest_obs) | set(r.after)
        out: dict[int, Edit] = {}
        for i, m in enumerate(messages):
            if i in keep:
                continue
            if m["role"] == "tool" or variant == "oqp":
                out[i] = ("removed", None)
            elif variant == "oq" and m["role"] == "assistant" and m.get("tool_calls"):
                has_text = message_text(m.get("content")).strip() or (m.get("reasoning_content") or "").strip()
                out[i] = ("calls_removed", {k: v for k, v in m.items() if k != "tool_calls"}) \
                    if has_text else ("removed", None)
        return out

    return make_policy(f"ircot:{variant}", edits)


# ------------------------------------------------------------------ seed 004: refiners
Refiner = Callable[[str, str], str]
"""``refiner(query, document) -> refined document`` (seed 004's F(q_{i-1}, d_i))."""


def refine_query(messages: Sequence[dict], last: int, observation: dict) -> str:
    """The query a refiner selects against for an observation answering assistant message ``last``:
    the ``query`` argument of the call it answers, else every argument value plus that message's
    thought (a visit_page URL alone says little)."""
    calls = calls_by_id(messages)
    call = calls.get(observation.get("tool_call_id") or "")
    if call is None:
        cs = messages[last].get("tool_calls") or []
        call = cs[0] if len(cs) == 1 else None
    args: Any = {}
    if call:
        args = call_arguments({"arguments": arguments_text(call)}, on_error="raw")
    if isinstance(args, dict) and isinstance(args.get("query"), str):
        return args["query"]
    thought = " ".join(x for x in (messages[last].get("reasoning_content") or "",
                                   message_text(messages[last].get("content"))) if x)
    values = " ".join(str(v) for v in (args.values() if isinstance(args, dict) else [args]))
    return f"{values} {thought}".strip()


def extractive_selection(original: str, refined: str) -> dict:
    """Which sentences of ``original`` (:func:`attnprobe.agents.refiners.split_sentences`)
    the refined text consists of: ``{"extractive": True, "sentences": [...], "kept": [indices]}``
    when every refined sentence is an original one (matched in order, each used once), else
    ``{"extractive": False}``. With it the analysis can split the original attention on a refined
    observation into the text the refiner dropped and the text it kept (``counterfactual.refined``)."""
    from attnprobe.agents.refiners import split_sentences

    sents, out = split_sentences(original), split_sentences(refined)
    kept: list[int] = []
    for r in out:
        j = next((j for j in range(kept[-1] + 1 if kept else 0, len(sents)) if sents[j] == r), None)
        if j is None:
            j = next((j for j in range(len(sents)) if sents[j] == r and j not in kept), None)
        if j is None:
            return {"extractive": False}
        kept.append(j)
    return {"extractive": True, "sentences": sents, "kept": sorted(kept)}


def refine_rounds(refiner: Refiner, *, name: str = "refine", latest_only: bool = False) -> Policy:
    """Seed 004 section 3.3: every observation d_i is replaced by ``refiner(q_{i-1}, d_i)``, with the
    query of the call that produced it (status ``refined``; ``kept`` when the refiner returns the
    text unchanged). ``latest_only``: only the observations answering the last assistant message
    (the old behaviour, ``refine-latest:...``). ``details["refined"][str(i)]`` records, per refined
    message, the query and :func:`extractive_selection` (which original sentences were kept)."""

    def policy(messages: Sequence[dict]) -> Counterfactual:
        answers = turns_of_observations(messages)
        last = rounds(messages).latest
        out: dict[int, Edit] = {}
        info: dict[str, dict] = {}
        for i, a in answers.items():
            if a < 0 or (latest_only and a != last):
                continue
            msg = messages[i]
            text = message_text(msg.get("content"))
            query = refine_query(messages, a, msg)
            new_text = refiner(query, text)
            if not isinstance(new_text, str):
                raise TypeError(f"refiner returned {type(new_text).__name__}, expected str")
            if new_text != text:
                new = {k: v for k, v in msg.items() if k != "annotations"}
                new["content"] = new_text
                out[i] = ("refined", new)
                info[str(i)] = {"query": query, **extractive_selection(text, new_text)}
        return apply_edits(messages, out, policy=name, details={"refined": info} if info else {})

    policy.name = name  # type: ignore[attr-defined]
    return policy


def refine_latest(refiner: Refiner, *, name: str = "refine-latest") -> Policy:
    """:func:`refine_rounds` on the latest round only: the observations answering the last assistant
    message (``refine-latest:...``; not the seed's protocol, kept for comparison)."""
    return refine_rounds(refiner, name=name, latest_only=True)


# ------------------------------------------------------------------ the CLI's policy names
def parse_policy(spec: str) -> Policy:
    """``mask:K`` (seed 002's released rule: successful results older than the K-th most recent turn with a
    non-error call are archived, :func:`mask_archive`) | ``mask-obs:K`` (the K most recent observations,
    :func:`mask_observations`) | ``ircot:o`` | ``ircot:oq`` | ``ircot:oqp`` | ``refine:bm25[:N]`` (every
    observation refined with its own query to its N best sentences, default 3) | ``refine:openai:BASE_URL:MODEL``
    (an OpenAI-compatible refiner) | ``refine-latest:...`` (the same, latest observations only).
    The spec is checked and normalised first (:func:`attnprobe.agents.policy_specs.canonical_policy`: one
    spelling per policy); a bad spec raises :class:`~attnprobe.agents.policy_specs.PolicySpecError` naming the value."""
    from attnprobe.agents.refiners import bm25_refiner, openai_refiner

    spec = canonical_policy(spec)
    kind, _, arg = spec.partition(":")
    if kind in ("mask", "mask-obs"):
        return mask_archive(int(arg)) if kind == "mask" else mask_observations(int(arg))
    if kind == "ircot":
        return ircot(arg)
    latest = kind == "refine-latest"
    sub, _, rest = arg.partition(":")
    if sub == "bm25":
        return refine_rounds(bm25_refiner(int(rest)), name=spec, latest_only=latest)
    base, _, model = rest.rpartition(":")
    return refine_rounds(openai_refiner(base, model), name=f"{kind}:openai:{model}", latest_only=latest)


def policy_name(policy: Policy) -> str:
    return getattr(policy, "name", None) or getattr(policy, "__name__", "policy")


def policy_rule(spec: str) -> dict | None:
    """What a masking spec does, for study.json and the runner's settings (a study says which rule it used):
    ``{"rule", "placeholder"}`` for ``mask:K`` and ``mask-obs:K``, None for any other policy."""
    kind = spec.partition(":")[0]
    if kind == "mask":
        return {"rule": "seed 002 release (i-DeepSearch/observation-masking tools/context_management.py): "
                        "successful results before the K-th most recent assistant turn with a non-error call "
                        "are archived; errors never; K <= 0 archives nothing",
                "placeholder": ARCHIVE_PLACEHOLDER}
    if kind == "mask-obs":
        return {"rule": "the K most recent non-error observations (tool messages) stay; errors never masked",
                "placeholder": DEFAULT_PLACEHOLDER}
    return None


def setting_rules(setting: str) -> dict:
    """:func:`policy_rule` of every masking part of a setting (``none`` or parts joined by ``+``)."""
    out = {}
    for part in (p.strip() for p in setting.split("+")):
        rule = policy_rule(part)
        if rule is not None:
            out[part] = rule
    return out


# ------------------------------------------------------------------ which steps a policy is measured at
MIN_PAST = {"ircot": 2, "refine": 1, "refine-latest": 1}
"""Default ``--min-past`` of the families whose first acting step does not depend on K. IRCoT: 2, since
with one past round there is no earlier round to drop. Refiners: 1 (the first observation is already
refined). Masking depends on K: :func:`min_past_of`."""


def min_past_of(name: str) -> int:
    """The default ``--min-past`` of one policy name: the first step at which it can change the context.

    ``mask:K``: K + 1 past turns. It archives a result only when an earlier counted turn precedes the K-th
    most recent one, so it needs K + 1 turns with a call, and acts at the first step that has them (mask:1
    masks the first result at 2 past turns). ``mask:0`` never acts; 1. ``mask-obs:K``: K + 1 as well. With
    one call per turn that is exactly its first acting step; with parallel calls it can act earlier (K + 1
    observations may come in fewer turns), but it is measured on the steps of the released rule with the
    same K, so the two counts are compared at the same steps (``--min-past`` lowers it). IRCoT 2,
    refiners 1 (:data:`MIN_PAST`); a user-named policy 5 (seed 002 E.5's "at least five past turns")."""
    kind, _, arg = name.partition(":")
    if kind in ("mask", "mask-obs"):
        try:
            return int(arg) + 1
        except ValueError:
            return 5
    return MIN_PAST.get(kind, 5)


def default_min_past(policies: Policy | str | Sequence[Policy | str]) -> int:
    """The default minimum number of past turns for a run of ``policies`` (specs or policy objects):
    :func:`min_past_of` per part (a composed ``a+b`` counts each part). One run has one step set, so for
    several policies the rule is the **smallest** default: no policy loses a step it would get in a run of
    its own; the others then also meet steps where they change nothing (those count in ``steps`` but not
    in ``steps_changed``)."""
    items = [policies] if isinstance(policies, str) or callable(policies) else list(policies)
    if not items:
        raise ValueError("default_min_past: no policy given")
    vals = []
    for p in items:
        name = p if isinstance(p, str) else policy_name(p)
        vals.extend(min_past_of(part) for part in name.split("+"))
    return min(vals)
