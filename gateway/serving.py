"""uvicorn's HTTP protocol, stamping each request with the earliest arrival time a process can know.

Under overload the queue that grows is not in the app: requests wait in the kernel (the listen
backlog, the socket's receive buffer) until a starved process reads them, and no timer in the app
sees that wait. The kernel does: TCP_INFO's `tcpi_last_data_recv` (tcp(7); linux/tcp.h) is how many
milliseconds ago the socket last received data, i.e. when the request's last bytes arrived. httptools
calls `on_message_begin` as the loop reads a request's first bytes; the stamp put in the request's
scope state (ARRIVED) is that moment minus the kernel's wait. Where TCP_INFO is not there (not Linux,
a Unix socket), the stamp is the read itself. Admission (gateway/admission.py) measures every
request's wait from it.
"""

from __future__ import annotations

import socket
import struct
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ARRIVED = "arrived_at"  # scope["state"] key: time.monotonic() when the request's bytes reached the kernel
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


class StampedHttpToolsProtocol(HttpToolsProtocol):
    """`gateway serve`'s HTTP protocol (uvicorn `--http`): httptools, plus the arrival stamp."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        now = time.monotonic()
        sock = self.transport.get_extra_info("socket")
        self.scope["state"][ARRIVED] = now - (kernel_wait_s(sock) if sock is not None else 0.0)
