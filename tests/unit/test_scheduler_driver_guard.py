"""The scheduler driver never fails silently: a call that could not be sent raises at the call
and uses up no offer, and a callback that raises gets its offers declined and a short
traceback logged."""

from __future__ import annotations

from typing import Any

import agora.sdk.scheduler._events as events_module
import agora.sdk.scheduler.driver as driver_module
import pytest
from agora.sdk import TaskSpec
from agora.sdk.messages import Accept, Decline, Filters, Offer
from agora.sdk.scheduler._guard import TRACEBACK_FRAMES
from support.fake_master import eventually
from test_scheduler_driver import Recorder, first_offer, run, subscribed


def test_a_launch_the_codec_would_refuse_raises_at_the_call_and_keeps_the_offer() -> None:
    async def main() -> None:
        sched = Recorder()
        async with subscribed(sched) as (master, _agent, driver):
            offer = await first_offer(sched)
            with pytest.raises(ValueError, match=r"ACCEPT\..*task_id"):
                driver.launch(offer, [TaskSpec("t" * 300, "true", "cpus:1;mem:64")])
            # Nothing was sent and the offer is still the driver's to use.
            driver.launch(offer.offer_id, [TaskSpec("ok", "true", "cpus:1;mem:64")])
            await eventually(lambda: master.of_type(Accept), "the good ACCEPT")
            (accept,) = master.of_type(Accept)
            assert accept.offer_ids == (offer.offer_id,)
            with pytest.raises(ValueError, match="refuse_seconds"):
                driver.decline([], Filters(refuse_seconds=-1))

    run(main())


class Raises(Recorder):
    def offers(self, driver: Any, offers: list[Offer]) -> None:
        super().offers(driver, offers)
        self._deep(3)

    def _deep(self, n: int) -> None:
        if n:
            self._deep(n - 1)
        raise RuntimeError("the scheduler's own bug")


class _Logs:
    """Stands in for the driver's loggers: structlog's capture cannot see loggers that an earlier
    test's configuration already cached."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def _record(self, event: str, **kw: Any) -> None:
        self.events.append({"event": event, **kw})

    debug = info = warning = error = exception = _record


def test_offers_left_by_a_callback_that_raised_are_declined_and_the_traceback_is_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured = _Logs()
    monkeypatch.setattr(driver_module, "log", captured)
    monkeypatch.setattr(events_module, "log", captured)

    async def main() -> None:
        sched = Raises()
        async with subscribed(sched) as (master, _agent, _driver):
            await eventually(lambda: master.of_type(Decline), "the DECLINE")
            (decline,) = master.of_type(Decline)[:1]
            assert decline.offer_ids == (sched.offers_seen[0].offer_id,)
            assert decline.filters == Filters()  # the default 5 s: no bounce back at once

    run(main())
    logs = captured.events
    (failed,) = [e for e in logs if e["event"] == "scheduler_callback_failed"]
    assert failed["callback"] == "offers"
    frames = failed["error"].count('File "')
    assert 1 <= frames <= TRACEBACK_FRAMES
    assert "RuntimeError: the scheduler's own bug" in failed["error"]
    assert any(e["event"] == "offers_declined_after_callback_failed" for e in logs)
