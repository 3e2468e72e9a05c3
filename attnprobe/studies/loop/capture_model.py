"""Which model ``study attention`` captures with: the study's own, unless another is asked for.

The study records what generated (``study interference``'s entry ``model`` in
``OUT/.attnprobe-settings.json``, :func:`attnprobe.cli.loop.model_label`): ``transformers:SPEC:DTYPE`` for
a model run in process, ``openai:NAME`` for a served one; study.json's ``models`` holds the names its
results recorded. :func:`choose_capture_model`:

- no ``--model``: the study's own weights (its SPEC and DTYPE), or for a served model its NAME when that
  is local weights (a model folder, a .gguf file or a hub id in the local cache, as vLLM serves them);
  otherwise refused in one line, before anything loads;
- ``--model M``: M. When M's name is not the agent's, the capture model is another model than the agent:
  every output names both ("capture model X, agent model Y") and the console warns once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnprobe.errors import AttnprobeError, ModelNotFoundError
from attnprobe.io import load_json
from attnprobe.io.settings import SETTINGS_FILE
from attnprobe.model_files import DEFAULT_NAME
from attnprobe.studies.loop.layout import StudyLayout


@dataclass(frozen=True)
class CaptureChoice:
    spec: str              # what --model would be: loaded by the capture backend
    dtype: str | None      # the study's dtype (None: the command's --dtype)
    capture_model: str     # its name as results record it
    agent_model: str       # the study's model name(s)

    @property
    def differs(self) -> bool:
        return self.capture_model != self.agent_model

    @property
    def label(self) -> str:
        return f"capture model {self.capture_model}, agent model {self.agent_model}"


def study_record(out: Path) -> dict:
    """The study's model: ``{"kind": "local" | "served" | "unknown", "spec", "dtype", "name"}`` from its
    settings record, with study.json's ``models`` as the agent's name."""
    rec: dict = {}
    path = Path(out) / SETTINGS_FILE
    if path.is_file() and not path.is_symlink():
        try:
            data = load_json(path)
        except AttnprobeError:
            data = {}
        entry = data.get("study interference") if isinstance(data, dict) else None
        rec = entry if isinstance(entry, dict) else {}
    try:
        study = StudyLayout(Path(out)).read_study(stamps=False)
    except AttnprobeError:
        study = {}
    names = [str(m) for m in (study.get("models") or []) if m] if isinstance(study, dict) else []
    label = rec.get("model")
    out_rec = {"kind": "unknown", "spec": None, "dtype": None, "name": ", ".join(names) or None}
    if isinstance(label, str) and label.startswith("openai:"):
        served = label[len("openai:"):]
        out_rec.update(kind="served", spec=served, name=out_rec["name"] or served)
    elif isinstance(label, str) and label.count(":") >= 2:
        _, rest = label.split(":", 1)
        spec, dtype = rest.rsplit(":", 1)
        out_rec.update(kind="local", spec=spec, dtype=None if dtype == "None" else dtype)
        out_rec["name"] = out_rec["name"] or model_name(spec)
    return out_rec


def model_name(spec: str) -> str:
    """The name results record for ``spec`` (the bundled model's name, a .gguf stem, a folder's name, a hub
    id); a spec that names no local weights is one clear error."""
    from attnprobe.model_files import display_name, resolve_spec

    source, where, _ = resolve_spec(spec)
    return display_name(spec, source, where)


def local_weights(spec: str) -> bool:
    """Whether ``spec`` names weights on this machine (nothing is downloaded): a model folder, a .gguf file,
    the bundled model, or a hub id in the local Hugging Face cache."""
    from attnprobe.model_files import resolve_spec

    try:
        source, where, _ = resolve_spec(spec)
    except ModelNotFoundError:
        return False
    if source != "hf-cache":
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(str(where), "config.json"), str)
    except Exception:  # an id the hub library refuses is not local weights
        return False


def choose_capture_model(out: Path, model: str | None) -> CaptureChoice:
    """The capture model for the study in ``out`` (module docstring); ``model``: --model, None when not
    given. Refused in one line (exit 2) when the study's weights are not known here."""
    rec = study_record(out)
    agent = rec["name"] or "?"
    if model is not None:
        return CaptureChoice(model, None, model_name(model), agent)
    if rec["kind"] == "local":
        return CaptureChoice(rec["spec"], rec["dtype"], model_name(rec["spec"]), agent)
    if rec["kind"] == "unknown" and rec["name"] == DEFAULT_NAME:  # an older record: the bundled model's name
        return CaptureChoice("default", None, DEFAULT_NAME, agent)
    if rec["kind"] == "served" and local_weights(rec["spec"]):
        return CaptureChoice(rec["spec"], None, rec["name"] or model_name(rec["spec"]), agent)
    why = (f"was made against the served model {rec['spec']!r}, whose weights are not on this machine"
           if rec["kind"] == "served" else "records no model it was made with")
    raise AttnprobeError(f"{out}: {why}; give its weights with --model PATH (another model is labelled as such)")
