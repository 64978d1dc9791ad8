"""uvicorn's HTTP protocol, stamping each request with the earliest arrival time a process can know.

Under overload the queue that grows is not in the app: requests wait in the kernel (the listen
backlog, the socket's receive buffer) until a starved process reads them, and no timer in the app
sees that wait. The kernel does: TCP_INFO's `tcpi_last_data_recv` (tcp(7); linux/tcp.h) is how many
milliseconds ago the socket last received data, i.e. when the request's last bytes arrived. httptools
calls `on_message_begin` as the loop reads a request's first bytes; the stamp put in the request's
scope state (ARRIVED) is that moment minus the kernel's wait. Where TCP_INFO is not there (not Linux,
a Unix socket), the stamp is the read itself. Admission (gateway/admission.py) measures every
request's wait from it.

The door's first checks are made here too, as soon as a request's headers are parsed, when the app
served carries a `routerops_door` (gateway/admission.py's EarlyDoor; gateway/app.py sets it): a
refusal is written at once as bytes, and uvicorn never makes the request's task, scope or body.
Under overload most requests are refused, so what a refusal costs decides how much of the process is
left for the requests it serves. Requests behind another one on the same connection (HTTP
pipelining), `Expect: 100-continue` and upgrades take uvicorn's usual path (the middleware refuses).
"""

from __future__ import annotations

import socket
import struct
import time
from types import SimpleNamespace

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ARRIVED = "arrived_at"  # scope["state"] key: time.monotonic() when the request's bytes reached the kernel
DOOR_CHECKED = "door_checked"  # scope["state"] key: the door's first checks were passed here
DOOR_ATTR = "routerops_door"  # the attribute of the served app (or an app it wraps) holding the door
TCP_INFO_LEN = 104  # struct tcp_info up to tcpi_rcv_space: every field read here, on every Linux since 2.6
LAST_DATA_RECV_OFFSET = 52  # 8 one-byte fields, then u32s: rto ato snd_mss rcv_mss unacked sacked lost
# retrans fackets last_data_sent last_ack_sent last_data_recv (the 12th)


def kernel_wait_s(sock) -> float:
    """Seconds since `sock` last received data (0.0 where the kernel does not say)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    except (AttributeError, OSError):
        return 0.0
    return struct.unpack_from("I", info, LAST_DATA_RECV_OFFSET)[0] / 1000 if len(info) >= 56 else 0.0


def find_door(app, depth: int = 8):
    """The `routerops_door` of `app` or of the apps it wraps (uvicorn's own middlewares keep theirs as `.app`)."""
    for _ in range(depth):
        if app is None:
            return None
        door = getattr(app, DOOR_ATTR, None)
        if door is not None:
            return door
        app = getattr(app, "app", None)
    return None


class StampedHttpToolsProtocol(HttpToolsProtocol):
    """`gateway serve`'s HTTP protocol (uvicorn `--http`): httptools, plus the arrival stamp and the door."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.door = find_door(self.app)

    def on_message_begin(self) -> None:
        # A request has begun: the connection is not idle. (uvicorn cancels its keep-alive timer as data
        # arrives; a refusal below arms it again, maybe in the middle of the data that brought the next
        # request, which must not be cut off by it.)
        self._unset_keepalive_if_required()
        super().on_message_begin()
        now = time.monotonic()
        sock = self.transport.get_extra_info("socket")
        self.scope["state"][ARRIVED] = now - (kernel_wait_s(sock) if sock is not None else 0.0)

    def on_headers_complete(self) -> None:
        if self.door is not None and self._door_may_answer():
            verdict = self.door.check(httptools.parse_url(self.url).path.decode("ascii", "replace"),
                                      self.scope["state"][ARRIVED])
            if isinstance(verdict, bytes):
                return self._refuse(verdict)
            if verdict:
                self.scope["state"][DOOR_CHECKED] = True
        super().on_headers_complete()

    def _door_may_answer(self) -> bool:
        """Whether an answer written now comes in order and is the whole exchange: no earlier request
        still answering on this connection, no `Expect: 100-continue`, no upgrade."""
        return (not self.expect_100_continue and (self.cycle is None or self.cycle.response_complete)
                and not self.parser.should_upgrade())

    def _refuse(self, response: bytes) -> None:
        """Answer the request with `response` (whole), read its body into nothing, keep the connection."""
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        if not keep_alive:
            response = response.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
        self.transport.write(response)
        # uvicorn's callbacks see an answered request: on_body and on_message_complete drop what follows
        self.cycle = SimpleNamespace(response_complete=True, keep_alive=keep_alive, disconnected=False,
                                     message_event=SimpleNamespace(set=lambda: None))
        if keep_alive:
            self.on_response_complete()  # as after any answer: counted, reading resumed, keep-alive timer
        else:
            self.transport.close()
