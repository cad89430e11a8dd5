"""A stalled event loop is named in the log with its length (server/http/loop_watch.py)."""

from __future__ import annotations

import asyncio
import logging
import time

from gclm.server.http.loop_watch import watch_loop


def test_a_stall_is_logged_with_its_length(caplog) -> None:
    async def main() -> None:
        watch = asyncio.get_running_loop().create_task(watch_loop(threshold_s=0.3, tick_s=0.05))
        await asyncio.sleep(0.2)  # running, no stall: nothing logged
        assert not stalls()
        time.sleep(0.8)  # blocks the loop
        await asyncio.sleep(0.2)
        watch.cancel()

    def stalls() -> list[str]:
        return [r.getMessage() for r in caplog.records if "blocked for" in r.getMessage()]

    caplog.set_level(logging.WARNING, logger="gclm.server")
    asyncio.run(main())
    [message] = stalls()
    late = float(message.split("blocked for ")[1].split(" s")[0])
    assert 0.6 < late < 3  # 0.8 s, less the tick it would have slept anyway
