"""The two scaffolds of the seeds, run with a context policy applied inside the loop.

Both keep the history in OpenAI form (assistant turns with ``tool_calls``, ``tool`` observations), so the
context policies of :mod:`attnprobe.agents.policies` apply to it unchanged, and keep two copies:
``full`` (every observation as the tool returned it) and ``work`` (observations replaced by the refiner's
output, when the setting has one). At every step the setting's view of ``work`` is what the model is sent.

- ``seed002`` (seed 002 §2.2-2.3, §3.2, appendix C): one agent with ``search`` / ``open`` / ``find`` over an
  append-only page pool (:mod:`.pool`), native tool calls, several calls per reply run in order and each
  answered by its own observation. A reply without a tool call is the final response; its ``Exact Answer:``
  line is the answer.
- ``ircot`` (seed 004 §2, §3.1): the model writes ``<think>``, ``<search>`` and ``<answer>`` tags (parsed by
  :func:`attnprobe.generation.toolparse.parse_tags`); each query retrieves ``top_k`` passages (seed 004:
  "The number of retrieved passages K is set to 3"). The model is sent the history *as tag text*: an
  assistant turn is its own text up to ``</search>``, an observation a user message
  ``<information>...</information>``; a turn whose query a policy removed (IRCoT-oq) is sent without its
  ``<search>`` span. The first query of a reply is run (Search-R1 stops generating at ``</search>``).
  The recorded call labels that text with ``annotations`` (:func:`attnprobe.agents.tagtext.as_tags`):
  ``<information>`` blocks are observations, ``<search>`` spans (the reply's too) tool calls, the rest
  reasoning; the model is sent the text only. The full history keeps each turn's ``tag_text``, so the
  counterfactuals see the tag text too (:func:`attnprobe.agents.tagtext.agent_view`).
  After ``max_turns`` turns without an answer, one final call (Search-R1's final rollout) where only
  ``<answer>`` counts. The IRCoT variants act on rounds (:func:`attnprobe.agents.policies.rounds`): an
  invalid turn and its feedback belong to the round in progress.

Every model call is recorded as a trajectory holding exactly the messages sent plus the reply
(``capture`` and ``counterfactual`` read it as is); ``meta.history`` links it to the full history:
how many of its messages existed at that step and, for every message sent, the full-history message it
came from (``source``) and what the policy did to each (``changes``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from attnprobe.agents import searchr1
from attnprobe.agents.context import ContextHistory, Setting
from attnprobe.agents.policies import setting_rules
from attnprobe.agents.recorder import call_record
from attnprobe.agents.search import CORPUS_HELP, SEARCH_HELP, SEARCH_KINDS, SearchBackend, corpus_identity
from attnprobe.agents.tagtext import annotate_reply, as_tags, unlabelled
from attnprobe.generation.chat import RAW_ARGUMENTS, ActionFormat, ChatReply, ChatRequest
from attnprobe.generation.toolparse import native_turn, parse_tags
from attnprobe.io.options import option, positive_int
from attnprobe.io.settings import as_recorded
from attnprobe.io.urls import redact
from attnprobe.studies.loop.pool import TOOLS, Browser
from attnprobe.studies.loop.prompts import (
    IRCOT_INVALID,
    IRCOT_PROMPT,
    SEED002_TASK,
    prompts_hash,
    seed002_system,
    template_family,
)
from attnprobe.studies.loop.scoring import extract_answer, extract_confidence
from attnprobe.trajectory.schema import message_text
from attnprobe.trajectory.tags import removed

SCAFFOLDS = ("ircot", "seed002")
# How the ircot scaffold sends its history: "stream", Search-R1's one growing sequence (attnprobe.agents.searchr1,
# the default: seed 004's agent is "implemented based on" Search-R1), or "chat", ours: one assistant message per
# turn, documents and the invalid-action reply as user messages (the form of every study before the Search-R1 stream).
IRCOT_FORMS = ("stream", "chat")
# per scaffold: (turn limit, passages or results per search). seed 004: K = 3; seed 002 (appendix C):
# "Default search top-k is 15"; the seed's 500-turn limit is far beyond what a small model uses.
DEFAULTS = {"ircot": (searchr1.MAX_TURNS, searchr1.TOP_K), "seed002": (10, 15)}  # Search-R1: evaluate.sh
# per scaffold: (output tokens per model call, temperature). seed 002 appendix C: "8192 output tokens per
# turn and temperature 1.0 are the default generation settings", as in its release (agents/deepseek_agent.py,
# agents/gptoss_agent.py: max_tokens 8192, temperature 1.0). IRCoT: ours (seed 004 gives no generation
# settings), short greedy turns; the Search-R1 stream: its evaluation's 500 reply tokens
# (scripts/nq_hotpotqa/evaluate.sh: data.max_response_length=500), greedy (its validation: do_sample False).
GENERATION = {"ircot": (128, 0.0), "ircot-stream": (searchr1.MAX_RESPONSE_TOKENS, 0.0), "seed002": (8192, 1.0)}
# --generation-preset cpu: the bundled 135M model on a CPU in minutes (ours, not a seed's setting): short greedy turns.
PRESETS = {"cpu": {"max_new_tokens": 128, "temperature": 0.0}}


@dataclass
class LoopConfig:
    """Everything besides the setting that decides a run (a finished run is reused only when equal).

    ``max_new_tokens`` / ``temperature`` left None take the ``preset``'s values, else the scaffold's
    (:data:`GENERATION`); explicit values win over both."""

    scaffold: str = option("ircot", flag="--scaffold", choices=SCAFFOLDS,
                           help="ircot: seed 004's tag agent (default); seed002: seed 002's search/open/find agent")
    max_turns: int | None = option(  # None: the scaffold's (DEFAULTS)
        None, flag="--max-turns", type=positive_int,
        help="model calls per question before giving up (default: "
             + ", ".join(f"{k} {v[0]}" for k, v in DEFAULTS.items()) + ")")
    top_k: int | None = option(  # None: the scaffold's (DEFAULTS)
        None, flag="--top-k", type=positive_int,
        help=f"passages (ircot, default {DEFAULTS['ircot'][1]}) or results (seed002, default "
             f"{DEFAULTS['seed002'][1]}) per search")
    open_lines: int = option(50, flag="--open-lines", type=positive_int,  # seed 002 appendix C: "default open lines is 50"
                             help="seed002: lines 'open' shows (default {default})")
    max_new_tokens: int | None = None  # the generation group's --max-new-tokens (default None: see above)
    temperature: float | None = None  # the generation group's --temperature (default None: see above)
    ircot_form: str = option(
        "stream", flag="--ircot-form", choices=IRCOT_FORMS,
        help="ircot: stream = Search-R1's one growing sequence (default; in process only: --generator "
             "transformers or vllm); chat = ours, one message per turn (every study before the Search-R1 stream)")
    judge: str = option("exact", flag="--judge",
                        help="exact (offline EM, default) or openai:BASE_URL:MODEL (seed 002's F.5 LLM judge)")
    final_call: bool = True       # IRCoT: Search-R1's final rollout after max_turns (part of "done")
    search: str = option("bm25", flag="--search", choices=SEARCH_KINDS, help=SEARCH_HELP)
    corpus: str | None = option(None, flag="--corpus", help=CORPUS_HELP)
    preset: str | None = option(None, flag="--generation-preset", choices=tuple(PRESETS),
                                help="cpu: 128 new tokens per call, temperature 0 (the bundled model on a CPU; not a "
                                     "seed's setting); explicit --max-new-tokens / --temperature win")
    # --structured-actions: replies constrained to the scaffold's action grammar (the seeds decode freely,
    # so it is another experiment); in the stamp only when on, so free-decoding stamps stay as they were
    structured_actions: bool = option(
        False, flag="--structured-actions", action="store_true",
        help="constrain every reply to the scaffold's action grammar (ircot: <think> then <search> or "
             "<answer>; seed002: tool calls or an 'Exact Answer:' reply). Off by default: the seeds "
             "decode freely, so results with it are another experiment (recorded in study.json)")

    def __post_init__(self):
        if self.scaffold not in SCAFFOLDS:
            raise ValueError(f"scaffold must be one of {', '.join(SCAFFOLDS)}, not {self.scaffold!r}")
        if self.ircot_form not in IRCOT_FORMS:
            raise ValueError(f"ircot_form must be one of {', '.join(IRCOT_FORMS)}, not {self.ircot_form!r}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, not {self.preset!r}")
        turns, k = DEFAULTS[self.scaffold]
        self.max_turns = turns if self.max_turns is None else self.max_turns
        self.top_k = k if self.top_k is None else self.top_k
        key = "ircot-stream" if self.stream else self.scaffold
        gen = {"max_new_tokens": GENERATION[key][0], "temperature": GENERATION[key][1],
               **PRESETS.get(self.preset or "", {})}
        self.max_new_tokens = gen["max_new_tokens"] if self.max_new_tokens is None else self.max_new_tokens
        self.temperature = gen["temperature"] if self.temperature is None else self.temperature
        if self.max_turns < 1 or self.top_k < 1 or self.max_new_tokens < 1 or self.open_lines < 1:
            raise ValueError("max_turns, top_k, max_new_tokens and open_lines must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")

    @property
    def stream(self) -> bool:
        """Whether the model is sent Search-R1's single sequence (the ircot scaffold's default form)."""
        return self.scaffold == "ircot" and self.ircot_form == "stream"

    @property
    def label(self) -> str:
        """The scaffold as study.md's title names it, with the ircot form."""
        if self.scaffold != "ircot":
            return self.scaffold
        return "ircot (Search-R1 stream)" if self.stream else "ircot (multi-turn chat, ours)"

    def to_dict(self) -> dict:
        """The config as results record it; ``corpus`` by its content (:func:`corpus_identity`: None for the
        shipped one), never its path."""
        d = {**as_recorded(asdict(self)), "judge": redact(self.judge),  # study.json
             "prompts": prompts_hash("ircot-stream" if self.stream else self.scaffold)}
        if self.search == "bm25":
            d["corpus"] = corpus_identity(self.corpus)
        if self.scaffold != "ircot":  # the final answer call is Search-R1's, an IRCoT option only
            d.pop("final_call")
        if not self.structured_actions:
            d.pop("structured_actions")
        if not self.stream:  # the multi-turn form's stamps stay those of earlier versions
            d.pop("ircot_form")
        return d


