"""The chaos test servers (routerops.workers.chaos) on real sockets."""

from __future__ import annotations

import socket

from routerops.workers.chaos import DelayedEndpoint


def test_the_test_servers_listen_on_a_tcp_socket_so_asyncio_disables_nagle():
    # asyncio sets TCP_NODELAY on an accepted connection only when the socket's proto is TCP; with the
    # default proto 0 every keep-alive answer waited ~40 ms for the client's delayed ACK
    endpoint = DelayedEndpoint(delay_s=0.0)
    with endpoint:
        (server,) = endpoint._server._server.servers
        assert [s.proto for s in server.sockets] == [socket.IPPROTO_TCP]
