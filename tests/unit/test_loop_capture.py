"""Capture in the loop, the generator's side (issue 40): the rows a batched, KV-reusing, left-padded
generation scores while it runs equal transformers' own eager attention on the same tokens (an independent
reference: explicit softmax, full sequence, no attnprobe code)."""

import json
import re

import numpy as np
import pytest
import torch

from attnprobe.generation.capturing import CaptureSpec
from attnprobe.generation.chat import ChatRequest
from attnprobe.generation.transformers_chat import TransformersChat
from tests.support.eager import eager_output_attentions
from tests.support.scripted_chat import ScriptedChat


def _check_rows(model, cap, tol=1e-5):
    """Every scored row (per layer, per head, per key) against eager attention on ``cap.token_ids``."""
    pos = cap.scorer.qpos.tolist()
    ref = eager_output_attentions(model, cap.token_ids, pos)  # [nq, L, H, n]
    layers = sorted(cap.scorer.per_layer)
    got = np.stack([cap.scorer.per_layer[li].numpy() for li in layers], axis=1)  # [nq, L, H, n] (per-key segments)
    assert got.shape == ref[:, layers].shape
    assert np.abs(got - ref[:, layers]).max() < tol
    lh = len(layers) * got.shape[2]
    assert np.abs(cap.scorer.token_sum.numpy() - ref[:, layers].sum(axis=(1, 2))).max() < tol * lh
    assert np.allclose(got.sum(-1), 1.0, atol=1e-5)  # every row is a whole softmax: padding is no key