@dataclass
class Episode(ContextHistory):
    """One question under one setting: the history bookkeeping every scaffold shares (full and refined
    history, the view sent, the once-per-round refinement, the links: :class:`ContextHistory`), plus the
    recorded calls and the counts."""

    calls: list[dict] = field(default_factory=list)
    response: str | None = None
    answer: str | None = None
    retrievals: int = 0
    tool_calls: int = 0
    final_searches: int = 0  # IRCoT: a <search> written in the final call, which is not run
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    context_chars: list[int] = field(default_factory=list)


def _chars(messages: list[dict]) -> int:
    return sum(len(message_text(m.get("content"))) + len(m.get("reasoning_content") or "")
               + sum(len(json.dumps(c.get("function", {}))) for c in m.get("tool_calls") or []) for m in messages)


class Loop:
    """Runs one question as a generator of model calls: :meth:`steps` yields a :class:`ChatRequest` for
    every call and is sent the :class:`ChatReply` back (:func:`attnprobe.studies.loop.rollout.rollout`
    steps many loops together, or one); ``run`` runs it alone and returns the :class:`Episode`."""

    def __init__(self, chat, search: SearchBackend, setting: Setting, config: LoopConfig, *, run_id: str,
                 question: dict, note=None):
        self.chat, self.search, self.setting, self.config = chat, search, setting, config
        self.run_id, self.question = run_id, question
        self.note = note  # progress callback (the driver tells it of each call and its tokens per second)
        self.ep = Episode(setting, f"{run_id}/history")
        # seed002: the release's parallel-call sentence for this model's chat template (prompts.template_family)
        template = getattr(getattr(chat, "tokenizer", None), "chat_template", None)
        self.family = template_family(template if isinstance(template, str) else None, getattr(chat, "name", "") or "")

    # ------------------------------------------------------------------ one model call
    def _actions(self, final: bool) -> ActionFormat | None:
        if not self.config.structured_actions:
            return None
        if self.config.scaffold == "ircot":
            return ActionFormat("ircot", final=final, max_new_tokens=self.config.max_new_tokens)
        return ActionFormat("seed002", tools=json.dumps(TOOLS), max_new_tokens=self.config.max_new_tokens)

    def _call(self, sent: list[dict], cf, tools: list[dict] | None, kept: list[int] | None = None, *,
              final: bool = False, stream: searchr1.Stream | None = None):
        """Ask for ``sent`` (``cf.messages``, or the ``kept`` ones of it rewritten as tags) and record the call:
        the model gets the text only, the record keeps the tag-text ``annotations`` (and labels the reply's).
        With a Search-R1 ``stream`` the model is sent its token ids (``sent``: the stream as messages, which
        label them) and the reply is appended to it as Search-R1 does; the record is the stream through the
        reply. A generator: yields the request, is sent the reply, returns it (``reply = yield from ...``)."""
        ep = self.ep
        step = len(ep.calls) + 1
        request = ChatRequest(unlabelled(sent), copy.deepcopy(tools) if tools else None,
                              max_new_tokens=self.config.max_new_tokens, temperature=self.config.temperature,
                              episode=self.run_id, actions=self._actions(final),
                              prompt_ids=stream.model_input() if stream is not None else None)
        reply: ChatReply = yield request
        msg: dict[str, Any] = self._native(reply) if self.config.scaffold == "seed002" else reply.as_message()
        if not (msg.get("content") or "").strip() and not msg.get("tool_calls") and msg.get("reasoning_content") is None:
            msg["content"] = "(empty reply)"
        if self.config.scaffold == "ircot":  # the reply's <search> span is its tool call (tag text)
            msg = annotate_reply(msg)
        messages = copy.deepcopy(sent) + [msg]
        if stream is not None:  # the reply decoded without special tokens, cut and appended (generation.py:56-75)
            dropped = stream.dropped()
            stream.add_reply(reply.raw_text or reply.content or "")
            messages = stream.recorded()
        call_id = f"{self.run_id}/step-{step}"
        meta = {"runner": f"loop-{self.config.scaffold}", "run_id": self.run_id, "setting": redact(self.setting.spec),
                "question_id": self.question["id"], "step": step, "history": ep.link(cf, kept)}
        # structured: recorded with the grammar it was sent, and whether the reply follows it
        record = call_record(call_id, self.question["question"], getattr(self.chat, "name", None), messages, reply,
                             meta, actions=request.actions, after_usage={"context_chars": _chars(sent)})
        if stream is not None:  # what the model was sent: tokens, the start it did not see, observations cut
            record["meta"]["stream"] = {"prompt_tokens": len(request.prompt_ids or []), "dropped_tokens": dropped,
                                        "observation_tokens_cut": [p.cut for p in stream.pieces if p.cut]}
        if tools:
            record["tools"] = tools  # last, where the loop's records always had it
        ep.calls.append(record)
        ep.record_step(step, call_id)
        ep.input_tokens.append(reply.input_tokens)
        ep.output_tokens.append(reply.output_tokens)
        ep.context_chars.append(_chars(sent))
        return reply

    def _refine(self) -> None:
        self.ep.refine()

    @staticmethod
    def _native(reply: ChatReply) -> dict[str, Any]:
        """The assistant message seed 002's release keeps for ``reply`` (:func:`native_turn`): ``<think>`` text
        as ``reasoning_content``, no content in a tool-call turn; the calls as the backend parsed them."""
        content, reasoning = native_turn(reply.raw_text or reply.content or "", reply.reasoning_content,
                                         bool(reply.tool_calls))
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        if reply.tool_calls:
            msg["tool_calls"] = reply.tool_calls
        return msg

    # ------------------------------------------------------------------ seed 002
    def _seed002(self) -> None:
        ep = self.ep
        browser = self.browser = Browser(self.search, top_k=self.config.top_k, open_lines=self.config.open_lines)
        ep.append({"role": "system", "content": seed002_system(TOOLS, self.family)})
        ep.append({"role": "user", "content": SEED002_TASK.format(question=self.question["question"])})
        for _ in range(self.config.max_turns):
            cf = ep.view()
            reply = yield from self._call(cf.messages, cf, TOOLS)
            said = ep.calls[-1]["messages"][-1]  # the release's message for the reply (Loop._native)
            thought = {"reasoning_content": said["reasoning_content"]} if "reasoning_content" in said else {}
            if not reply.tool_calls:
                ep.append({"role": "assistant", "content": said["content"], **thought})
                ep.response = "" if said["content"] == "(empty reply)" else said["content"]
                ep.answer = extract_answer(ep.response)
                return
            calls = []
            for c in reply.tool_calls:  # ids numbered over the history, whatever the backend called them
                ep.tool_calls += 1
                calls.append({"id": f"call{ep.tool_calls}", "type": "function", "function": dict(c["function"])})
            ep.append({"role": "assistant", "content": said["content"], **thought, "tool_calls": calls})
            for c, wrote in zip(calls, reply.tool_calls):  # a call that cannot run is no retrieval
                ep.retrievals += c["function"]["name"] == "search" and RAW_ARGUMENTS not in wrote
                ep.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                           "content": browser.execute(wrote)})
            self._refine()

    # ------------------------------------------------------------------ IRCoT
    def _passages(self, query: str, keep: bool = False) -> list[tuple[str, str]]:
        """(title, text) of the ``top_k`` hits. A backend that gives the whole passage (the retrieval server) is
        shown it as it came; otherwise the fetched page (or the snippet), with its own newlines when ``keep``
        (the Search-R1 stream keeps them, generation.py:464-467), else its whitespace joined (the multi-turn
        form, as before)."""
        out = []
        for r in self.search.search(query, self.config.top_k):
            if r.text is not None:
                out.append((r.title, r.text))
                continue
            text = self.search.fetch(r.url) or r.snippet
            if text.startswith(f"{r.title}\n\n"):
                text = text[len(r.title) + 2:]
            out.append((r.title, text if keep else " ".join(text.split())))
        return out

    def _search_round(self, query: str, tag_text: str, documents: str) -> None:
        """A turn that ran ``query`` in rounds form (both ircot forms): the turn's text without its ``<search>``
        span, one ``search`` call and its ``tag_text``, then the documents as its ``tool`` message; refined once."""
        ep = self.ep
        ep.tool_calls += 1
        ep.retrievals += 1
        thought = removed(tag_text, "search").strip()
        call = {"id": f"call{ep.tool_calls}", "type": "function",
                "function": {"name": "search", "arguments": json.dumps({"query": query}, ensure_ascii=False)}}
        ep.append({"role": "assistant", "content": thought, "tool_calls": [call], "tag_text": tag_text})
        ep.append({"role": "tool", "tool_call_id": call["id"], "name": "search", "content": documents})
        self._refine()

    def _ircot(self) -> None:
        ep = self.ep
        ep.append({"role": "user", "content": IRCOT_PROMPT.format(question=self.question["question"])})
        for _ in range(self.config.max_turns):
            cf = ep.view()
            sent, kept = as_tags(cf.messages)
            reply = yield from self._call(sent, cf, None, kept)
            act = parse_tags(reply.content or reply.raw_text or "", (IRCOT_PROMPT, IRCOT_INVALID))
            if act.answer is not None:
                ep.append({"role": "assistant", "content": act.text})
                ep.response, ep.answer = act.text, act.answer
                return
            if not act.queries:
                ep.append({"role": "assistant", "content": act.text or reply.content or "(empty reply)"})
                ep.append({"role": "user", "content": IRCOT_INVALID})
                continue
            query = act.queries[0]
            self._search_round(query, act.text, searchr1.passages(self._passages(query)).rstrip("\n"))
        if self.config.final_call:
            yield from self._ircot_final()

    def _stream(self) -> None:
        """The ircot scaffold in Search-R1's form (:mod:`attnprobe.agents.searchr1`): every call sends the
        sequence of the setting's view of the history (:func:`searchr1.from_history`: with no policy, Search-R1's
        own), up to ``max_turns`` turns and then the final rollout. The history keeps rounds form, so the policies
        and refiners act on it as in the multi-turn form."""
        ep, cfg = self.ep, self.config
        tok = getattr(self.chat, "tokenizer", None)
        if tok is None:
            raise ValueError("the Search-R1 stream (--ircot-form stream) needs the model's tokenizer: an in-process "
                             "generator (--generator transformers or vllm); --ircot-form chat runs the multi-turn form")
        ep.append({"role": "user", "content": IRCOT_PROMPT.format(question=searchr1.question(self.question["question"]))})
        for turn in range(cfg.max_turns + int(cfg.final_call)):
            final = turn == cfg.max_turns
            cf = ep.view()
            stream = searchr1.from_history(tok, cf.messages)
            yield from self._call(stream.recorded(), cf, None, [0], final=final, stream=stream)
            text = stream.pieces[-1].text
            action, query = searchr1.parse_action(text)
            if final or action == "answer":
                if final:
                    ep.calls[-1]["meta"]["final_call"] = True
                ep.append({"role": "assistant", "content": text or "(empty reply)", "reply_text": text})
                ep.response, ep.answer = text, stream.answer()
                ep.final_searches += int(final and action == "search")
                return
            if action != "search":
                ep.append({"role": "assistant", "content": text or "(empty reply)", "reply_text": text})
                ep.append({"role": "user", "content": searchr1.INVALID})
                continue
            self._search_round(query, text, searchr1.passages(self._passages(query, keep=True)))

    def _ircot_final(self) -> None:
        """Search-R1's final rollout (``search_r1/llm_agent/generation.py``: after ``max_turns`` steps, one more
        generation with ``do_search=False``): the model is sent its context as it stands and only an
        ``<answer>`` counts. A ``<search>`` it writes there is not run, so it is no retrieval (seed 004's ART:
        "the average number of retrievals required per question"); it is counted in ``final_searches``."""
        ep = self.ep
        cf = ep.view()
        sent, kept = as_tags(cf.messages)
        reply = yield from self._call(sent, cf, None, kept, final=True)
        ep.calls[-1]["meta"]["final_call"] = True
        act = parse_tags(reply.content or reply.raw_text or "", (IRCOT_PROMPT, IRCOT_INVALID))
        ep.append({"role": "assistant", "content": act.text or reply.content or "(empty reply)"})
        ep.response = act.text or reply.content or ""
        ep.answer = act.answer
        ep.final_searches += int(bool(act.queries))

    def steps(self):
        """The episode as a generator: yields each :class:`ChatRequest`, is sent its reply, returns the
        :class:`Episode`."""
        yield from (self._stream if self.config.stream else self._ircot if self.config.scaffold == "ircot"
                    else self._seed002)()
        return self.ep

    def run(self) -> Episode:
        from attnprobe.studies.loop.rollout import rollout

        rollout(self.chat, [self], note=self.note)
        return self.ep

    @property
    def pool(self) -> list[dict] | None:
        """The seed-002 page pool at the end of the run (None for IRCoT)."""
        browser = getattr(self, "browser", None)
        return browser.pool.to_dict() if browser is not None else None


