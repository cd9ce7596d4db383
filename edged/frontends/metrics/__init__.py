"""The metrics endpoint (Prometheus text format) on its own port, as Triton serves it.

``GET /metrics`` lists, under Triton's names: the per-model families built from the statistics (``models``), the CPU
and GPU gauges (``system``), the metric families models create themselves (the Python backend's
``pb_utils.MetricFamily``) under their own names, then edged's own ``edged_*`` families (``endpoint``). Any other
method on /metrics is 405; any other path is 404 with a line that says where the metrics are.

The package itself imports nothing: ``edged.config`` reads ``config`` (the ``--metrics-config`` parser) at the start
of every command, which must not pay for prometheus-client and the collectors.
"""
