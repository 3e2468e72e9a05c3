"""Issue 39: in code ``max_tokens`` is only the capture's prompt limit; the generation limit is ``max_new_tokens``
everywhere, and the records keep the key they were written with (``max_tokens``), so every folder written
before resumes without --force and outputs stay byte-identical (the stamps below were computed by the code
before the rename, e5cc774)."""

import re
from pathlib import Path

import attnprobe
from attnprobe.io.settings import RECORDED_GENERATION_LIMIT, as_recorded
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.job import inputs_stamp
from attnprobe.studies.runner.config import RunSettings

QUESTION = {"question": "Who wrote Hamlet?", "answers": ["Shakespeare"], "type": "single"}


def test_stamps_are_those_of_folders_written_before():
    chat = LoopConfig("ircot", ircot_form="chat", max_new_tokens=48)
    cpu = LoopConfig("seed002", preset="cpu")
    assert (chat.max_new_tokens, cpu.max_new_tokens) == (48, 128)
    assert inputs_stamp(QUESTION, "mask:1", chat, "bundled") == "9c2e4cb4ac322fda1fe3"
    assert inputs_stamp(QUESTION, "mask:1", cpu, "bundled") == "55541d2294fb6288de1c"


def test_records_keep_the_key_and_its_place():
    d = LoopConfig("ircot", ircot_form="chat", max_new_tokens=48).to_dict()
    assert d[RECORDED_GENERATION_LIMIT] == 48 and "max_new_tokens" not in d
    assert list(d)[4] == "max_tokens"  # after open_lines, as written before (json key order)
    assert RunSettings.preset("baseline", max_new_tokens=64).to_dict() == {
        "filter": "none", "validation": "off", "manager_steps": 3, "worker_steps": 3, "max_rewrites": 1,
        "max_validation_steps": 8, "validation_extra_steps": 3, "top_k": 4, "page_chars": 1200, "max_tokens": 64,
        "temperature": 0.0, "final_check": False, "name": "baseline"}
    assert list(as_recorded({"a": 1, "max_new_tokens": 2, "b": 3}).items()) == [("a", 1), ("max_tokens", 2), ("b", 3)]


# Where the name ``max_tokens`` may still appear in the package, and why: the capture's prompt limit, and the
# names other APIs give the generation limit (the OpenAI wire, vLLM's SamplingParams, llguidance's Lark
# caps), the recorded key, and one statistic (the longest injected system prompt in tokens).
ALLOWED = {
    "capture/api.py", "capture/job.py", "capture/models.py", "cli/options.py", "cli/counterfactual.py", "cli/study.py",
    "render/rendering.py", "counterfactual/actions.py", "counterfactual/extras.py", "counterfactual/contexts.py",
    "counterfactual/run.py", "counterfactual/job.py", "studies/loop/in_loop.py",  # capture's prompt limit
    "generation/server/protocol.py", "generation/server/http.py", "generation/openai_chat.py",  # the OpenAI wire
    "generation/vllm_chat.py",  # SamplingParams(max_tokens=...)
    "generation/grammars.py",  # llguidance's [max_tokens=N]
    "io/settings.py", "studies/loop/agents.py",  # the recorded key; Seed 002's release quoted
    "studies/loop/attention.py", "results/caveats.py",  # injected_system's min_tokens / max_tokens statistic
}


def test_max_tokens_only_where_it_is_the_prompt_limit_or_another_apis_name():
    root = Path(attnprobe.__file__).parent
    found = {str(p.relative_to(root)) for p in root.rglob("*.py") if re.search(r"\bmax_tokens\b", p.read_text())}
    assert found <= ALLOWED, sorted(found - ALLOWED)
    for rel in ("generation/chat.py", "generation/transformers_chat.py", "generation/decode.py", "agents/recorder.py",
                "studies/runner/config.py", "studies/ibis/jobs.py", "studies/ibis/behaviour.py"):
        text = (root / rel).read_text()
        assert "max_new_tokens" in text and not re.search(r"\bmax_tokens\b", text), rel
