"""kubelet's Evented PLEG subscription, for the proxy's drain tests: ``GetContainerEvents`` on a channel, called
again after each end of the stream (kubelet's watchEventsChannel: at once on older kubelets, after a 250 ms
backoff on newer ones; here 250 ms), with every event and every end recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from wire import cri_pb2 as cri

from .cri import CriClient

RESUBSCRIBE_S = 0.25  # kubelet's streamRetryBackoff.Duration


@dataclass(frozen=True, slots=True)
class StreamEnd:
    at: float  # time.monotonic() when the client saw the stream end
    code: str  # its gRPC status code (OK: ended without an error)
    details: str
    events: int  # events received on that subscription
    subscription: int  # which one it was (1 for the first)


class EventSubscriber:
    """GetContainerEvents through ``client``'s channel in a thread, subscribed again after every end, until
    :meth:`stop`. ``metadata`` goes with each call."""

    def __init__(self, client: CriClient, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.client = client
        self.metadata = metadata
        self.events: list[tuple[int, float, cri.ContainerEventResponse]] = []  # (subscription, when, event)
        self.ends: list[StreamEnd] = []
        self.subscriptions = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._call: grpc.Call | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="events-subscriber")

    def start(self) -> EventSubscriber:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            call = self.client.runtime.GetContainerEvents(cri.GetEventsRequest(), metadata=self.metadata)
            with self._cond:
                self._call = call
                self.subscriptions += 1
                subscription, received = self.subscriptions, 0
            code, details = "OK", ""
            try:
                for event in call:
                    received += 1
                    with self._cond:
                        self.events.append((subscription, time.monotonic(), event))
                        self._cond.notify_all()
            except grpc.RpcError as err:
                code, details = err.code().name, err.details() or ""
            with self._cond:
                self.ends.append(StreamEnd(time.monotonic(), code, details, received, subscription))
                self._cond.notify_all()
            self._stop.wait(RESUBSCRIBE_S)

    def wait(self, until, timeout_s: float) -> bool:  # noqa: ANN001 (a predicate on this subscriber)
        with self._cond:
            return self._cond.wait_for(lambda: until(self), timeout_s)

    def events_on(self, subscription: int) -> int:
        return sum(1 for n, _, _ in self.events if n == subscription)

    def provoke(self, make_event: Callable[[], object], subscription: int, timeout_s: float,
                every_s: float = 1.0) -> float | None:
        """Call ``make_event`` (a pod made on containerd) until an event reaches subscription ``subscription`` or a
        later one; returns when it arrived (time.monotonic()), None after ``timeout_s``. containerd tells only the
        subscriptions open when the event happens, and the client cannot see when its call reached containerd
        (no answer comes before the first event), so one event may go before the subscription is there."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            make_event()
            if self.wait(lambda s: any(n >= subscription for n, _, _ in s.events), every_s):
                with self._cond:
                    return next(at for n, at, _ in self.events if n >= subscription)
        return None

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(10)
