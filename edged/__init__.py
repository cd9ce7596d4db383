"""edged: an inference server for edge appliances that serves Triton model repositories over KServe v2."""

from __future__ import annotations

__version__ = "0.1.0"
