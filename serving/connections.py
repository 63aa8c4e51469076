"""What uvicorn leaves open to a slow or hostile client (slowloris): no deadline for a
request's headers, no cap on their size, and no cap on open connections that would not also
refuse health checks. `guarded_protocol` is uvicorn's httptools protocol with all three:

- a request's line and headers must arrive within `header_timeout_s` of the connection's
  start or the previous answer's end, else the connection is closed with a 408 (an idle
  kept-alive connection is closed silently);
- they may take at most `max_header_bytes`, else a 431 and the connection is closed;
- past `max_connections` open connections, the one that has waited longest for a request's
  headers is closed to make room; only when every connection has a request in flight is
  the newcomer refused (503). So a thousand half-sent requests cost their sockets, never
  the next client's answer.

It also writes each answer of known length in one piece (`OneWrite`): status line, headers
and body in one system call, where uvicorn makes two.
"""

import json
import resource
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    import asyncio

REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large",
           503: b"Service Unavailable"}  # fmt: skip


# A client reading an answer must take at least this many bytes a second, checked every
# `send_timeout_s` while the buffers are full; a drain of asyncio's buffers (from its high
# mark, 64 KiB, to its low one, 16 KiB) counts as this many.
MIN_SEND_RATE = 4 << 10
DRAIN_BYTES = 48 << 10


