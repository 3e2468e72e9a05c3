"""One IBIS model folder per variant: where a run's results go and what makes them one variant.

``<results>/<model>[__<dtype>][__matched]``: a dtype other than float32 and the matched protocol get
folders of their own, so results of different variants are never mixed; ``run.json`` records the
variant (dtype, and the weights fingerprint in process or the endpoint and served model) and a run
of another variant into the same folder is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from attnprobe.io import atomic_write_text, dumps_line, safe_name, write_jsonl
from attnprobe.studies.ibis.framings import FRAMINGS, IbisProtocol, as_protocol, build_framing
from attnprobe.studies.ibis.items import IbisItem, load_items
from attnprobe.studies.ibis.layout import ModelFolderLayout


def model_name(spec: str, *, served_model: str | None = None) -> str:
    """The name a model's folder is called by: the served model for an endpoint, else the bundled
    model's name, a GGUF file's stem or a folder's (or hub id's) last part."""
    if served_model:
        return served_model
    if spec == "default":
        from attnprobe.capture.models import DEFAULT_NAME

        return DEFAULT_NAME
    return Path(spec).stem if spec.endswith(".gguf") else Path(spec).name or spec


def model_folder(results: Path, name: str, *, dtype: str = "float32", protocol: str = "paper") -> Path:
    return Path(results) / (safe_name(name, "model") + ("" if dtype in (None, "float32") else f"__{dtype}")
                            + ("" if protocol == "paper" else f"__{protocol}"))


def variant(*, dtype: str = "float32", model: str | None = None, endpoint: str | None = None,
            served_model: str | None = None) -> dict:
    """What makes a result a result of *this* model: the dtype, and the weights fingerprint of
    ``model`` (in process) or the endpoint and served model (generation through a server)."""
    v: dict = {"dtype": dtype}
    if endpoint is not None:
        v.update({"endpoint": endpoint, "served_model": served_model})
    else:
        from attnprobe.capture.api import weights_hash

        v["weights"] = weights_hash(model or "default")
    return v


def prepare_folder(folder: Path, items: Sequence[IbisItem], *, name: str, protocol: IbisProtocol | str, this_variant: dict,
                   items_source: str) -> None:
    """Write the folder's items (the exact items used, merged with earlier ones), framings and run record
    (:class:`~attnprobe.studies.ibis.layout.ModelFolderLayout`); refuses changed items, another protocol and another variant."""
    protocol = as_protocol(protocol)
    from attnprobe._version import __version__

    folder.mkdir(parents=True, exist_ok=True)
    layout = ModelFolderLayout(folder)
    items_text = "".join(dumps_line(it.to_dict()) for it in items)
    old = layout.items
    if old.is_file() and old.read_text(encoding="utf-8") != items_text:
        prev = {it.id: it.to_dict() for it in load_items(old)}
        changed = [it.id for it in items if it.id in prev and prev[it.id] != it.to_dict()]
        if changed:
            raise ValueError(f"{folder}: items {', '.join(changed[:5])} differ from the ones already run there; use a "
                             f"new --folder or delete the old results")
        merged = {**prev, **{it.id: it.to_dict() for it in items}}
        items_text = "".join(dumps_line(v) for v in merged.values())
    atomic_write_text(old, items_text)
    all_items = load_items(old)
    run = layout.read_run()
    done_with = run.get("protocol", "matched" if run else protocol.name)  # folders before protocols: matched
    if done_with != protocol.name:
        raise ValueError(f"{folder} holds a --protocol {done_with} run; this one is --protocol {protocol.name}: use "
                         "another --folder (or the default folder of that protocol)")
    merged_variant = {**run.get("variant", {}), **this_variant}
    diffs = [f"{k} was {run['variant'][k]!r}, now {merged_variant[k]!r}" for k in run.get("variant", {})
             if k in this_variant and run["variant"][k] != merged_variant[k]]
    if diffs:
        raise ValueError(f"{folder} holds results of another variant ({'; '.join(diffs)}): use another --folder "
                         "(or --results; a dtype other than float32 gets its own default folder)")
    write_jsonl(layout.framings,
                (build_framing(it, fr, protocol).to_dict() for it in all_items for fr in FRAMINGS))
    run.update({"model": name, **protocol.record(),
                "variant": merged_variant, "attnprobe_version": __version__,
                "items_source": items_source, "items_sha256": hashlib.sha256(items_text.encode()).hexdigest()[:16]})
    run.setdefault("stages", {})
    atomic_write_text(layout.run, json.dumps(run, indent=1))


def update_run(folder: Path, stage: str, info: dict) -> None:
    """Record one stage's settings and counts in run.json."""
    layout = ModelFolderLayout(Path(folder))
    run = layout.read_run()
    run.setdefault("stages", {})[stage] = info
    atomic_write_text(layout.run, json.dumps(run, indent=1))


def invariants(model, items: Sequence[IbisItem], protocol: IbisProtocol) -> dict | None:
    """The framing invariants on the first item for the model's chat template (None for a model
    without a local tokenizer, an endpoint); refuses a template that breaks them. Runs where the
    model is (``executor.call``)."""
    from attnprobe.studies.ibis.framings import check_invariants

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None
    res = check_invariants(tokenizer, items[0], protocol=protocol)
    if not res["ok"]:
        raise ValueError("framing invariants broken for this chat template: " + "; ".join(res["problems"]))
    return res
