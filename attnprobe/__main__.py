"""``python -m attnprobe``: the same command line as the ``attnprobe`` script."""

import sys

from attnprobe.cli.main import main

sys.exit(main())
