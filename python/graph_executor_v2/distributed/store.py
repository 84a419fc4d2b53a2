"""A small TCP key-value store: how the ranks of a job find each other, exchange the NCCL unique id, meet at
barriers and (on the CPU backend) exchange arrays.

Rank 0 hosts it (``TCPStore(host, port, is_master=True)``) in a background thread; every rank, rank 0 included,
talks to it through a client connection. Messages are frames of a JSON header and raw bytes. Every blocking call
has a timeout, so a rank that never comes (or a master that died) is an error, never a hang.
"""
from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time


class StoreError(RuntimeError):
    """The store could not be reached, or a wait ran out of time."""


def _send(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    encoded = json.dumps(header).encode()
    sock.sendall(struct.pack("!IQ", len(encoded), len(payload)) + encoded + payload)


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, remaining = [], count
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("the store connection closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket) -> tuple[dict, bytes]:
    header_length, payload_length = struct.unpack("!IQ", _receive_exactly(sock, 12))
    header = json.loads(_receive_exactly(sock, header_length))
    return header, _receive_exactly(sock, payload_length)


class _State:
    def __init__(self):
        self.values: dict[str, bytes] = {}
        self.changed = threading.Condition()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        state: _State = self.server.state
        while True:
            try:
                header, payload = _receive(self.request)
            except (ConnectionError, OSError):
                return
            op, key = header["op"], header.get("key", "")
            reply, data = {"ok": True}, b""
            with state.changed:
                if op == "set":
                    state.values[key] = payload
                    state.changed.notify_all()
                elif op == "get":
                    deadline = time.monotonic() + header["timeout"]
                    while key not in state.values:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            reply = {"ok": False, "error": f"timed out after {header['timeout']} s waiting for key "
                                                           f"'{key}'"}
                            break
                        state.changed.wait(left)
                    else:
                        data = state.values[key]
                elif op == "add":
                    value = int(state.values.get(key, b"0")) + int(header["amount"])
                    state.values[key] = str(value).encode()
                    state.changed.notify_all()
                    data = state.values[key]
                elif op == "set_if_absent":
                    reply["claimed"] = key not in state.values
                    state.values.setdefault(key, payload)
                    state.changed.notify_all()
                    data = state.values[key]
                elif op == "check":
                    reply["present"] = key in state.values
                elif op == "delete":
                    state.values.pop(key, None)
                else:
                    reply = {"ok": False, "error": f"unknown store operation {op!r}"}
            try:
                _send(self.request, reply, data)
            except OSError:
                return


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class TCPStore:
    """A client of the job's store; ``is_master=True`` also hosts it (rank 0).

    ``timeout`` bounds connecting and every blocking call (seconds)."""

    def __init__(self, host: str, port: int, is_master: bool, timeout: float = 300.0):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port: expected an int in [0, 65536), got {port!r}")
        if timeout <= 0:
            raise ValueError(f"timeout: expected > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        self._server = None
        if is_master:
            try:
                self._server = _Server((host, port), _Handler)
            except OSError as error:
                raise StoreError(f"MASTER_PORT {port}: cannot host the store on {host}:{port} ({error.strerror}); "
                                 "is another job using the port?") from None
            self._server.state = _State()
            port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, name="ge2-store", daemon=True).start()
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._sock = self._connect()

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=5.0)
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as error:
                if time.monotonic() > deadline:
                    raise StoreError(f"could not reach the store at {self.host}:{self.port} within {self.timeout} s "
                                     f"({error}); is rank 0 running, with the same MASTER_ADDR and MASTER_PORT?") \
                        from None
                time.sleep(0.1)

    def _call(self, header: dict, payload: bytes = b"") -> tuple[dict, bytes]:
        with self._lock:
            try:
                _send(self._sock, header, payload)
                reply, data = _receive(self._sock)
            except (ConnectionError, OSError) as error:
                raise StoreError(f"lost the store at {self.host}:{self.port} ({error}); rank 0 has probably "
                                 "exited") from None
        if not reply["ok"]:
            raise StoreError(reply["error"])
        return reply, data

    def set(self, key: str, value: bytes) -> None:
        self._call({"op": "set", "key": key}, bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting for it to be set (at most ``timeout`` seconds, default the store's)."""
        return self._call({"op": "get", "key": key, "timeout": self.timeout if timeout is None else timeout})[1]

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically adds ``amount`` to the integer at ``key`` (0 when absent); returns the new value."""
        return int(self._call({"op": "add", "key": key, "amount": int(amount)})[1])

    def set_if_absent(self, key: str, value: bytes) -> tuple[bool, bytes]:
        """(whether this call set it, the value now stored)."""
        reply, data = self._call({"op": "set_if_absent", "key": key}, bytes(value))
        return reply["claimed"], data

    def check(self, key: str) -> bool:
        return self._call({"op": "check", "key": key})[0]["present"]

    def delete(self, key: str) -> None:
        self._call({"op": "delete", "key": key})

    def wait_count(self, key: str, count: int, timeout: float | None = None, what: str = "ranks") -> None:
        """Waits until the counter at ``key`` reaches ``count`` (a barrier's second half)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            value = int(self._call({"op": "add", "key": key, "amount": 0})[1])
            if value >= count:
                return
            if time.monotonic() > deadline:
                raise StoreError(f"only {value} of {count} {what} arrived within {timeout} s")
            time.sleep(0.01)

    def close(self) -> None:
        with self._lock:
            self._sock.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