def test_batched_rows_with_reuse_and_left_padding_equal_eager(tiny_smol):
    chat = TransformersChat(tiny_smol, stop_at_call=False)
    conv = {"a": [{"role": "user", "content": "Name a colour."}],
            "b": [{"role": "system", "content": "You answer in one word, always, and you never explain anything."},
                  {"role": "user", "content": "What is the capital of France? Think first."}]}
    for turn in range(2):  # the second turn reuses each episode's kept cache (prefix) and pads "a" on the left
        reqs = []
        for ep, msgs in conv.items():
            n = len(chat.prompt(msgs).ids)
            reqs.append(ChatRequest(msgs, max_new_tokens=5, episode=ep,
                                    capture=CaptureSpec(positions=(n // 2, n - 1), layers=(0, 2, 3))))
        replies = chat.complete_batch(reqs)
        if turn == 1:
            assert chat.last_stats["prefilled"] < chat.last_stats["sent"]  # the kept caches were used
        for req, rep in zip(reqs, replies):
            cap = rep.capture
            n = len(rep.prompt.ids)
            assert cap.token_ids[:n] == rep.prompt.ids and len(cap.token_ids) == n + 1
            assert cap.scorer.qpos.tolist() == [n // 2, n - 1, n]
            assert sorted(cap.scorer.per_layer) == [0, 2, 3]
            _check_rows(tiny_smol.model, cap)
            conv[req.episode] = req.messages + [rep.as_message(), {"role": "user", "content": "And then?"}]


def test_a_reply_of_one_token_is_fed_once_to_score_its_start(tiny_smol):
    chat = TransformersChat(tiny_smol, stop_at_call=False)
    msgs = [{"role": "user", "content": "Say nothing."}]
    n = len(chat.prompt(msgs).ids)
    other = [{"role": "user", "content": "Write a long story about a dog and a cat."}]
    reps = chat.complete_batch([ChatRequest(msgs, max_new_tokens=1, capture=CaptureSpec(positions=(n - 1,))),
                                ChatRequest(other, max_new_tokens=4, capture=CaptureSpec(positions=()))])
    assert reps[0].output_tokens == 1 and reps[0].capture.scorer.qpos.tolist() == [n - 1, n]
    for r in reps:
        _check_rows(tiny_smol.model, r.capture)


def test_capture_needs_an_in_process_backend():
    chat = ScriptedChat(lambda messages, tools: "x")
    with pytest.raises(ValueError, match="cannot capture attention while generating"):
        chat.complete_batch([ChatRequest([{"role": "user", "content": "x"}], capture=CaptureSpec(positions=(0,)))])


def test_the_spec_checks_its_positions():
    with pytest.raises(ValueError, match="strictly increasing"):
        CaptureSpec(positions=(3, 3))
    with pytest.raises(ValueError, match="outside the prompt"):
        CaptureSpec(positions=(5,)).query_positions(5)
    assert CaptureSpec(positions=(1, 4)).query_positions(5) == [1, 4, 5]
    assert torch.equal(torch.as_tensor(CaptureSpec(positions=()).segments(3)[0]), torch.arange(4))


# ---------------------------------------------------------------------------------------- the study side
from attnprobe.cli.main import main  # noqa: E402
from attnprobe.resources import data_path  # noqa: E402
from attnprobe.studies.loop.layout import StudyLayout  # noqa: E402
from tests.support.loop_capture import compare, in_loop_folders, numbers_close, post_hoc_copy  # noqa: E402

SCAFFOLDS = {  # every scaffold form, three policies each, structured actions (a random model then acts)
    # (the reply budget is the one at which the random model, seed 0, acts over several turns)
    "seed002": ["--scaffold", "seed002", "--policy", "none", "--policy", "mask:1", "--policy", "mask-obs:1",
                "--max-new-tokens", "40"],
    "ircot-chat": ["--scaffold", "ircot", "--ircot-form", "chat", "--policy", "none", "--policy", "ircot:o",
                   "--policy", "mask-obs:1", "--max-new-tokens", "32"],
    "ircot-stream": ["--scaffold", "ircot", "--policy", "none", "--policy", "ircot:oq", "--policy", "mask-obs:1",
                     "--max-new-tokens", "60"],
}
KILLED = ["--scaffold", "seed002", "--policy", "none", "--policy", "mask:1", "--max-new-tokens", "40"]


def _interference(out, model, form, *extra):
    return main(["study", "interference", str(data_path("questions_loop.jsonl")), *SCAFFOLDS.get(form, KILLED), "--limit", "1",
                 "--max-turns", "3", "--generation-preset", "cpu", "--structured-actions",
                 "--episodes-per-batch", "3", "--model", str(model), "--out", str(out), "--no-progress",
                 "--bootstrap", "20", *extra])


def _attention(out, capsys):
    capsys.readouterr()
    assert main(["study", "attention", str(out), "--no-progress", "--bootstrap", "20"]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if "captured in the loop (0 tokens" in line]


@pytest.mark.parametrize("form", list(SCAFFOLDS))
def test_study_captured_in_the_loop_equals_study_attention(tmp_path, tiny_smol_folder, form, capsys):
    loop = tmp_path / "loop"
    assert _interference(loop, tiny_smol_folder, form, "--capture-in-loop") == 0
    calls = sum(1 for p in loop.glob("*/calls/*.jsonl") for _ in p.open())
    assert calls > 3 and len(in_loop_folders(loop)) == calls  # every call, each setting, several turns
    err = capsys.readouterr().err  # the count is read from the capture folders (right on Ray replicas too)
    assert f"capture in the loop: {calls} of {calls} recorded calls captured while generating, 0 left" in err, err
    study = json.loads((loop / "study.json").read_text())
    per = {s: sum(1 for _ in StudyLayout(loop).calls_file(s).open()) for s in study["settings"]}
    assert study["captured_in_the_loop"] == {s: {"captured": n, "calls": n} for s, n in per.items()}
    assert ("Calls captured in the loop (attention from the agent's own forward passes; the rest are left to "
            "'study attention'): " + ", ".join(f"{s} {n} of {n}" for s, n in per.items()) + ".") \
        in (loop / "study.md").read_text()
    post = post_hoc_copy(loop, tmp_path / "post")
    lines = _attention(loop, capsys)
    assert len(lines) == 3  # one per setting: every call captured in the loop, nothing prefilled for them
    for line in lines:
        m = re.search(r"(\d+) of (\d+) calls were captured in the loop", line)
        assert m and m[1] == m[2] and int(m[1]) > 0, line
        assert "; 0 tokens prefilled for the calls captured now" in line, line
    _attention(post, capsys)
    cmp = compare(loop, post)
    assert cmp["calls"] == calls and cmp["meta_differs"] == []
    assert max(cmp["max_abs_diff"].values()) < 1e-5
    a = json.loads((loop / "attention.json").read_text())
    b = json.loads((post / "attention.json").read_text())
    assert numbers_close(a, b, 1e-5) == []
    assert (loop / "attention.md").read_text() == (post / "attention.md").read_text()


def test_killed_study_captured_in_the_loop_resumes_to_the_same_files(tmp_path, tiny_smol_folder, monkeypatch):
    from attnprobe.studies.loop import in_loop

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert _interference(whole, tiny_smol_folder, "killed", "--capture-in-loop", "--episodes-per-batch", "1") == 0
    real, seen = in_loop.CapturingChat.complete_batch, []

    def dying(self, requests):
        seen.append(1)
        if len(seen) == 4:  # the second episode's first call: the first is written
            raise KeyboardInterrupt  # the process dies: no executor catches it
        return real(self, requests)

    monkeypatch.setattr(in_loop.CapturingChat, "complete_batch", dying)
    try:
        assert _interference(resumed, tiny_smol_folder, "killed", "--capture-in-loop", "--episodes-per-batch", "1") != 0
    except KeyboardInterrupt:
        pass
    assert 0 < len(list(resumed.glob("*/results/*.json"))) < 2
    monkeypatch.setattr(in_loop.CapturingChat, "complete_batch", real)
    assert _interference(resumed, tiny_smol_folder, "killed", "--capture-in-loop", "--episodes-per-batch", "1") == 0
    assert _files(whole) == _files(resumed)


def _files(root):
    """Every file of the study but timings (results' seconds), the lock and the summary files that hold them."""
    import numpy as np

    from attnprobe.results.result import CaptureResult

    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if not p.is_file() or p.name in ("study.json", "study.md") or ".lock" in p.name or "/capture/" in rel:
            continue
        rec = p.read_text(encoding="utf-8")
        if p.parent.name == "results":
            d = json.loads(rec)
            d.pop("seconds")
            rec = json.dumps(d, sort_keys=True)
        out[rel] = rec
    for meta in sorted(root.glob("*/capture/*/meta.json")):
        r = CaptureResult.load(meta.parent)
        m = {k: v for k, v in r.meta.items() if k not in ("capture_seconds",)}
        out[str(meta.parent.relative_to(root))] = (json.dumps(m, sort_keys=True, default=str),
                                                   np.asarray(r.layer_head_attention).tobytes())
    return out


def test_capture_in_the_loop_refuses_a_served_generator(tmp_path, capsys):
    """An endpoint returns text, not attention: refused in one line before anything loads or runs."""
    rc = _interference(tmp_path / "s", "default", "killed", "--capture-in-loop", "--generator", "openai",
                       "--base-url", "http://127.0.0.1:9/v1", "--served-model", "m")
    assert rc == 2
    err = capsys.readouterr().err
    assert "--generator openai returns text, not attention: run 'study attention' afterwards" in err, err
    assert not (tmp_path / "s" / "study.json").exists()


def test_capture_in_the_loop_with_vllm_refuses_ray(tmp_path, tiny_smol_folder, capsys):
    """A Ray replica builds its chat from the model spec, not the in-process engine that generates and
    captures: refused (the adapter, when the executor opens), not a study whose captures silently go missing."""
    rc = _interference(tmp_path / "s", tiny_smol_folder, "killed", "--capture-in-loop", "--generator", "vllm",
                       "--ray", "--ray-replicas", "1")
    assert rc != 0
    err = capsys.readouterr().err
    assert "--ray: --generator vllm --capture-in-loop runs one in-process vLLM engine" in err, err
    assert not list((tmp_path / "s").glob("*/results/*.json"))  # nothing ran


def test_a_deleted_in_loop_capture_is_counted_as_left(tmp_path, tiny_smol_folder, capsys):
    """The count is read from the capture folders, so a capture removed after the run is one left for
    'study attention', in the log line and in study.json."""
    out = tmp_path / "s"
    assert _interference(out, tiny_smol_folder, "killed", "--capture-in-loop") == 0
    folders = in_loop_folders(out)
    n = len(folders)
    assert n > 1
    import shutil

    shutil.rmtree(folders[0])
    capsys.readouterr()
    assert _interference(out, tiny_smol_folder, "killed", "--capture-in-loop") == 0  # resumes: nothing to run
    err = capsys.readouterr().err
    assert f"capture in the loop: {n - 1} of {n} recorded calls captured while generating, 1 left" in err, err
    study = json.loads((out / "study.json").read_text())
    got = study["captured_in_the_loop"]
    assert sum(v["captured"] for v in got.values()) == n - 1 and sum(v["calls"] for v in got.values()) == n