def run_question(chat, search: SearchBackend, setting: Setting, config: LoopConfig, question: dict, *,
                 run_id: str, scorer, note=None) -> tuple[dict, list[dict], dict]:
    """Run one question: returns (result record, recorded calls, full-history trajectory); ``note`` is told
    of every model call (progress). The same driver as a batch, with one episode."""
    from attnprobe.studies.loop.rollout import rollout

    loop = Loop(chat, search, setting, config, run_id=run_id, question=question)
    done: list[tuple] = []
    rollout(chat, [loop], on_done=lambda lp, seconds: done.append(question_records(lp, scorer, seconds)), note=note)
    return done[0]


def question_records(loop: Loop, scorer, seconds: float) -> tuple[dict, list[dict], dict]:
    """A finished loop's (result record, recorded calls, full-history trajectory); ``seconds``: its wall time."""
    chat, setting, config, question, run_id = loop.chat, loop.setting, loop.config, loop.question, loop.run_id
    ep = loop.ep
    verdict = scorer(question["question"], ep.response, ep.answer, question.get("answers") or [])
    n = len(ep.calls)
    history = {"id": f"{run_id}/history", "task": question["question"], "model": getattr(chat, "name", None),
               "framing": "trace", "messages": copy.deepcopy(ep.full),
               "labels": {} if verdict.correct is None else {"correct": verdict.correct},
               "meta": {"runner": f"loop-{config.scaffold}", "kind": "full-history", "run_id": run_id,
                        "setting": redact(setting.spec), "question_id": question["id"], "steps": ep.steps,
                        "refined": {str(i): t for i, t in sorted(ep.refined.items())},
                        **({"page_pool": loop.pool} if loop.pool is not None else {}),
                        **({"structured_actions": config.scaffold} if config.structured_actions else {})}}
    if config.scaffold == "seed002":
        history["tools"] = TOOLS
    result = {
        "run_id": run_id, "question_id": question["id"], "question": question["question"],
        "answers": question.get("answers") or [], "type": question.get("type"), "setting": redact(setting.spec),
        "config": config.to_dict(), "policy_rules": setting_rules(setting.spec), "model": getattr(chat, "name", None),
        "answer": ep.answer, "response": ep.response, "no_answer": ep.answer is None,
        "correct": verdict.correct, "verdict": verdict.to_dict(),
        "confidence": extract_confidence(ep.response or "") if config.scaffold == "seed002" else None,
        "retrievals": ep.retrievals, "tool_calls": ep.tool_calls, "model_calls": n,
        "final_call": bool(ep.calls and ep.calls[-1]["meta"].get("final_call")),
        "final_searches": ep.final_searches,
        "refiner_calls": ep.refiner_calls,
        "input_tokens": sum(ep.input_tokens), "output_tokens": sum(ep.output_tokens),
        "context_tokens": round(sum(ep.input_tokens) / n, 2) if n else 0.0,
        "context_chars": round(sum(ep.context_chars) / n, 2) if n else 0.0,
        "seconds": round(seconds, 3),
    }
    return result, ep.calls, history
