"""Behaviour: generate the model's next action for every framing and parse it.

Backends (greedy decoding, temperature 0):

- :class:`TransformersBackend` runs the loaded model in process. The prompt is rendered by
  :func:`attnprobe.render` exactly as capture renders it. ``complete_many`` generates several
  prompts in one left-padded batch (what ``run_behaviour`` uses with ``batch_size > 1``; several
  times faster on CPU); ``complete`` generates one prompt and can stop early once the reply holds
  a complete tool call (greedy decoding makes the result a prefix of the full generation, so the
  parsed action is the same). It also records a *forced choice*: the log-probability of
  ``{"name": "web_search"`` vs ``{"name": "visit_page"`` after the prompt, which decides every
  item even when the free reply is unparseable.
- :class:`OpenAIBackend` talks to any OpenAI-compatible endpoint (``vllm serve``,
  ``python -m attnprobe.ibis.serve_main``) through :class:`attnprobe.chat.OpenAIChat`.

:func:`classify_reply` maps a reply to ``web_search`` / ``visit_page`` / ``answer`` /
``unparseable`` and says how it decided (``method``): structured tool calls first, then every
tool-call syntax :mod:`attnprobe.toolparse` knows (Hermes/Qwen ``<tool_call>``, Llama-3 JSON,
smolagents ``Calling tools:``, Mistral ``[TOOL_CALLS]``, fenced JSON, Python-call style), then
plain text (a tool named in prose, or an explicit intent phrase) after removing sentences copied
verbatim from the prompt (small models often echo the reminder). Anything else is
``unparseable``: counted, reported and scored as incorrect, never dropped.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnprobe.generation.toolparse import parse_tool_calls
from attnprobe.io import append_jsonl, read_records, run_resumable
from attnprobe.studies.ibis.framings import FRAMINGS, TOOL_NAMES, build_framing
from attnprobe.studies.ibis.items import IbisItem

DECISIONS = ("web_search", "visit_page", "answer", "unparseable")
ALIASES = {
    "web_search": "web_search", "search": "web_search", "google_search": "web_search", "search_web": "web_search",
    "websearch": "web_search", "bing_search": "web_search", "duckduckgo_search": "web_search",
    "search_again": "web_search", "new_search": "web_search",
    "visit_page": "visit_page", "visit": "visit_page", "visit_webpage": "visit_page", "open_page": "visit_page",
    "open_url": "visit_page", "browse": "visit_page", "browse_page": "visit_page", "fetch_html": "visit_page",
    "fetch_page": "visit_page", "fetch_url": "visit_page", "open_result": "visit_page", "click": "visit_page",
    "final_answer": "answer", "answer": "answer", "return_answer": "answer",
}
_SEARCH_INTENT = re.compile(
    r"\b(search(ing)? (again|once more|anew|with (a|another|a different|a new|a better))|re-?search|"
    r"(new|different|another|better|refined|revised) (search|query)|refine (the|my) (search|query)|"
    r"rephrase (the|my) query|adjust (the|my) query)\b", re.I)
_VISIT_INTENT = re.compile(
    r"\b(visit|open|browse|click( on)?|read)\b[^.\n]{0,40}\b(page|result|link|url|website|site|article|"
    r"https?://\S+)", re.I)
FORCED_CHOICE_PREFIX = '{"name": "'
_ANSWER_INTENT = re.compile(r"\b(final answer|the answer is)\b", re.I)


def _accepts_cache_kw(model) -> bool:
    """Newer transformers name the KV-cache argument ``cache`` (``past_key_values`` is deprecated)."""
    import inspect

    try:
        return "cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _normalise_name(name: str) -> str | None:
    return ALIASES.get(re.sub(r"[^a-z_]", "", name.lower().replace("-", "_").replace(" ", "_")))


def _strip_echo(text: str, prompt: str) -> str:
    """Remove sentences/lines of ``text`` that appear verbatim in the prompt (echoed instructions)."""
    pieces = re.split(r"(?<=[.!?])\s+|\n+", text)
    kept = [p for p in pieces if not (len(p.strip()) >= 12 and p.strip() in prompt)]
    return "\n".join(kept)


def classify_reply(raw_text: str, tool_calls: Iterable[dict] | None = None, prompt_text: str = "") -> dict[str, Any]:
    """{"decision", "method", "name", "arguments"} for one reply (see module docstring)."""
    for call in tool_calls or []:
        fn = call.get("function") or {}
        dec = _normalise_name(str(fn.get("name", "")))
        if dec:
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {"raw": args}
            return {"decision": dec, "method": "tool_call", "name": fn.get("name"), "arguments": args or {}}
    _, calls = parse_tool_calls(raw_text, None)
    for c in calls:
        dec = _normalise_name(c.name)
        if dec:
            return {"decision": dec, "method": "parsed" if c.name in TOOL_NAMES else "parsed-alias",
                    "name": c.name, "arguments": c.arguments}
    # Python-call style with an alias name (toolparse only accepts known names there).
    _, calls = parse_tool_calls(raw_text, sorted(ALIASES))
    for c in calls:
        dec = _normalise_name(c.name)
        if dec:
            return {"decision": dec, "method": "parsed" if c.name in TOOL_NAMES else "parsed-alias",
                    "name": c.name, "arguments": c.arguments}
    text = _strip_echo(raw_text, prompt_text) if prompt_text else raw_text
    mentioned = {d for d in ("web_search", "visit_page") if re.search(rf"\b{d}\b", text)}
    if len(mentioned) == 1:
        return {"decision": mentioned.pop(), "method": "name-mention", "name": None, "arguments": {}}
    if not mentioned:
        hits = {d for d, rx in (("web_search", _SEARCH_INTENT), ("visit_page", _VISIT_INTENT),
                                ("answer", _ANSWER_INTENT)) if rx.search(text)}
        if len(hits) == 1:
            return {"decision": hits.pop(), "method": "intent", "name": None, "arguments": {}}
    return {"decision": "unparseable", "method": "none", "name": None, "arguments": {}}


def api_messages(messages: list[dict]) -> list[dict]:
    """Messages as an OpenAI-compatible server expects them (attnprobe-only keys removed)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k not in ("annotations", "author")}
        if m.get("role") == "assistant" and not m.get("content"):
            m["content"] = None if m.get("tool_calls") else ""
        out.append(m)
    return out


