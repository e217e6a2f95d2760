"""A scheduler driver for plain synchronous code: the asyncio driver runs on its own thread.

Callbacks run on the driver's thread (receiving this BlockingSchedulerDriver as ``driver``);
the calls are thread-safe, so both callbacks and the calling thread may use them::

    driver = BlockingSchedulerDriver(MyScheduler(), FrameworkInfo(name="demo"), master)
    driver.run()            # blocks until a callback (or another thread) calls driver.stop()
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agora.sdk.ids import FrameworkID
from agora.sdk.messages import FrameworkInfo, MasterInfo, Message
from agora.sdk.scheduler._call_methods import CallMethods
from agora.sdk.scheduler.driver import DriverError, LinkFactory, SchedulerDriver
from agora.sdk.scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["BlockingSchedulerDriver"]


class BlockingSchedulerDriver(CallMethods):
    """Same arguments as :class:`SchedulerDriver`; runs it on a daemon thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        framework: FrameworkInfo,
        master: str | None = None,
        *,
        implicit_acknowledgements: bool = True,
        curve: CurveClient | None = None,
        heartbeat_interval: float = 5.0,
        subscribe_backoff: tuple[float, float] = (0.25, 5.0),
        link: LinkFactory | None = None,
    ) -> None:
        self._driver = SchedulerDriver(
            scheduler,
            framework,
            master,
            implicit_acknowledgements=implicit_acknowledgements,
            curve=curve,
            heartbeat_interval=heartbeat_interval,
            subscribe_backoff=subscribe_backoff,
            link=link,
        )
        self._driver._facade = self
        self._core = self._driver._core  # the calls (CallMethods) go through the same core
        self._thread: threading.Thread | None = None
        self._started = threading.Event()  # subscribed, or the start failed
        self._done = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def framework_id(self) -> FrameworkID | None:
        return self._driver.framework_id

    @property
    def master_info(self) -> MasterInfo | None:
        return self._driver.master_info

    @property
    def subscribed(self) -> bool:
        return self._driver.subscribed

    def start(self, timeout: float | None = None) -> FrameworkID:
        """Start the driver thread and wait until SUBSCRIBED; returns the framework id.

        Raises DriverError when the master refuses the subscription and TimeoutError (after
        stopping the driver) when no SUBSCRIBED came within ``timeout`` seconds.
        """
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._main, name="agora-scheduler-driver", daemon=True
            )
            self._thread.start()
        if not self._started.wait(timeout):
            self.stop(failover=True)
            self._join_thread(None)
            raise TimeoutError(f"no SUBSCRIBED from the master within {timeout}s")
        if self._error is not None:
            self._join_thread(None)
            raise self._error
        fid = self._driver.framework_id
        assert fid is not None
        return fid

    def run(self, timeout: float | None = None) -> None:
        """Start if needed, then block until :meth:`stop` has completed.

        Raises DriverError when the master ended the subscription. With ``timeout``: when the
        driver is still running after that many seconds it is stopped (framework torn down) and
        TimeoutError is raised. KeyboardInterrupt stops the driver (torn down) and propagates.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self.start(timeout)
            self.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise
        except DriverError:
            raise
        except BaseException:
            self.stop()
            self._join_thread(None)
            raise

    def join(self, timeout: float | None = None) -> None:
        """Wait for the driver to stop; TimeoutError (driver stopped first) after ``timeout``."""
        if self._thread is None:
            return
        if self._thread is threading.current_thread():
            raise RuntimeError("join() from a callback would wait for itself; call stop()")
        if not self._done.wait(timeout):
            self.stop()
            self._join_thread(None)
            raise TimeoutError(f"the scheduler driver was still running after {timeout}s")
        self._join_thread(None)
        if self._error is not None:
            raise self._error

    def stop(self, *, failover: bool = False) -> None:
        """Request a stop (see SchedulerDriver.stop); safe from callbacks and any thread."""
        self._driver.stop(failover=failover)

    def abort(self) -> None:
        self.stop(failover=True)

    def __enter__(self) -> BlockingSchedulerDriver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._join_thread(None)

    def _join_thread(self, timeout: float | None) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as exc:  # reported to the thread that waits
            if self._error is None:
                self._error = exc
        finally:
            self._started.set()
            self._done.set()

    async def _amain(self) -> None:
        driver = self._driver
        try:
            await driver.start()
        except BaseException as exc:
            self._error = exc
            return
        finally:
            self._started.set()
        try:
            await driver.join()
        except BaseException as exc:
            self._error = exc

    # ------------------------------------------------------------------ calls (thread-safe)

    def _call(self, name: str, make: Callable[..., Message], *args: Any) -> None:
        self._driver._call(name, make, *args)
