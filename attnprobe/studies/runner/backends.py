"""Model backends for the runner.

``StopAtCallChat`` is :class:`attnprobe.chat.TransformersChat` with one addition: generation stops as
soon as the text holds a complete call of an offered tool (small models tend to keep chatting after
the JSON). The prompt is rendered by the same ``render`` call, so recorded calls capture unchanged.
"""

from __future__ import annotations

from typing import Any

from attnprobe.generation.chat import ChatReply, TransformersChat, _tool_names
from attnprobe.generation.toolparse import parse_tool_calls


class StopAtCallChat(TransformersChat):
    check_every = 4  # decode and parse every N new tokens

    def complete(self, messages, tools=None, *, max_tokens=256, temperature=0.0) -> ChatReply:
        if not tools:
            return super().complete(messages, tools, max_tokens=max_tokens, temperature=temperature)
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        from attnprobe.render.rendering import render
        from attnprobe.trajectory.schema import Trajectory

        tok = self.loaded.tokenizer
        names = _tool_names(tools)
        rendered = render(Trajectory(id="prompt", messages=messages, tools=tools), tok, add_generation_prompt=True)
        ids = torch.as_tensor(rendered.input_ids)[None]
        n_prompt = ids.shape[1]
        every = self.check_every

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                n_new = input_ids.shape[1] - n_prompt
                if n_new == 0 or n_new % every:
                    return False
                text = tok.decode(input_ids[0, n_prompt:], skip_special_tokens=True)
                return bool(parse_tool_calls(text, names)[1])

        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0,
                                      "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None
                                      else tok.eos_token_id,
                                      "stopping_criteria": StoppingCriteriaList([_Stop()])}
        if temperature > 0:
            gen_kwargs["temperature"] = temperature
        with torch.inference_mode():
            out = self.loaded.model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)
        new = out[0, n_prompt:]
        text = tok.decode(new, skip_special_tokens=True)
        content, calls = parse_tool_calls(text, names)
        tool_calls = []
        for c in calls:
            self._n += 1
            tool_calls.append(c.to_openai(f"{self.call_prefix}{self._n}"))
        finish = "tool_calls" if tool_calls else ("length" if len(new) >= max_tokens else "stop")
        return ChatReply(content=content if tool_calls else text.strip(), tool_calls=tool_calls, raw_text=text,
                         input_tokens=int(n_prompt), output_tokens=int(len(new)), finish_reason=finish)