class TransformersBackend:
    """Greedy generation with an in-process transformers model (see module docstring)."""

    kind = "transformers"

    def __init__(self, loaded, *, early_stop: bool = True, forced_choice: bool = True):
        self.loaded = loaded
        self.name = loaded.name
        self.early_stop = early_stop
        self.forced_choice = forced_choice

    def option_logprobs(self, prompt_ids) -> dict[str, float]:
        """Forced choice: summed log-probability of each tool name after the prompt + ``{"name": "``.

        The options differ only in the tool name (the call format the system prompt asks for), so
        the difference is the model's preference between the two actions; it exists for every
        item, even when the generated reply is unparseable. One prefill: the prompt + prefix is
        run once and its KV cache is reused for the second option.
        """
        import torch

        tok = self.loaded.tokenizer
        prefix = tok(FORCED_CHOICE_PREFIX, add_special_tokens=False)["input_ids"]
        names = {n: tok(FORCED_CHOICE_PREFIX + n + '"', add_special_tokens=False)["input_ids"][len(prefix):]
                 for n in ("web_search", "visit_page")}
        full = {n: tok(FORCED_CHOICE_PREFIX + n + '"', add_special_tokens=False)["input_ids"]
                for n in ("web_search", "visit_page")}
        if any(full[n][:len(prefix)] != prefix for n in full):  # tokenizer merged across the prefix: no sharing
            return self._option_logprobs_plain(prompt_ids, full)
        base = list(prompt_ids) + prefix
        out = {}
        with torch.inference_mode():
            first = self.loaded.model(torch.as_tensor(base)[None], use_cache=True)
            keys = set(first.keys())  # transformers >= 5.2x names it "cache", older "past_key_values"
            cache = first["cache"] if "cache" in keys else getattr(first, "past_key_values", None)
            if cache is None:
                return self._option_logprobs_plain(prompt_ids, full)
            last = torch.log_softmax(first.logits[0, -1].float(), dim=-1)
            added = 0
            for n in ("web_search", "visit_page"):
                if added:  # drop the previous option's tokens from the shared cache
                    cache.crop(-added)
                    added = 0
                ids = names[n]
                lp = float(last[ids[0]])
                if len(ids) > 1:
                    kw = {"cache" if _accepts_cache_kw(self.loaded.model) else "past_key_values": cache}
                    logits = self.loaded.model(torch.as_tensor(ids[:-1])[None], use_cache=True,
                                               **kw).logits[0].float()
                    logp = torch.log_softmax(logits, dim=-1)
                    lp += float(logp[torch.arange(len(ids) - 1), torch.as_tensor(ids[1:])].sum())
                    added = len(ids) - 1
                out[n] = lp
        return out

    def _option_logprobs_plain(self, prompt_ids, full) -> dict[str, float]:
        import torch

        out = {}
        for n, cont in full.items():
            ids = torch.as_tensor(list(prompt_ids) + list(cont))[None]
            with torch.inference_mode():
                logits = self.loaded.model(ids).logits[0, len(prompt_ids) - 1:-1].float()
            out[n] = float(torch.log_softmax(logits, dim=-1).gather(1, torch.as_tensor(cont)[:, None]).sum())
        return out

    def complete_many(self, trajectories, *, max_tokens: int = 64) -> list[dict[str, Any]]:
        """Greedy generation for several prompts in one left-padded batch (several times faster on
        CPU than one by one; outputs checked equal to unbatched generation in the tests)."""
        import torch

        from attnprobe.render.rendering import render

        tok = self.loaded.tokenizer
        rendered = [render(t, tok, add_generation_prompt=True) for t in trajectories]
        prompts = [r.input_ids.tolist() for r in rendered]
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.loaded.model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                                             pad_token_id=pad)
        eos = tok.eos_token_id
        fcs = self.option_logprobs_many(prompts) if self.forced_choice else [None] * len(prompts)
        results = []
        for r, p, row, fc in zip(rendered, prompts, out, fcs):
            new = row[width:].tolist()
            if eos is not None and eos in new:
                new = new[: new.index(eos) + 1]
            text = tok.decode(new, skip_special_tokens=True)
            finish = "stop" if (eos is not None and new and new[-1] == eos) else "length"
            res = {"raw_text": text, "tool_calls": [], "input_tokens": len(p), "output_tokens": len(new),
                   "finish_reason": finish, "prompt_text": r.text, "rendering": r.rendering}
            if fc is not None:
                res["forced_choice"] = fc
            results.append(res)
        return results

    def option_logprobs_many(self, prompts: list[list[int]]) -> list[dict[str, Any]]:
        """:meth:`option_logprobs` for several prompts; one prefill per prompt (the second option
        reuses the KV cache of the shared prompt + ``{"name": "`` prefix)."""
        return [self._fc_entry(self.option_logprobs(p)) for p in prompts]

    @staticmethod
    def _fc_entry(lp: dict[str, float]) -> dict[str, Any]:
        ws, vp = lp["web_search"], lp["visit_page"]
        return {"logprob_web_search": round(ws, 5), "logprob_visit_page": round(vp, 5),
                "log_odds_visit": round(vp - ws, 5), "choice": "visit_page" if vp > ws else "web_search"}

    def complete(self, trajectory, *, max_tokens: int = 64) -> dict[str, Any]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        from attnprobe.render.rendering import render

        tok = self.loaded.tokenizer
        rendered = render(trajectory, tok, add_generation_prompt=True)
        ids = torch.as_tensor(rendered.input_ids)[None]
        n_prompt = ids.shape[1]

        class _CallComplete(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                text = tok.decode(input_ids[0, n_prompt:], skip_special_tokens=True)
                if "}" not in text and ")" not in text:
                    return torch.zeros(input_ids.shape[0], dtype=torch.bool)
                _, calls = parse_tool_calls(text, list(ALIASES))
                return torch.full((input_ids.shape[0],), bool(calls), dtype=torch.bool)

        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False,
                                  "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None
                                  else tok.eos_token_id}
        if self.early_stop:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_CallComplete()])
        with torch.inference_mode():
            out = self.loaded.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        new = out[0, n_prompt:]
        text = tok.decode(new, skip_special_tokens=True)
        eos = tok.eos_token_id
        stopped_eos = len(new) > 0 and eos is not None and int(new[-1]) == eos
        finish = "stop" if stopped_eos else ("length" if len(new) >= max_tokens else "call_complete")
        res = {"raw_text": text, "tool_calls": [], "input_tokens": int(n_prompt), "output_tokens": int(len(new)),
               "finish_reason": finish, "prompt_text": rendered.text, "rendering": rendered.rendering}
        if self.forced_choice:
            res["forced_choice"] = self._fc_entry(self.option_logprobs(rendered.input_ids.tolist()))
        return res


