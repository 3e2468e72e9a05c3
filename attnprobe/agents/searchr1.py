"""Search-R1's single growing sequence: what its generation manager feeds the model, token for token.

Source: ``PeterGriffinJin/Search-R1`` at commit a14dc3a (``search_r1/llm_agent/generation.py``, cited below as
``generation.py:LINE``; its evaluation settings in ``scripts/nq_hotpotqa/evaluate.sh``). Seed 004's agent is
"implemented based on" Search-R1; docs/methods.md ("The Search-R1 stream") quotes each rule.

- The chat template is applied once, to the one user message (``verl/utils/dataset/rl_dataset.py:128-139``:
  ``apply_chat_template(chat, add_generation_prompt=True, tokenize=False)``, then tokenized with
  ``add_special_tokens=False``); everything after it is appended as token ids, with no turn markers.
- A reply is decoded without special tokens, cut after its first ``</search>``, else after its first
  ``</answer>``, and tokenized again (``generation.py:56-75``): the end-of-sequence token is not appended.
- Its action is the first ``<(search|answer)>(.*?)</\\1>`` match, stripped (``generation.py:422-429``): an
  empty ``<search></search>`` is a search (for the empty query).
- A search appends ``\\n\\n<information>{documents.strip()}</information>\\n\\n``, an invalid action the
  invalid-action text (:data:`INVALID`), an answer ends the episode (``generation.py:385-401``); the
  observation is tokenized alone and cut to its first ``max_obs_tokens`` tokens (500, ``generation.py:80-89``):
  a cut block loses its closing tag.
- The model is sent the last ``max_prompt_tokens`` tokens of the sequence (4,096: ``generation.py:107-112``).
- After ``max_turns`` turns, one more generation without search (``generation.py:278-310``): its reply is
  appended, a search in it is not run (the loop: :meth:`attnprobe.studies.loop.agents.Loop._stream`).
- The answer: Search-R1 scores the last ``<answer>`` of prompt + sequence, none when there are fewer than two
  (``verl/utils/reward_score/qa_em.py:62-82``, :func:`final_answer`). Its prompt holds two (``<answer> and
  </answer>`` and ``<answer> Beijing </answer>``), so a rollout that never answers is scored as "Beijing". Ours
  (:meth:`Stream.answer`): the last ``<answer>`` of the sequence after the prompt, none without one (the same EM
  except on a question whose gold answer is "Beijing"; "no answer" stays countable).

The tokenizer is any Hugging Face tokenizer (``apply_chat_template``, ``__call__``, ``decode``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from attnprobe.trajectory.schema import message_text
from attnprobe.trajectory.tags import scan

# scripts/nq_hotpotqa/evaluate.sh: data.max_prompt_length=4096, data.max_response_length=500,
# data.max_obs_length=500, max_turns=4, retriever.topk=3
MAX_PROMPT_TOKENS = 4096
MAX_RESPONSE_TOKENS = 500
MAX_OBS_TOKENS = 500
MAX_TURNS = 4
TOP_K = 3

# generation.py:396-398, verbatim (the backslash continuations join the lines with no space added)
INVALID = ("\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
           "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
           "Let me try again.\n")
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)  # generation.py:422
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)  # qa_em.py:73


def question(text: str) -> str:
    """scripts/data_process/nq_search.py:61-63: the question stripped, with a ``?`` added when it has none."""
    text = text.strip()
    return text if text.endswith("?") else text + "?"


def cut_reply(text: str) -> str:
    """generation.py:61-66: up to and including the first ``</search>``, else the first ``</answer>``."""
    if "</search>" in text:
        return text.split("</search>")[0] + "</search>"
    if "</answer>" in text:
        return text.split("</answer>")[0] + "</answer>"
    return text


def parse_action(text: str) -> tuple[str | None, str]:
    """generation.py:420-429: (``"search"`` | ``"answer"`` | None, the stripped content of the first match)."""
    m = _ACTION.search(text)
    return (m.group(1), m.group(2).strip()) if m else (None, "")


def information(documents: str) -> str:
    """generation.py:391: the observation a search appends."""
    return f"\n\n<information>{documents.strip()}</information>\n\n"


def passages(results: list[tuple[str, str]]) -> str:
    """generation.py:460-469 (``_passages2string``): ``Doc i(Title: title) text`` and a newline per passage,
    the text as the retriever returned it (its own newlines kept)."""
    return "".join(f"Doc {i}(Title: {title}) {text}\n" for i, (title, text) in enumerate(results, 1))


def final_answer(sequence: str) -> str | None:
    """qa_em.py:62-82 (``extract_solution``) over the decoded prompt + sequence: the last ``<answer>``; None
    when there are fewer than two. Search-R1's prompt alone holds two, so this is "Beijing" for a sequence that
    never answers (kept to state the difference; the loop uses :meth:`Stream.answer`)."""
    found = list(_ANSWER.finditer(sequence))
    return found[-1].group(1).strip() if len(found) > 1 else None


@dataclass
class Piece:
    """A run of the sequence: ``kind`` prompt | reply | information | invalid; ``step`` the model call that
    wrote it (reply) or answered (an observation follows its reply's step); the prompt is step 0."""

    kind: str
    text: str
    ids: list[int]
    step: int
    cut: int = 0  # tokens an observation lost to max_obs_tokens


@dataclass
class Stream:
    """One episode's sequence. :meth:`model_input` is what the model is sent; :meth:`add_reply` appends a
    reply and returns its action; :meth:`add_observation` appends what the environment answers."""

    tokenizer: object
    prompt: str  # the user message (Search-R1's prompt with the question)
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    max_obs_tokens: int = MAX_OBS_TOKENS
    pieces: list[Piece] = field(default_factory=list)

    def __post_init__(self):
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": self.prompt}],
                                                  add_generation_prompt=True, tokenize=False)
        self.pieces = [Piece("prompt", text, self._ids(text), 0)]
        if len(self.pieces[0].ids) > self.max_prompt_tokens:  # rl_dataset.py:134-139 with truncation='error'
            raise ValueError(f"the prompt is {len(self.pieces[0].ids)} tokens, over the {self.max_prompt_tokens} "
                             "Search-R1 sends (its dataset refuses such a prompt)")

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def ids(self) -> list[int]:
        return [t for p in self.pieces for t in p.ids]

    def model_input(self) -> list[int]:
        """The tokens the model is sent: the sequence's last ``max_prompt_tokens``."""
        ids = self.ids
        return ids[-self.max_prompt_tokens:]

    def dropped(self) -> int:
        """Tokens at the sequence's start the model is not sent (left truncation)."""
        return max(0, len(self.ids) - self.max_prompt_tokens)

    @property
    def steps(self) -> int:
        return sum(p.kind == "reply" for p in self.pieces)

    def add_reply(self, generated: str) -> tuple[str | None, str]:
        """Append a reply (its text decoded without special tokens) as Search-R1 does; returns its action."""
        text = cut_reply(generated)
        self.pieces.append(Piece("reply", text, self._ids(text), self.steps + 1))
        return parse_action(text)

    def add_observation(self, text: str, kind: str = "information") -> None:
        """Append an observation (:func:`information` or :data:`INVALID`), cut to ``max_obs_tokens`` tokens."""
        ids = self._ids(text)
        cut = max(0, len(ids) - self.max_obs_tokens)
        if cut:
            ids = ids[:self.max_obs_tokens]
            text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        self.pieces.append(Piece(kind, text, ids, self.steps, cut))

    def answer(self) -> str | None:
        """The last ``<answer>`` the model wrote (in the sequence after the prompt; see the module docstring for
        how Search-R1's scorer differs), None without one."""
        found = list(_ANSWER.finditer(self.text()))
        return found[-1].group(1).strip() if found else None

    @property
    def prompt_text(self) -> str:
        return self.pieces[0].text

    def text(self, end: int | None = None) -> str:
        """The pieces after the prompt (up to piece ``end``) as one assistant text."""
        return "".join(p.text for p in self.pieces[1:end])

    def recorded(self, end: int | None = None) -> list[dict]:
        """The sequence up to piece ``end`` (a reply: the call that wrote it) as a recorded call's messages: the
        user message and one assistant message holding everything after the prompt, with ``annotations``
        (:func:`annotations`), ``reply_start`` (where the last reply begins: the text before it is what the
        model read after the prompt) and ``pieces`` (where each piece begins: the renderer tokenizes them apart,
        :mod:`attnprobe.render.pieces`, so a capture sees the ids the model was sent)."""
        pieces = self.pieces[1:end]
        text = self.text(end)
        starts, pos = [], 0
        for p in pieces:
            starts.append(pos)
            pos += len(p.text)
        msg: dict = {"role": "assistant", "content": text, "annotations": annotations(pieces), "pieces": starts}
        if pieces and pieces[-1].kind == "reply":
            msg["reply_start"] = len(text) - len(pieces[-1].text)
        return [{"role": "user", "content": self.prompt}, msg]


