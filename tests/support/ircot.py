"""The IRCoT scripted-agent constants shared by the loop, round and tag-text tests: one question, two fixed
document blocks (tests/support/fixed_search.py returns them) and the agent's three replies."""

from __future__ import annotations

from attnprobe.studies.loop.prompts import IRCOT_PROMPT

Q = {"id": "t1", "question": "What is the answer?", "answers": ["42"]}
D1 = "Doc 1(Title: A) Alpha one. Alpha two.\nDoc 2(Title: B) Beta one."
D2 = "Doc 1(Title: C) Gamma one. Answer is 42.\nDoc 2(Title: B) Beta one."
R1 = "<think>p0</think><search>q1 first</search>"
R2 = "<think>p1</think><search>q2 second</search>"
R3 = "<think>p2</think><answer>42</answer>"
U = {"role": "user", "content": IRCOT_PROMPT.format(question=Q["question"])}


def A(text: str) -> dict:
    return {"role": "assistant", "content": text}


def info(text: str) -> dict:
    return {"role": "user", "content": f"<information>{text}</information>"}
