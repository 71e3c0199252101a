"""A streamed reply's HTTP chunks sent from a worker thread (``sandbox_core.agent.chunked``): on a
real socket pair whose buffers hold far less than one chunk, so every ``sendmsg`` is partial,
the peer reads exactly the chunked encoding of what was sent; a peer that stops reading makes a
send fail at its timeout; the sender's descriptor outlives the owner closing its own."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

from sandbox_core.agent.chunked import ChunkedSender


def small_pair() -> tuple[socket.socket, socket.socket]:
    ours, peer = socket.socketpair()
    for sock in (ours, peer):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ours.setblocking(False)  # as an event loop's transport holds it
    return ours, peer


def read_all(peer: socket.socket, into: bytearray) -> None:
    while data := peer.recv(3000):
        into += data
        time.sleep(0.0005)  # a slow reader: the sender waits for room again and again


def test_pieces_arrive_as_exact_chunks_through_partial_sends() -> None:
    ours, peer = small_pair()
    got = bytearray()
    reader = threading.Thread(target=read_all, args=(peer, got))
    reader.start()
    rng = random.Random(3)
    bodies = [rng.randbytes(n) for n in (1, 5, 70_000, 0, 300_000)]
    sender = ChunkedSender(ours.fileno(), timeout_seconds=10)
    ours.close()  # the owner (the event loop) closes its descriptor: the sender keeps its own
    want = b""
    for body in bodies:
        head = b"o" + len(body).to_bytes(4, "big")
        sender.send(head, memoryview(bytearray(body)))
        want += b"%x\r\n" % (5 + len(body)) + head + body + b"\r\n"
    sender.send(b"", b"")  # nothing: no empty chunk (that one would end the body)
    sender.close()
    reader.join(10)
    peer.close()
    assert bytes(got) == want
    assert sender.sent == sum(5 + len(body) for body in bodies)


def test_a_peer_that_stops_reading_fails_the_send_at_its_timeout() -> None:
    ours, peer = small_pair()
    sender = ChunkedSender(ours.fileno(), timeout_seconds=0.3)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        sender.send(b"x" * (4 << 20))
    assert 0.25 < time.monotonic() - start < 5
    sender.close()
    with pytest.raises(OSError):  # closed: the duplicate is gone, the owner's stays
        sender.send(b"y")
    peer.setblocking(False)
    assert peer.recv(1 << 20)  # what the failed send had put in: the connection is still open
    ours.setblocking(False)
    ours.send(b"z")  # and the owner's descriptor still writes it
    for sock in (ours, peer):
        sock.close()


def test_a_descriptor_that_is_not_a_stream_socket_is_refused() -> None:
    read_end, write_end = os.pipe()
    datagram = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for fd in (read_end, datagram.fileno()):
            with pytest.raises(OSError):
                ChunkedSender(fd, timeout_seconds=1)
    finally:
        os.close(read_end)
        os.close(write_end)
        datagram.close()