def from_history(tokenizer, messages: list[dict], **limits) -> Stream:
    """The sequence of a history in rounds form (the loop's, as a context policy left it: the first message
    the prompt; an assistant turn its ``reply_text``, else its ``tag_text`` while it holds its query, else its
    ``content``; a ``tool`` message its documents as :func:`information`; a later user message the
    invalid-action text). With no policy this is the sequence :func:`episode` builds, piece for piece."""
    stream = Stream(tokenizer, message_text(messages[0].get("content")), **limits)
    for m in messages[1:]:
        if m["role"] == "assistant":
            text = m["reply_text"] if "reply_text" in m else \
                m.get("tag_text") if m.get("tool_calls") else message_text(m.get("content"))
            stream.add_reply(text)
        elif m["role"] == "tool":
            stream.add_observation(information(message_text(m.get("content"))))
        else:
            stream.add_observation(message_text(m.get("content")), "invalid")
    return stream


def annotations(pieces: list[Piece]) -> list[dict]:
    """Labels of the assistant text (the pieces after the prompt, in order): each reply ``reasoning`` (self)
    and its ``<search>`` spans ``tool_call`` (self); each observation ``observation`` (external), the invalid-
    action text ``task`` (external, as the multi-turn form sends it as a user message). ``turn``: the step
    minus 1 (a turn holds a reply and what answers it), so the first reply shares turn 0 with the task."""
    out, pos = [], 0
    for p in pieces:
        end = pos + len(p.text)
        turn = max(p.step - 1, 0)
        if p.text.strip():
            if p.kind == "reply":
                out.append({"start": pos, "end": end, "role": "reasoning", "author": "self", "turn": turn})
                spans, _ = scan(p.text, searches=True, information=False)
                out += [{**s.annotation(), "start": pos + s.start, "end": pos + s.end, "turn": turn} for s in spans]
            else:
                role = "observation" if p.kind == "information" else "task"
                out.append({"start": pos, "end": end, "role": role, "author": "external", "turn": turn})
        pos = end
    return out
