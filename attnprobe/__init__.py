"""attnprobe: exact attention by turn and role inside LLM search-agent trajectories."""

__version__ = "0.1.0"

from .capture import capture, prepare, select_queries  # noqa: E402
from .errors import (AttnprobeError, ModelNotFoundError, RenderError, TooLongError,  # noqa: E402
                     TrajectoryError)
from .models import LoadedModel, load_model  # noqa: E402
from .render import Rendered, render  # noqa: E402
from .result import CaptureResult  # noqa: E402
from .segments import AUTHORS, ROLES, QueryPoint, Segment  # noqa: E402
from .trajectory import Trajectory, load_trajectories, save_trajectories  # noqa: E402

__all__ = [
    "__version__", "capture", "prepare", "select_queries", "AttnprobeError", "ModelNotFoundError", "RenderError",
    "TooLongError", "TrajectoryError", "LoadedModel", "load_model", "Rendered", "render", "CaptureResult",
    "AUTHORS", "ROLES", "QueryPoint", "Segment", "Trajectory", "load_trajectories", "save_trajectories",
]
