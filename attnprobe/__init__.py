"""attnprobe: exact attention by turn and role inside LLM search-agent trajectories."""

from attnprobe._version import __version__
from attnprobe.capture.api import capture, capture_many, prepare, select_queries
from attnprobe.capture.models import LoadedModel, load_model
from attnprobe.errors import AttnprobeError, ModelNotFoundError, RenderError, TooLongError, TrajectoryError
from attnprobe.render.rendering import Rendered, render
from attnprobe.render.segments import AUTHORS, ROLES, QueryPoint, Segment
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory, load_trajectories, save_trajectories

__all__ = [
    "__version__", "capture", "capture_many", "prepare", "select_queries", "AttnprobeError", "ModelNotFoundError", "RenderError",
    "TooLongError", "TrajectoryError", "LoadedModel", "load_model", "Rendered", "render", "CaptureResult",
    "AUTHORS", "ROLES", "QueryPoint", "Segment", "Trajectory", "load_trajectories", "save_trajectories",
]
