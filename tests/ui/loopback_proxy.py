"""A small real HTTP proxy on loopback for the tests: forwards plain-HTTP requests (absolute-form
``POST http://host:port/path``) and tunnels ``CONNECT host:port``, and records every request line,
so a test can assert that a client's request went through it."""

from __future__ import annotations

import socket
import socketserver
import threading
import urllib.parse


class _ProxyHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.connection.recv(65536)
            if not chunk:
                return
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        request_line, *headers = head.decode("latin-1").split("\r\n")
        self.server.requests.append(request_line)
        method, target, version = request_line.split(" ", 2)
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)), timeout=30)
            self.connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = urllib.parse.urlsplit(target)
            upstream = socket.create_connection((url.hostname, url.port or 80), timeout=30)
            path = url.path + (f"?{url.query}" if url.query else "")
            kept = [h for h in headers if not h.lower().startswith(("proxy-", "connection:"))]
            # One request per connection: the next request line would otherwise pass unrewritten.
            upstream.sendall("\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
                             .encode("latin-1") + rest)
        self._pipe(upstream)

    def _pipe(self, upstream: socket.socket) -> None:
        def copy(source: socket.socket, sink: socket.socket) -> None:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for s in (source, sink):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        back = threading.Thread(target=copy, args=(upstream, self.connection), daemon=True)
        back.start()
        copy(self.connection, upstream)
        back.join(30)
        upstream.close()


class LoopbackProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
