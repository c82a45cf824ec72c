"""The ``--llm-server`` address: the forms ``assistant serve`` prints, checked before anything loads.

``serve``'s banner says ``grpc://127.0.0.1:8001`` and "stations connect with --llm-server
127.0.0.1:8001": both are accepted (and ``[::1]:8001`` for IPv6). The server speaks gRPC only
(Triton's HTTP endpoint is off), so ``http://`` is refused with the form to use rather than
tried. A missing port is ``serve``'s default, 8001 (gRPC's client took 443). A port outside
1-65535 is an error (gRPC took 99999 modulo 65536, as 34463).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

DEFAULT_PORT = 8001  # 'assistant serve's default port ([serve] port)
FORMS = "HOST:PORT or grpc://HOST:PORT, as 'assistant serve' prints it"


class BadServerAddress(ValueError):
    """The ``--llm-server`` text is not an address of 'assistant serve' (says the forms)."""


def parse_server_address(text: str) -> str:
    """``text`` as the ``host:port`` the gRPC client takes (``[v6]:port`` for IPv6).

    Raises:
        BadServerAddress: Another scheme (``http://``), a path, no host, or a port that is not
            a number in 1-65535.
    """
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        scheme, rest = "grpc", raw
    scheme = scheme.lower()
    if scheme in ("http", "https"):
        raise BadServerAddress(f"{raw!r}: 'assistant serve' speaks gRPC, not {scheme.upper()}; write {FORMS}")
    if scheme != "grpc":
        raise BadServerAddress(f"{raw!r}: unknown scheme {scheme + '://'!r}; write {FORMS}")
    rest = rest.rstrip("/")
    parts = urlsplit(f"grpc://{rest}")
    if parts.path or parts.query or parts.fragment or parts.username or not parts.hostname:
        raise BadServerAddress(f"{raw!r} is not a server address; write {FORMS}")
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition(":")[2]
        if port_text.isdigit():
            raise BadServerAddress(f"{raw!r}: port {port_text} is out of range (1 to 65535)") from None
        raise BadServerAddress(f"{raw!r}: port {port_text!r} is not a number from 1 to 65535") from None
    if port is None:
        port = DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise BadServerAddress(f"{raw!r}: port {port} is out of range (1 to 65535)")
    host = parts.hostname
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_listening(address: str, timeout_s: float) -> None:
    """Fail at once when nothing listens at ``address`` (``host:port``), before gRPC's retries.

    gRPC's client retries a refused connection with back-off (8.7 s for each refusal); a plain
    TCP connect answers in a millisecond on a refusal or an unknown host name.

    Raises:
        ConnectionRefusedError: Nothing listens on that port (the host answered).
        OSError: The host name does not resolve, the host cannot be reached, or no answer
            within ``timeout_s`` (a firewall dropping packets); the text says which.
    """
    host, _sep, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except socket.gaierror as e:
        raise OSError(f"the host name {host!r} does not resolve ({e.strerror})") from e
    except TimeoutError as e:
        raise OSError(f"no answer within {timeout_s:.0f} s (a firewall, or a host that is down?)") from e
