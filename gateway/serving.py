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
from dataclasses import dataclass
from types import SimpleNamespace

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ARRIVED = "arrived_at"  # scope["state"] key: time.monotonic() when the request's bytes reached the kernel
DOOR_CHECKED = "door_checked"  # scope["state"] key: the door's first checks were passed here
KEY = "routerops_key"  # scope["state"] key: the authenticated key (gateway/intake.py; the app reads it)
KEY_ID = "routerops_key_id"  # scope["state"] key: its id (admission's per-key share)
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


LIMITS_ATTR = "routerops_limits"  # the attribute of the served app holding its ServerLimits


@dataclass(frozen=True)
class ServerLimits:
    """What the protocol bounds before the app sees a request (issue 42, item 4). uvicorn's httptools
    protocol has no limit on a request's head: httptools gathers a header's value in memory until it
    ends, so one connection streaming 64 MB of headers was read to the end (and answered 401), and four
    grew the process by 261 MB, 195 MB of it kept after they closed. Here the head is cut at
    `max_header_bytes` and `max_headers` fields (431, the connection closed), and at `header_timeout_s`
    from its first byte, or from the connection's start (408: a slowloris sending its headers a byte at
    a time); at most `max_connections` are kept open (a new one beyond is answered 503 and closed)."""

    max_header_bytes: int = 32 * 2**10
    max_headers: int = 100
    header_timeout_s: float = 10.0
    max_connections: int = 1000


def server_limits(cfg) -> ServerLimits:
    """The protocol's limits from a GatewayConfig (gateway/proxy.py)."""
    return ServerLimits(cfg.max_header_bytes, cfg.max_headers, cfg.header_timeout_s, cfg.max_connections)


def find_door(app, depth: int = 8, attr: str = DOOR_ATTR):
    """The `routerops_door` (or `attr`) of `app` or of the apps it wraps (uvicorn's middlewares keep theirs as `.app`)."""
    for _ in range(depth):
        if app is None:
            return None
        door = getattr(app, attr, None)
        if door is not None:
            return door
        app = getattr(app, "app", None)
    return None


class HeadRefused(Exception):
    """Raised from a parser callback to stop reading a request's head (the refusal is already chosen)."""


def refusal_bytes(status: int, message: str, code: str, retry_after_s: float | None = None) -> bytes:
    """A whole OpenAI-format error response that closes the connection."""
    from gateway.errors import RequestError, http_error  # the one writer of protocol-level errors

    kind = "server_error" if status >= 500 else "invalid_request_error"
    raw = http_error(RequestError(status, message, kind, code, retry_after_s=retry_after_s))
    return raw.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)


class StampedHttpToolsProtocol(HttpToolsProtocol):
    """`gateway serve`'s HTTP protocol (uvicorn `--http`): httptools, plus the arrival stamp and the door."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.door = find_door(self.app)
        self.limits = find_door(self.app, attr=LIMITS_ATTR) or ServerLimits()
        self._head = {"bytes": 0, "fields": 0, "tail": b"", "reading": True}  # the request head being read
        self._refusal: bytes | None = None
        self._head_timer = None
        if len(self.connections) > self.limits.max_connections:
            self._refuse_head(refusal_bytes(503, f"the gateway holds its limit of {self.limits.max_connections} "
                                                 "connections", "overloaded", retry_after_s=1.0))
            return
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head["reading"] and (self.cycle is None or self.cycle.response_complete):
            if self._head["bytes"] == 0 and self.cycle is not None:
                return  # idle between requests: uvicorn's keep-alive timeout closes it
            self._refuse_head(refusal_bytes(408, f"the request's headers did not arrive within "
                                                 f"{self.limits.header_timeout_s:g} s", "request_timeout"))

    def _refuse_head(self, response: bytes) -> None:
        self._disarm_head_timer()
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # answered and closing (a refused head): what follows is not read
        head = self._head
        if head["reading"]:
            # Count the head's bytes before the parser gathers them (its end may lie in this read).
            window = head["tail"] + data
            end = window.find(b"\r\n\r\n")
            head["bytes"] += len(data) if end < 0 else max(end + 4 - len(head["tail"]), 0)
            head["tail"] = window[-3:]
            if head["bytes"] > self.limits.max_header_bytes:
                return self._refuse_head(refusal_bytes(431, f"the request's head is over this gateway's limit of "
                                                            f"{self.limits.max_header_bytes} bytes", "headers_too_large"))
            self._arm_head_timer()
        super().data_received(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head["fields"] += 1
        if self._head["fields"] > self.limits.max_headers:
            self._refusal = refusal_bytes(431, f"the request has more than this gateway's limit of "
                                               f"{self.limits.max_headers} header fields", "headers_too_large")
            raise HeadRefused  # the parser stops; uvicorn answers its error with send_400_response, below
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:
            return self._refuse_head(self._refusal)
        super().send_400_response(msg)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head.update(bytes=0, fields=0, tail=b"", reading=True)  # the next request's head

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
        self._head["reading"] = False
        self._disarm_head_timer()
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
