"""`probe_ray_address`: whether a Ray cluster answers at `--ray-address`, within a bound.

Why: `ray.init(address=...)` of an address nobody answers at retries forever (its C++ client prints a
warning every ~40 s and nothing else), and the command holds SIGTERM while Ray starts. A TCP connect
to the cluster's port, bounded, tells "nothing listens there" in milliseconds (refused) or at most
`CONNECT_TIMEOUT_S` (dropped), before `ray.init` is asked.
"""

from __future__ import annotations

import socket

CONNECT_TIMEOUT_S = 10.0  # a routed host answers a SYN in milliseconds; a dropped one never does
GCS_DEFAULT_PORT = 6379  # `ray start --head`'s
CLIENT_DEFAULT_PORT = 10001  # Ray Client's (ray://)


class RayAddressError(ConnectionError):
    """Nothing answers at the address; the message says what was tried."""


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of `host[:port]`, `[v6][:port]` or `ray://host[:port]`."""
    rest, default = address.strip(), GCS_DEFAULT_PORT
    if rest.startswith("ray://"):
        rest, default = rest[len("ray://") :], CLIENT_DEFAULT_PORT
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host:
        raise RayAddressError("expected HOST:PORT (or ray://HOST:PORT)")
    if not port_text:
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RayAddressError(f"port {port_text!r} is not a TCP port (1..65535)")
    return host, int(port_text)


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, Ray Client) answers
# with a SETTINGS frame of its own at once; anything else (a port held by another program) does not
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS = 4  # frame type


def _answers_grpc(sock: socket.socket) -> bool:
    sock.sendall(HTTP2_PREFACE)
    head = b""
    while len(head) < 9:
        chunk = sock.recv(9 - len(head))
        if not chunk:
            return False
        head += chunk
    return head[3] == HTTP2_SETTINGS


def probe_ray_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Connect to the cluster's port once and check that a gRPC server answers there (as the GCS does);
    RayAddressError when it does not, or takes over `timeout` s: `ray.init` would wait forever."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if _answers_grpc(sock):
                return
            raise RayAddressError(
                f"{host}:{port} accepts connections but does not answer as Ray's GCS (no gRPC "
                "answer); is that the Ray head's port (`ray start --head` prints it)?"
            )
    except socket.timeout:
        raise RayAddressError(
            f"no answer from {host}:{port} within {timeout:g} s (a firewall, or no such "
            "host); is the Ray head running there (`ray start --head`)?"
        ) from None
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise RayAddressError(
            f"cannot connect to {host}:{port} ({reason}); start the cluster there with "
            "`ray start --head`, or drop --ray-address to start a private Ray"
        ) from None
