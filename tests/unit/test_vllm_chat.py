"""VllmChat's own logic without vLLM (the engine is a scripted stand-in; the real engine is tested in
tests/vllm_backend/test_vllm_generation.py): one ``generate`` per batch with per-request sampling
settings, prompts rendered as TransformersChat renders them, the stop-at-call cut where
TransformersChat's criterion stops, and the token accounting (sent, cached, prefilled, generated)."""

from __future__ import annotations

import sys
import types

import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.generation.chat import ActionFormat, ChatRequest
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe.generation.vllm_chat import VllmChat

TOOLS = [{"type": "function", "function": {"name": "web_search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}}}}]
CALL_TEXT = 'Let me look. {"name": "web_search", "arguments": {"query": "tallest bridge"}} I hope this helps, more chatter.'
PLAIN_TEXT = "The answer is Paris."


class _Params:
    def __init__(self, **kw):
        self.kw = kw


class _FakeLLM:
    """``generate`` answers every prompt with a scripted text + EOS and says half the prompt (rounded down) was cached."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.calls = tok, texts, []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append((prompts, params))
        outs = []
        for p, text in zip(prompts, self.texts):
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids)],
                                              num_cached_tokens=len(p["prompt_token_ids"]) // 2))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = _Params
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    import attnprobe.generation.structured as structured

    monkeypatch.setattr(structured, "vllm_sampling_params_kwargs",
                        lambda fmt: {"structured_outputs": f"grammar for {fmt.scaffold}"})


def _chat(tiny_smol, texts, max_model_len=8192):
    llm = _FakeLLM(tiny_smol.tokenizer, texts)
    loaded = types.SimpleNamespace(name="tiny", tokenizer=tiny_smol.tokenizer, model=llm, max_model_len=max_model_len)
    return VllmChat(loaded), llm


def test_one_generate_per_batch_with_cut_at_call_and_token_counts(tiny_smol, fake_vllm):
    chat, llm = _chat(tiny_smol, [CALL_TEXT, PLAIN_TEXT])
    msgs = [{"role": "user", "content": "Which bridge is the tallest?"}]
    reqs = [ChatRequest(msgs, TOOLS, max_new_tokens=64), ChatRequest(msgs, None, max_new_tokens=32, temperature=0.7,
                                                                  actions=ActionFormat("ircot"))]
    with_call, plain = chat.complete_batch(reqs)
    prompts, params = llm.calls[0]
    assert len(llm.calls) == 1 and len(prompts) == 2
    tf = TransformersChat(tiny_smol)
    assert prompts[0]["prompt_token_ids"] == tf.prompt(msgs, TOOLS).ids == with_call.prompt.ids
    assert prompts[1]["prompt_token_ids"] == tf.prompt(msgs, None).ids
    assert [p.kw for p in params] == [
        {"max_tokens": 64, "temperature": 0.0, "detokenize": False},
        {"max_tokens": 32, "temperature": 0.7, "detokenize": False, "structured_outputs": "grammar for ircot"}]
    # cut after the call, at a multiple of 4 new tokens (TransformersChat's check points), before the chatter
    assert with_call.tool_calls == [{"id": "call1", "type": "function", "function": {
        "name": "web_search", "arguments": '{"query": "tallest bridge"}'}}]
    assert with_call.raw_text.startswith(CALL_TEXT.split("}}")[0] + "}}") and "chatter" not in with_call.raw_text
    assert with_call.output_tokens % 4 == 0 and (with_call.stopped_by, with_call.finish_reason) == ("other", "tool_calls")
    n_plain = len(tiny_smol.tokenizer.encode(PLAIN_TEXT, add_special_tokens=False)) + 1
    assert (plain.raw_text, plain.output_tokens, plain.stopped_by) == (PLAIN_TEXT, n_plain, "eos")
    n_call = len(tiny_smol.tokenizer.encode(CALL_TEXT, add_special_tokens=False)) + 1
    sent = [len(prompts[0]["prompt_token_ids"]), len(prompts[1]["prompt_token_ids"])]
    cached = [n // 2 for n in sent]
    assert chat.last_batch == [{"sent": sent[0], "cached": cached[0], "prefilled": sent[0] - cached[0], "generated": n_call},
                               {"sent": sent[1], "cached": cached[1], "prefilled": sent[1] - cached[1],
                                "generated": n_plain}]
    assert chat.stats == {"calls": 2, "sent": sum(sent), "cached": sum(cached), "prefilled": sum(sent) - sum(cached),
                          "generated": n_call + n_plain}


def test_the_cut_equals_transformers_stopping_on_the_same_tokens(tiny_smol, fake_vllm):
    """TransformersChat stops at the first multiple of 4 new tokens whose text holds a complete call: the
    same point found by decoding each prefix here."""
    chat, _ = _chat(tiny_smol, [CALL_TEXT])
    reply = chat.complete([{"role": "user", "content": "q"}], TOOLS, max_new_tokens=64)
    tok = tiny_smol.tokenizer
    ids = tok.encode(CALL_TEXT, add_special_tokens=False)
    first = next(n for n in range(4, len(ids) + 1, 4) if tok.decode(ids[:n]).count("}") >= 2)
    assert reply.output_tokens == first and reply.raw_text == tok.decode(ids[:first], skip_special_tokens=True)


def test_a_prompt_past_the_engine_length_is_one_error_line(tiny_smol, fake_vllm):
    chat, llm = _chat(tiny_smol, [PLAIN_TEXT], max_model_len=20)
    with pytest.raises(AttnprobeError, match=r"^request 1: the prompt renders to \d+ tokens; the vLLM engine holds at "
                                             r"most 19 prompt tokens \(max_model_len=20\)$"):
        chat.complete_batch([ChatRequest([{"role": "user", "content": "a question long enough to pass twenty"}])])
    assert llm.calls == []
