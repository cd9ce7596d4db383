"""``python scripts/benchmarks`` and ``python -m benchmarks`` (with scripts/ on the path): see cli.py."""

import sys
from pathlib import Path

if not __package__:
    # Run as a folder (python scripts/benchmarks): the package's parent, scripts/, takes the folder's place on the
    # path, so that the package and scripts/modelgen.py import, and its modules shadow nothing.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.cli import main

sys.exit(main())