def guarded_protocol(
    max_connections: int, max_header_bytes: int, header_timeout_s: float,
    send_timeout_s: float = 30.0,
) -> type[HttpToolsProtocol]:  # fmt: skip
    """A uvicorn `http=` protocol class with these limits. A client that reads less than
    `MIN_SEND_RATE` bytes a second of an answer (none at all, or a trickle), measured over
    `send_timeout_s` while the socket's buffers are full, is cut off: the bytes held for it
    are dropped."""

    class GuardedHttp(HttpToolsProtocol):
        # in_request: from a request's complete headers to its answer's end.
        # receiving: its headers came, its body has not all come (evictable, like a
        #   connection waiting for headers: a body sent a byte at a time is a slowloris too).
        # counting: header bytes are counted (from the end of the previous message).
        # heard: a new request began (its first byte was parsed) since the last answer.
        def connection_made(self, transport: "asyncio.Transport") -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.header_timer: asyncio.TimerHandle | None = None
            self.send_timer: asyncio.TimerHandle | None = None
            self.drains = 0
            self.in_request, self.receiving = False, False
            self.served, self.heard = False, False
            self._count_headers()
            self._wait()
            if len(self.connections) > max_connections:
                self._make_room()

        def _count_headers(self) -> None:
            self.counting, self.header_bytes, self.tail = True, 0, b""

        def _wait(self) -> None:
            """No request in flight: the next one's headers are due within the deadline."""
            self.waiting_since, self.heard = time.monotonic(), False
            self._cancel()
            self.header_timer = self.loop.call_later(header_timeout_s, self._late)

        def _cancel(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _late(self) -> None:
            self.header_timer = None
            if self.in_request:
                return
            if self.served and not self.heard:  # an idle kept-alive connection
                self.transport.close()
            else:
                self.refuse(408, f"the request headers took longer than {header_timeout_s:g} s")

        def _make_room(self) -> None:
            waiting = [
                c for c in self.connections
                if c is not self and not c.transport.is_closing()
                and (not getattr(c, "in_request", True) or getattr(c, "receiving", False))
            ]  # fmt: skip
            if waiting:
                oldest = min(waiting, key=lambda c: getattr(c, "waiting_since", 0.0))
                oldest.transport.close()
            else:
                self.refuse(503, f"{max_connections} connections are open, all busy")

        def on_message_begin(self) -> None:
            self.heard = True
            super().on_message_begin()

        def data_received(self, data: bytes) -> None:
            if self.counting and not self.transport.is_closing():
                window = self.tail + data
                end = _header_end(window)
                used = self.header_bytes - len(self.tail) + (len(window) if end < 0 else end)
                if used > max_header_bytes:
                    return self.refuse(
                        431, f"request line and headers exceed {max_header_bytes} bytes"
                    )
                self.header_bytes += len(data)
                self.tail = window[-3:]
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self.counting, self.in_request, self.receiving = False, True, True
            self.waiting_since = time.monotonic()
            self._cancel()
            super().on_headers_complete()
            cycle = self.cycle  # the new request's (an upgrade request makes none)
            if cycle is not None and cycle.transport is self.transport:
                cycle.transport = OneWrite(self.transport, cycle)  # type: ignore[assignment]

        def on_message_complete(self) -> None:
            self.receiving = False
            super().on_message_complete()
            self._count_headers()  # what follows this message is the next one's headers

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request's answer
            self.served = True
            self.in_request = self.cycle is not None and not self.cycle.response_complete
            if not self.in_request and not self.transport.is_closing():
                self._wait()

        def pause_writing(self) -> None:
            """The socket's buffers are full: the client must read, and keep reading."""
            super().pause_writing()
            if self.send_timer is None:
                self.drains = 0
                self.send_timer = self.loop.call_later(send_timeout_s, self._send_check)

        def resume_writing(self) -> None:
            self.drains += 1  # the client read the buffer down to its low mark
            super().resume_writing()

        def _cancel_send(self) -> None:
            if self.send_timer is not None:
                self.send_timer.cancel()
                self.send_timer = None

        def _send_check(self) -> None:
            """Every `send_timeout_s` while an answer waits on the client: it must have read
            at least `MIN_SEND_RATE` bytes a second meanwhile (each drain of the buffers is
            about `DRAIN_BYTES`), or it is cut off. A client trickling a byte at a time
            would otherwise hold its answer, and a request slot, for as long as it liked."""
            self.send_timer = None
            if self.transport.is_closing() or not self.flow.write_paused:
                return  # caught up: the next full buffer starts the clock again
            if self.drains * DRAIN_BYTES >= MIN_SEND_RATE * send_timeout_s:
                self.drains = 0
                self.send_timer = self.loop.call_later(send_timeout_s, self._send_check)
                return
            # A reset, not a close: the kernel drops what its send buffer holds for the
            # client too (a close would go on sending it). uvicorn's connection_lost then
            # wakes the answer's pending send, which ends.
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            self._cancel_send()
            super().connection_lost(exc)

        def refuse(self, status: int, message: str) -> None:
            """Answers `status` with `{"error": message}` and closes the connection."""
            if self.transport.is_closing():
                return
            if self.in_request:  # an answer may be half written: no second one inside it
                self.transport.close()
                return
            body = json.dumps({"error": message}).encode()
            head = (
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % (status, REASONS[status], len(body))
            )
            self.transport.write(head + body)
            self.transport.close()

    return GuardedHttp


class OneWrite:
    """A response's transport that sends its status line and headers together with its body
    when the body's length is known (`content-length`): one write, one TCP segment on a small
    answer, where uvicorn makes two. Under load the event loop runs on cores that onnxruntime
    keeps cold, and each write's system call and loopback segment cost there what a dozen
    cost on a quiet core; the client reads one segment instead of two. A streamed answer
    (chunked), an answer to HEAD and a bodiless one write their headers at once, as before."""

    __slots__ = ("cycle", "fresh", "held", "transport")
    JOIN_BYTES = 1 << 16  # a larger body is written after its headers (no copy of it)

    def __init__(self, transport: "asyncio.Transport", cycle: Any) -> None:
        self.transport, self.cycle = transport, cycle
        self.fresh, self.held = True, b""  # fresh: the response's headers are not written yet

    def write(self, data: bytes) -> None:
        cycle = self.cycle
        if self.fresh and cycle.response_started:  # (a `100 Continue` comes before)
            self.fresh = False
            if (
                cycle.chunked_encoding is False and cycle.expected_content_length > 0
                and cycle.scope["method"] != "HEAD" and data.startswith(b"HTTP/")
            ):  # fmt: skip
                self.held = data  # the headers: the body comes in the cycle's next write
                return
        if self.held:
            held, self.held = self.held, b""
            if len(data) <= self.JOIN_BYTES:
                data = held + data
            else:
                self.transport.write(held)
        self.transport.write(data)

    def close(self) -> None:
        """Closes the connection; headers still held (the app failed before its body) are
        sent first, as uvicorn would have sent them."""
        if self.held:
            self.transport.write(self.held)
            self.held = b""
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _header_end(data: bytes) -> int:
    """The index just past the blank line ending the headers in `data`, or -1."""
    ends = [i + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (i := data.find(mark)) >= 0]
    return min(ends, default=-1)


def raise_open_files_limit(wanted: int) -> int:
    """Raises this process's open-file limit towards `wanted` (within the hard limit): a
    socket per connection, and the default soft limit is often 1,024. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def uvicorn_options(settings: Any) -> dict[str, Any]:
    """The `uvicorn.run` arguments that enforce the connection limits of `settings`."""
    raise_open_files_limit(settings.max_connections + 256)
    return {
        "http": guarded_protocol(
            settings.max_connections,
            settings.max_header_bytes,
            settings.header_timeout_s,
            settings.send_timeout_s,
        )
    }
