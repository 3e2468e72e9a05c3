"""attnprobe: exact attention by turn and role inside LLM search-agent trajectories."""

from attnprobe._version import __version__
from attnprobe.capture.api import capture, prepare, select_queries  # noqa: E402
from attnprobe.capture.models import LoadedModel, load_model  # noqa: E402
from attnprobe.errors import AttnprobeError, ModelNotFoundError, RenderError, TooLongError, TrajectoryError
from attnprobe.render.rendering import Rendered, render  # noqa: E402
from attnprobe.render.segments import AUTHORS, ROLES, QueryPoint, Segment  # noqa: E402
from attnprobe.results.result import CaptureResult  # noqa: E402
from attnprobe.trajectory.schema import Trajectory, load_trajectories, save_trajectories  # noqa: E402

__all__ = [
    "__version__", "capture", "prepare", "select_queries", "AttnprobeError", "ModelNotFoundError", "RenderError",
    "TooLongError", "TrajectoryError", "LoadedModel", "load_model", "Rendered", "render", "CaptureResult",
    "AUTHORS", "ROLES", "QueryPoint", "Segment", "Trajectory", "load_trajectories", "save_trajectories",
]
