"""CaptureResult: the scores of one trajectory, self-describing, saved as safetensors + JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.io import AtomicDir, check_regular_file, finite_json, load_json
from attnprobe.render.segments import AUTHORS, ROLES, QueryPoint, Segment
from attnprobe.results.layout import CaptureLayout

FORMAT_VERSION = 1
META_FILE, TEXT_FILE, SCORES_FILE, QK_FILE = CaptureLayout.META, CaptureLayout.TEXT, CaptureLayout.SCORES, CaptureLayout.QK


@dataclass
class CaptureResult:
    """Attention from query positions to the segments of one rendered trajectory.

    segment_attention [nq, S]: mean over scored layers and heads of the attention mass from each
    query to each segment. layer_head_attention [nq, L, H, S]: the same before averaging.
    token_attention [nq, n]: the mean row over layers and heads (for token-level views).
    """

    trajectory_id: str
    input_ids: np.ndarray
    segments: list[Segment]
    queries: list[QueryPoint]
    layers: list[int]
    segment_attention: np.ndarray
    layer_head_attention: np.ndarray
    token_attention: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    offsets: np.ndarray | None = None
    qk: dict[str, Any] | None = field(default=None, repr=False)  # saved q/k tensors (save_qk_layers)

    @property
    def query_positions(self) -> np.ndarray:
        return np.asarray([q.position for q in self.queries], dtype=np.int64)

    @property
    def num_turns(self) -> int:
        return 1 + max(s.turn for s in self.segments)

    @property
    def roles(self) -> tuple[str, ...]:
        return ROLES

    def segment_arrays(self) -> dict[str, np.ndarray]:
        return {
            "start": np.asarray([s.start for s in self.segments], dtype=np.int64),
            "end": np.asarray([s.end for s in self.segments], dtype=np.int64),
            "turn": np.asarray([s.turn for s in self.segments], dtype=np.int64),
            "role": np.asarray([ROLES.index(s.role) for s in self.segments], dtype=np.int64),
            "author": np.asarray([AUTHORS.index(s.author) for s in self.segments], dtype=np.int64),
            "message_index": np.asarray([s.message_index for s in self.segments], dtype=np.int64),
        }

    def attention(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """[nq, S] for one scored layer (model layer index) and/or head, or the overall mean."""
        if layer is None and head is None:
            return self.segment_attention
        lh = self.layer_head_attention
        if layer is not None:
            if layer not in self.layers:
                raise KeyError(f"layer {layer} was not scored (scored: {self.layers})")
            lh = lh[:, [self.layers.index(layer)]]
        if head is not None:
            lh = lh[:, :, [head]]
        return lh.mean(axis=(1, 2))

    def turn_role_attention(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """[nq, num_turns, len(ROLES)]: attention summed by (turn, role) (sorted reduceat: fast for
        thousands of segments)."""
        arr = self.segment_arrays()
        att = np.asarray(self.attention(layer, head), dtype=np.float64)
        n_roles = len(ROLES)
        keys = arr["turn"] * n_roles + arr["role"]
        order = np.argsort(keys, kind="stable")
        uniq, starts = np.unique(keys[order], return_index=True)
        out = np.zeros((att.shape[0], self.num_turns * n_roles), dtype=np.float64)
        if len(uniq):
            out[:, uniq] = np.add.reduceat(att[:, order], starts, axis=1)
        return out.reshape(att.shape[0], self.num_turns, n_roles)

    def author_attention(self, layer: int | None = None, head: int | None = None) -> dict[str, np.ndarray]:
        """Attention per query to the model's own text vs external information (template excluded)."""
        arr = self.segment_arrays()
        att = self.attention(layer, head)
        not_template = arr["role"] != ROLES.index("template")
        return {a: att[:, (arr["author"] == i) & not_template].sum(axis=1) for i, a in enumerate(AUTHORS)}

    # ---------------------------------------------------------------- text views (hover labels, token strips)
    def token_roles(self) -> np.ndarray:
        """Role index (into ROLES) of every token."""
        out = np.full(len(self.input_ids), ROLES.index("template"), dtype=np.int64)
        for s in self.segments:
            out[s.start:s.end] = ROLES.index(s.role)
        return out

    def token_texts(self) -> list[str]:
        """The rendered text of every token ("" when the text was not stored)."""
        if self.offsets is None or not self.text:
            return [""] * len(self.input_ids)
        return [self.text[int(a):int(b)] for a, b in self.offsets[: len(self.input_ids)]]

    def turn_texts(self) -> dict[str, list[str]]:
        """Per turn: the text of its reasoning (+ tool calls), its observations, and everything else."""
        T = self.num_turns
        parts: dict[str, list[list[str]]] = {k: [[] for _ in range(T)] for k in ("reasoning", "observation", "other")}
        if self.offsets is None or not self.text:
            return {k: [""] * T for k in parts}
        for s in self.segments:
            if s.end <= s.start or s.role == "template":
                continue
            piece = self.text[int(self.offsets[s.start][0]):int(self.offsets[s.end - 1][1])]
            key = ("reasoning" if s.role in ("reasoning", "tool_call") else
                   "observation" if s.role == "observation" else "other")
            parts[key][s.turn].append(piece.strip())
        return {k: [" ".join(p for p in v if p) for v in lists] for k, lists in parts.items()}

    # ---------------------------------------------------------------- persistence
    def save(self, directory: str | Path) -> Path:
        """Write meta.json, text.json and scores.safetensors atomically into ``directory``.

        The tensors are serialised in memory and written with plain file writes, so a full disk is
        an OSError naming the file (not a library-specific error). NaN and infinities in the
        metadata become null (JSON has no NaN).
        """
        from safetensors.numpy import save as to_bytes

        directory = Path(directory)
        meta = dict(self.meta)
        meta.update({
            "format_version": FORMAT_VERSION,
            "trajectory_id": self.trajectory_id,
            "layers": list(self.layers),
            "roles": list(ROLES),
            "authors": list(AUTHORS),
            "num_tokens": int(len(self.input_ids)),
            "num_turns": self.num_turns,
            "segments": [s.to_dict() for s in self.segments],
            "queries": [q.to_dict() for q in self.queries],
        })
        arrays = {
            "input_ids": np.ascontiguousarray(self.input_ids, dtype=np.int64),
            "query_positions": self.query_positions,
            "segment_attention": np.ascontiguousarray(self.segment_attention, dtype=np.float32),
            "layer_head_attention": np.ascontiguousarray(self.layer_head_attention, dtype=np.float32),
            "token_attention": np.ascontiguousarray(self.token_attention, dtype=np.float32),
        }
        if self.offsets is not None:
            arrays["offsets"] = np.ascontiguousarray(self.offsets, dtype=np.int64)
        with AtomicDir(directory) as tmp:
            (tmp / SCORES_FILE).write_bytes(to_bytes(arrays))
            if self.qk:
                from safetensors.torch import save as torch_to_bytes

                (tmp / QK_FILE).write_bytes(torch_to_bytes({k: v.contiguous() for k, v in self.qk.items()}))
            (tmp / TEXT_FILE).write_text(json.dumps({"text": self.text}, ensure_ascii=False), encoding="utf-8")
            # meta.json last: its presence marks a complete result.
            (tmp / META_FILE).write_text(json.dumps(finite_json(meta), indent=1, ensure_ascii=False,
                                                    allow_nan=False), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> CaptureResult:
        """Read a capture folder; anything missing or malformed is an AttnprobeError naming the file
        (and field). meta.json over :data:`attnprobe.io.MAX_JSON_BYTES` is refused without being read."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        directory = Path(directory)
        meta_path = directory / META_FILE
        if not meta_path.is_file():
            raise AttnprobeError(f"{directory}: not a capture result (no {META_FILE})")
        meta = load_json(meta_path)
        if not isinstance(meta, dict):
            raise AttnprobeError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
        if meta.get("format_version") != FORMAT_VERSION:
            raise AttnprobeError(f"{meta_path}: unsupported format_version {meta.get('format_version')!r}")
        try:
            check_regular_file(directory / SCORES_FILE)  # safetensors opens it blocking: a FIFO would hang
            arrays = load_file(str(directory / SCORES_FILE))
        except (OSError, SafetensorError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise AttnprobeError(f"{directory / SCORES_FILE}: cannot read scores ({reason})") from None
        text_path = directory / TEXT_FILE
        text = ""
        if text_path.exists():  # load_json refuses a folder, a FIFO or a device in its place
            doc = load_json(text_path)
            text = doc.get("text", "") if isinstance(doc, dict) else None
            if not isinstance(text, str):
                raise AttnprobeError(f"{text_path}: expected {{'text': string}}")
        fld = "segments"
        try:
            segments = [Segment(**s) for s in meta.pop("segments")]
            fld = "queries"
            queries = [QueryPoint(**q) for q in meta.pop("queries")]
            fld = "trajectory_id / layers / score arrays"
            res = cls(
                trajectory_id=str(meta["trajectory_id"]), input_ids=arrays["input_ids"], segments=segments,
                queries=queries, layers=[int(x) for x in meta["layers"]],
                segment_attention=arrays["segment_attention"], layer_head_attention=arrays["layer_head_attention"],
                token_attention=arrays["token_attention"], meta=meta, text=text, offsets=arrays.get("offsets"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise AttnprobeError(f"{meta_path}, field '{fld}': malformed ({type(exc).__name__}: {exc})") from None
        for i, seg in enumerate(segments):  # every later stage indexes by role and author: check them here
            bad = ("role", seg.role, ROLES) if seg.role not in ROLES else (
                ("author", seg.author, AUTHORS) if seg.author not in AUTHORS else None)
            if bad is not None:
                raise AttnprobeError(f"{meta_path}, field 'segments[{i}].{bad[0]}': unknown {bad[0]} {bad[1]!r} "
                                     f"(expected one of {', '.join(bad[2])})")
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in
                       (seg.turn, seg.message_index, seg.start, seg.end)) or not 0 <= seg.start <= seg.end:
                raise AttnprobeError(f"{meta_path}, field 'segments[{i}]': turn, message_index, start and end must "
                                     "be integers with 0 <= start <= end")
        n_q, n_s = len(queries), len(segments)
        if (res.segment_attention.shape != (n_q, n_s) or res.layer_head_attention.ndim != 4
                or res.layer_head_attention.shape[::3] != (n_q, n_s)):
            raise AttnprobeError(f"{directory}: score arrays do not match {n_q} queries x {n_s} segments")
        return res

    def load_qk(self, directory: str | Path) -> dict[str, Any]:
        """q/k tensors saved with ``save_qk_layers`` (layer{L}.q [H, n, d], layer{L}.k [KVH, n, d])."""
        from safetensors.torch import load_file

        return load_file(str(Path(directory) / QK_FILE))
