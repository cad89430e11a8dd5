"""A warning in the log when the serving event loop stalls.

While a callback holds the loop, nothing else on it moves: streams wait for their next
chunk, /health does not answer, and new connections are not read. `watch_loop()` wakes every
`tick_s` seconds and logs one line when a wake-up came more than `threshold_s` late, so a
stall shows in the log with its length instead of only as slow clients.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger("gclm.server")


async def watch_loop(threshold_s: float = 1.0, tick_s: float = 0.25) -> None:
    """Run until cancelled, logging every stall of the running loop past `threshold_s`."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + tick_s
        await asyncio.sleep(tick_s)
        late = loop.time() - due
        if late > threshold_s:
            logger.warning(
                "the event loop was blocked for %.1f s: streams, /health and new "
                "connections waited that long",
                late,
            )
