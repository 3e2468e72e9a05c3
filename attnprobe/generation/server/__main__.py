"""``python -m attnprobe.generation.server``: the same server as ``attnprobe serve`` (default port 0)."""

import sys

from attnprobe.generation.server.options import main

sys.exit(main())
