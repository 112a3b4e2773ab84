"""Log lines that a stranger can cause, throttled.

Anyone who reaches a port can make the router log: uvicorn warns once per malformed HTTP
request, and the token guard warns once per refused call. Unthrottled, a flood of bad
requests becomes a flood of log lines (disk, log shipping, and the one event loop that
formats them). `throttle_logs` puts a filter on those loggers that passes the first
record of each kind (logger and message template) and then at most one per `every_s`,
adding how many like it were dropped since.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

# Loggers whose records a client can trigger at will.
STRANGER_LOGGERS: Final = ("uvicorn.error", "sloline.serving.guard")


class Throttle(logging.Filter):
    """At most one record per (logger, template) per `every_s`; the next one passed says
    how many were dropped."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}  # -> (passed at, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        passed_at, dropped = self._kinds.get(key, (float("-inf"), 0))
        if now - passed_at < self.every_s:
            self._kinds[key] = (passed_at, dropped + 1)
            return False
        if len(self._kinds) > 1024:  # templates are few; never let the table grow
            self._kinds.clear()
        self._kinds[key] = (now, 0)
        if dropped:
            record.msg = (
                f"{record.msg} ({dropped} more like this in the last {now - passed_at:.0f} s)"
            )
        return True


def throttle_logs(names: tuple[str, ...] = STRANGER_LOGGERS, every_s: float = 10.0) -> None:
    """Throttle the loggers a client can trigger (once per process)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, Throttle) for f in logger.filters):
            logger.addFilter(Throttle(every_s))