class OpenAIBackend:
    """Any OpenAI-compatible /v1/chat/completions endpoint, greedy (temperature 0)."""

    kind = "openai"

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", timeout: float = 600.0):
        from attnprobe.generation.chat import OpenAIChat

        self.chat = OpenAIChat(base_url, model, api_key_env=api_key_env, timeout=timeout)
        self.name = model
        self.base_url = base_url

    def complete(self, trajectory, *, max_tokens: int = 64) -> dict[str, Any]:
        reply = self.chat.complete(api_messages(trajectory.messages), trajectory.tools, max_tokens=max_tokens,
                                   temperature=0.0)
        # The structured calls a server returns are authoritative; raw text is kept for the record.
        prompt_text = "\n".join(m.get("content") or "" for m in trajectory.messages if isinstance(m.get("content"), str))
        return {"raw_text": reply.raw_text or reply.content or "", "tool_calls": reply.tool_calls,
                "input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                "finish_reason": reply.finish_reason, "prompt_text": prompt_text, "rendering": "server"}


def decide(backend, item: IbisItem, framing: str, *, max_tokens: int = 64) -> dict[str, Any]:
    """Run one framing of one item and return its decision record (a decisions.jsonl line)."""
    traj = build_framing(item, framing)
    t0 = time.perf_counter()
    out = backend.complete(traj, max_tokens=max_tokens)
    return _record(backend, item, framing, out, time.perf_counter() - t0, max_tokens)


def _record(backend, item: IbisItem, framing: str, out: dict, seconds: float, max_tokens: int) -> dict[str, Any]:
    cls = classify_reply(out["raw_text"], out["tool_calls"], out["prompt_text"])
    return {
        "item_id": item.id, "framing": framing, "label": item.label, "domain": item.domain,
        "expected": item.expected_action, "decision": cls["decision"], "method": cls["method"],
        "correct": cls["decision"] == item.expected_action, "tool_name": cls["name"], "arguments": cls["arguments"],
        "raw_text": out["raw_text"], "structured_tool_calls": out["tool_calls"], "finish_reason": out["finish_reason"],
        "input_tokens": out["input_tokens"], "output_tokens": out["output_tokens"], "rendering": out["rendering"],
        "seconds": round(seconds, 3), "backend": backend.kind, "model": backend.name, "max_tokens": max_tokens,
        "forced_choice": out.get("forced_choice"),
    }


def read_decisions(path: Path) -> list[dict]:
    """The latest record per (item, framing) of decisions.jsonl (a rerun with --force appends newer
    ones); a torn last line from a crash is reported and ignored."""
    latest: dict[tuple, dict] = {}
    for rec in read_records(path, torn_tail="skip", missing_ok=True):
        latest[(rec["item_id"], rec["framing"])] = rec
    return list(latest.values())


def run_behaviour(backend, items: list[IbisItem], folder: Path, *, framings=FRAMINGS, max_tokens: int = 64,
                  force: bool = False, progress: bool = True, batch_size: int = 1) -> dict[str, int]:
    """Decide every (item, framing) not yet in ``folder/decisions.jsonl``; returns counts.

    Resumable: finished pairs are skipped; each decision is appended durably as soon as it exists.
    Failures are written to ``errors.jsonl`` and retried on the next run.
    """
    folder = Path(folder)
    path = folder / "decisions.jsonl"
    done = set() if force else {(r["item_id"], r["framing"]) for r in read_decisions(path)}
    batched = batch_size > 1 and hasattr(backend, "complete_many")

    def work(batch: list[tuple[IbisItem, str]]) -> None:
        if batched:
            t0 = time.perf_counter()
            outs = backend.complete_many([build_framing(it, fr) for it, fr in batch], max_tokens=max_tokens)
            per = (time.perf_counter() - t0) / len(batch)
            for (it, fr), out in zip(batch, outs):
                append_jsonl(path, _record(backend, it, fr, out, per, max_tokens))
        else:
            for it, fr in batch:
                append_jsonl(path, decide(backend, it, fr, max_tokens=max_tokens))

    counts = run_resumable(
        [(it, fr) for it in items for fr in framings], work, done=lambda x: (x[0].id, x[1]) in done,
        describe=lambda x: {"item_id": x[0].id, "framing": x[1]}, errors_path=folder / "errors.jsonl",
        stage="behaviour", desc="ibis behaviour", unit="call", batch_size=batch_size if batched else 1,
        progress=progress)
    return {"done_before": counts["done_before"], "decided": counts["done"], "failed": counts["failed"]}
