"""sd_notify as wire/systemd.py speaks it, against real unix datagram sockets: paths and abstract names, the
variable read once, and a service manager that stops reading never stalls the sender for long."""

from __future__ import annotations

import os
import socket
import time

from wire.systemd import Notifier


def test_notifies_a_path_and_an_abstract_socket_and_takes_the_variable_out_of_the_environment(tmp_path) -> None:
    path = str(tmp_path / "notify")
    abstract = f"\0kpy-test-notify-{os.getpid()}"
    for address, variable in ((path, path), (abstract, "@" + abstract[1:])):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
            receiver.bind(address)
            env = {"NOTIFY_SOCKET": variable, "OTHER": "kept"}
            notifier = Notifier(env)
            assert env == {"OTHER": "kept"}, "a child process must not notify on the service's behalf"
            assert notifier.send("READY=1", "STATUS=serving")
            receiver.settimeout(5)
            assert receiver.recv(4096) == b"READY=1\nSTATUS=serving"


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled and not notifier.send("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled  # not a unix socket: refused, not guessed


def test_a_receiver_that_never_reads_costs_each_message_half_a_second_at_most(tmp_path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        notifier = Notifier({"NOTIFY_SOCKET": path})
        with open("/proc/sys/net/unix/max_dgram_qlen") as limit:
            queue = int(limit.read())
        sent = []
        for _ in range(queue + 5):  # the receiver's queue fills (and one more may pass it)
            started = time.monotonic()
            sent.append(notifier.send("STATUS=filler"))
            assert time.monotonic() - started < 2.0
        assert sent[0] and not sent[-1]
