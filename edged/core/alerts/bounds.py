"""Every bound of alerting, in one place: what a receiver that never answers, a flood of alerts or a long reason
can cost the daemon. The tests (tests/unit/test_alerts.py) push each one past its limit.

A delivery takes at most TRIES tries of TRY_TIMEOUT_S each, with the BACKOFF_S waits between them: 5 x 5 s + 15 s =
40 s for a receiver that never answers. At most PENDING_MAX alerts wait for their delivery; more are dropped (and
counted) rather than queued without end, so a flood costs a bounded memory and a bounded number of writes.
"""

from __future__ import annotations

from typing import Final

# POSTs of one alert, the first included; then it is recorded as failed, with the last answer or error.
TRIES: Final = 5
# The wait before the second, third, ... try: doubling, so a receiver that restarts has time to come back.
BACKOFF_S: Final = (1.0, 2.0, 4.0, 8.0)
# One try, whole: connecting, sending, and the answer's status and headers. A receiver that answers a byte at a
# time is cut off here too (the connection is shut), not only one that says nothing.
TRY_TIMEOUT_S: Final = 5.0
# Of the receiver's answer, only the status matters; this much of its body is read, so the connection closes clean.
RESPONSE_READ_MAX: Final = 4096
# Alerts fired and not yet delivered (or given up on): the queue of pending deliveries. Past it, new alerts are
# dropped and counted, and the console says how many.
PENDING_MAX: Final = 64
# Alerts kept in the state database for the console: the newest; older ones go as new ones are written.
FIRED_KEPT: Final = 500
# Alerts the console lists.
RECENT_SHOWN: Final = 100
# A webhook's URL: longer is no one's endpoint.
URL_MAX: Final = 2048
# Characters of an alert's message (a model's reason can hold a whole backend traceback).
MESSAGE_MAX: Final = 1000
# How often the gauges are looked at: readiness each GAUGE_PERIOD_S, disk space and temperatures each
# CONDITIONS_PERIOD_S (read off the event loop; the reader keeps a reading 5 s anyway).
GAUGE_PERIOD_S: Final = 1.0
CONDITIONS_PERIOD_S: Final = 5.0
