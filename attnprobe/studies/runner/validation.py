"""Isolation-based stepwise validation (seed 000, section 4.2 and Figure 3).

Stage 1 rebuilds, from the manager's memory (task + tool calls + observations, labelled T, O1..On),
a labelled reasoning chain S1..Sk in which every step cites its premises; the last step states the
answer (one is appended, citing every step, when the chain does not end with the proposed answer).
Stage 2 checks each step in isolation: a fresh context holds only the step and the texts of the
premises it cites, and the model returns VALID or INVALID with a suggestion; "If all steps are valid,
it confirms the final answer as correct" (4.2). Optional and ours (``RunSettings.final_check``, off by
default): a final, task-aware check that sees only the task, the steps' claims and the proposed answer
and asks whether the answer answers the task (right entity, unit, format). The manager sees the
outcome and decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from attnprobe.agents.answers import normalize_answer as normalize

STAGE1_SYSTEM = (
    "You reorganise an agent's work into a numbered reasoning chain. Write one step per line, in the form\n"
    "S1: <a claim> (from: O1)\nS2: <a claim> (from: S1, O2)\n"
    "Each step cites the labels it relies on: T is the task, O1, O2, ... are observations, S1, S2, ... earlier "
    "steps. The last step states the answer."
)
STAGE2_SYSTEM = (
    "You check one reasoning step. Use only the premises given. Reply 'VALID' if the inference follows from them, "
    "otherwise 'INVALID: ' followed by a short suggestion."
)

FINAL_SYSTEM = (
    "You check whether a proposed answer actually answers a task. Use only the task, the reasoning steps and the "
    "answer given. The answer must be of the kind the task asks for: the right entity, a number in the asked unit, "
    "a date or year when a time is asked, in the asked format, and supported by the steps. Reply 'VALID' if it is, "
    "otherwise 'INVALID: ' followed by a short suggestion."
)

# No two adjacent optional runs can share a character (as \s*,?\s* or \s*\**\s* did): the old patterns
# backtracked exponentially on model text ("(T  T  T ..." of 2 KB never finished, 400 spaces took 0.6 s).
# Same matches (checked on 400,000 random lines); a step's claim is group 2 without trailing whitespace.
_STEP = re.compile(r"^\s*(?:[*#>-]+(?:\s+\*+)?\s*)?(S\s?\d+|Answer)\s*(?:\*+\s*)?[:.)\-]\s*(.+)$", re.I)
_CITE = re.compile(r"[(\[]\s*(?:(?:from|cites?|premises?|sources?|based on|by)\s*)?(?::\s*)?"
                   r"((?:[TSO]\d*\s*(?:,\s*)?(?:and\s*)?)+)[)\]]\s*(?:\.\s*)?$", re.I)
_LABEL = re.compile(r"\b(T|O\d+|S\d+)\b", re.I)


@dataclass
class Step:
    label: str
    claim: str
    cites: list[str] = field(default_factory=list)


def memory_items(task: str, observations: list[tuple[str, str]]) -> dict[str, str]:
    """Label -> text: T for the task, O1..On for (action, observation) pairs of the manager's memory."""
    items = {"T": task}
    for i, (action, obs) in enumerate(observations, 1):
        items[f"O{i}"] = f"{action} returned: {obs}"
    return items


def stage1_messages(task: str, answer: str, items: dict[str, str]) -> list[dict]:
    memory = "\n".join(f"[{k}] {v}" for k, v in items.items())
    return [
        {"role": "system", "content": STAGE1_SYSTEM},
        {"role": "user", "content": f"Task: {task}\n\nProposed answer: {answer}\n\nMemory:\n{memory}\n\n"
                                    "Write the reasoning chain."},
    ]


def parse_chain(text: str, items: dict[str, str], answer: str) -> tuple[list[Step], bool]:
    """Parse 'Sk: claim (from: ...)' lines. Returns (steps, parsed); if nothing parses, a single step
    stating the proposed answer and citing the whole memory is returned with parsed=False."""
    steps: list[Step] = []
    for line in text.splitlines():
        m = _STEP.match(line)
        if not m:
            continue
        stated = claim = m.group(2).rstrip() or m.group(2)
        cites: list[str] = []
        c = _CITE.search(claim)
        if c:
            cites = [x.upper() for x in _LABEL.findall(c.group(1))]
            claim = claim[: c.start()].strip()
        label = f"S{len(steps) + 1}"
        known = set(items) | {s.label for s in steps}
        steps.append(Step(label, claim or stated, [x for x in dict.fromkeys(cites) if x in known]))
    if not steps:
        return [Step("S1", f"The answer to the task is {answer}.", list(items))], False
    return steps, True


def with_answer_step(steps: list[Step], answer: str) -> tuple[list[Step], bool]:
    """``steps`` ending with a step that states ``answer``: the last step if its claim contains the
    normalised answer, else an appended step citing every step (returns (steps, appended))."""
    norm = normalize(answer)
    if steps and norm and norm in normalize(steps[-1].claim):
        return steps, False
    label = f"S{len(steps) + 1}"
    return [*steps, Step(label, f"The answer to the task is {answer}.", [s.label for s in steps] or ["T"])], True


def steps_to_check(steps: list[Step], cap: int) -> tuple[list[Step], list[str]]:
    """At most ``cap`` steps, always including the last (answer) step: the first cap-1 and the last.
    Returns (steps to check, labels left unchecked)."""
    if len(steps) <= cap:
        return list(steps), []
    keep = [*steps[: cap - 1], steps[-1]]
    return keep, [s.label for s in steps[cap - 1:-1]]


def premises_for(step: Step, items: dict[str, str], steps: list[Step]) -> dict[str, str]:
    """Only the premises the step cites (T when it cites nothing: a claim must rest on something)."""
    by_label = {s.label: s.claim for s in steps}
    out = {}
    for label in step.cites or ["T"]:
        if label in items:
            out[label] = items[label]
        elif label in by_label:
            out[label] = by_label[label]
    return out


def stage2_messages(step: Step, premises: dict[str, str]) -> list[dict]:
    prem = "\n".join(f"[{k}] {v}" for k, v in premises.items())
    return [
        {"role": "system", "content": STAGE2_SYSTEM},
        {"role": "user", "content": f"Premises:\n{prem}\n\nInference [{step.label}]: {step.claim}\n\n"
                                    "Does the inference follow from the premises alone?"},
    ]


def final_messages(task: str, answer: str, steps: list[Step]) -> list[dict]:
    """The task-aware final check: the task, the steps' claims (no observations) and the answer."""
    claims = "\n".join(f"{s.label}: {s.claim}" for s in steps)
    return [
        {"role": "system", "content": FINAL_SYSTEM},
        {"role": "user", "content": f"Task: {task}\n\nReasoning steps:\n{claims}\n\nProposed answer: {answer}\n\n"
                                    "Does the proposed answer answer the task?"},
    ]


def parse_verdict(text: str) -> tuple[str, str]:
    """('valid' | 'invalid' | 'unclear', suggestion)."""
    t = text.strip()
    up = t.upper()
    if "INVALID" in up or "NOT VALID" in up or up.startswith("NO"):
        i = up.find("INVALID")
        sugg = t[i + len("INVALID"):].lstrip(" :.-") if i >= 0 else t
        return "invalid", sugg[:300] or "the inference does not follow from its premises"
    if "VALID" in up or up.startswith("YES"):
        return "valid", ""
    return "unclear", t[:300]


def chain_text(steps: list[Step]) -> str:
    return "\n".join(f"{s.label}: {s.claim}" + (f" (from: {', '.join(s.cites)})" if s.cites else "") for s in steps)
