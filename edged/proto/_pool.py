"""The descriptor pool that holds edged's generated protobuf types.

tritonclient registers its own copy of the ``inference.*`` types in protobuf's default pool, and a pool
refuses a second, different file that defines the same names. Keeping ours in a separate pool lets the server
and tritonclient (in tests, or in a Python model) live in one process. ``scripts/gen-proto`` points the
generated modules here.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
