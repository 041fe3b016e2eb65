"""`Http1Only`: uvicorn's HTTP/1.1 protocol for our engine servers, which closes a connection that
opens with HTTP/2's preface without logging it as an invalid request.

sglang-router 0.3.x registers a worker by probing it over HTTP and gRPC at once (its
connection-mode detection), whatever the URL's scheme says. The gRPC probe opens with HTTP/2's
connection preface (`PRI * HTTP/2.0`), which an HTTP/1.1 server cannot parse: uvicorn logged
"Invalid HTTP request received." for each probe, two per engine per registration, at the start
of every run and benchmark. Nothing was wrong (the HTTP probe answers, the router takes the worker as
HTTP), so such a connection is now closed without a word. Any other request uvicorn
cannot parse is still reported.
"""

from __future__ import annotations

from slime.utils.one_send_responses import OneSendResponses

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n"


class Http1Only(OneSendResponses):  # (a response's head and body in one send)
    def data_received(self, data: bytes) -> None:
        if data.startswith(HTTP2_PREFACE):  # a gRPC/HTTP/2 client, never an HTTP/1.1 request line
            self.transport.close()
            return
        super().data_received(data)
