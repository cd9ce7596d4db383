from __future__ import annotations

from edged.cli import main

raise SystemExit(main())
