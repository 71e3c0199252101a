"""HTTP/1.1 chunks sent from a worker thread straight to a connection's socket: the body of a
streamed command's reply (``wire.EXEC``), without a hop to the event loop per chunk.

Why (docs/benchmarks.md, "Actor commands through the workspace agent"): written through the
event loop, each megabyte of output was handed from the thread that reads the command's pipe to
the loop, joined with its chunk header into a new buffer (aiohttp on Python < 3.12.9), sent in
part, and the rest copied into the transport's buffer and sent again from a writable callback:
three copies in Python and two thread switches per chunk. Here the reading thread sends each
chunk itself with one ``sendmsg`` of the chunk header, the pieces and the trailing CRLF
(scatter-gather: no copy in Python), blocking until the kernel has taken it.

Rules:

- The sender writes on a duplicate of the connection's descriptor (``os.dup``), so the event
  loop closing its own (the caller went away) never leaves this thread writing to a descriptor
  number that something else has reused; the duplicate is closed by :meth:`close`.
- Only the body's chunks go this way, and only while nothing else writes the connection: the
  caller has sent the headers and let the transport's buffer empty first, and writes the last
  frames and the terminating chunk through its HTTP library after :meth:`close`.
- A send that takes no byte for ``timeout_seconds`` (a caller that stopped reading), or a reset,
  raises ``OSError``: the caller is treated as gone.
"""

from __future__ import annotations

import os
import socket

__all__ = ["ChunkedSender"]


class ChunkedSender:
    """Sends HTTP/1.1 chunks on a duplicate of ``fd`` (module docstring).

    Args:
        fd: the connection's socket descriptor (it is duplicated; the original is not touched).
        timeout_seconds: the longest one send may wait for room in the socket.

    Raises:
        OSError: ``fd`` is not a stream socket (or cannot be duplicated).
    """

    def __init__(self, fd: int, timeout_seconds: float) -> None:
        copy = os.dup(fd)
        try:
            self._sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            raise
        if self._sock.type != socket.SOCK_STREAM:
            self._sock.close()
            raise OSError(f"descriptor {fd} is not a stream socket")
        self._sock.settimeout(timeout_seconds)
        self.sent = 0  # body bytes sent (chunk framing not counted)

    def send(self, *parts: bytes | bytearray | memoryview) -> None:
        """One chunk holding ``parts`` in order (nothing when they are all empty).

        Raises:
            OSError: the connection broke, or a send waited ``timeout_seconds`` (TimeoutError).
        """
        size = sum(len(part) for part in parts)
        if not size:
            return
        pending = [memoryview(b"%x\r\n" % size)]
        pending += [memoryview(part).cast("B") for part in parts if len(part)]
        pending.append(memoryview(b"\r\n"))
        while pending:
            done = self._sock.sendmsg(pending)
            while done and done >= len(pending[0]):
                done -= len(pending.pop(0))
            if done:
                pending[0] = pending[0][done:]
        self.sent += size

    def close(self) -> None:
        """Close the duplicate descriptor (the connection stays open for its owner)."""
        self._sock.close()
