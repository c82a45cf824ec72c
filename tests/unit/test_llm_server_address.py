"""``--llm-server``: the address forms 'assistant serve' prints, and the ones it cannot be."""

from __future__ import annotations

import pytest

from assistant.config import ConfigError, load_settings
from engines.serving.address import BadServerAddress, parse_server_address


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("127.0.0.1:8001", "127.0.0.1:8001"),
        ("grpc://127.0.0.1:8001", "127.0.0.1:8001"),  # as serve's banner prints it
        ("GRPC://gpu-box:9000/", "gpu-box:9000"),
        ("gpu-box", "gpu-box:8001"),  # serve's default port, not gRPC's 443
        ("grpc://[::1]:8002", "[::1]:8002"),
        ("  gpu-box:8001 ", "gpu-box:8001"),
    ],
)
def test_the_forms_serve_prints_are_accepted(given, address):
    assert parse_server_address(given) == address


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (
            "http://127.0.0.1:8001",
            "'assistant serve' speaks gRPC, not HTTP; write HOST:PORT or grpc://HOST:PORT",
        ),
        ("https://gpu-box", "speaks gRPC, not HTTPS"),
        ("ftp://gpu-box:8001", "unknown scheme 'ftp://'"),
        ("gpu-box:99999", "port 99999 is out of range (1 to 65535)"),  # gRPC made it 34463
        ("gpu-box:0", "port 0 is out of range (1 to 65535)"),
        ("gpu-box:http", "port 'http' is not a number from 1 to 65535"),
        ("gpu-box:8001/v2/models", "is not a server address"),
        (":8001", "is not a server address"),
    ],
)
def test_other_forms_are_refused_with_the_forms_to_use(given, says):
    with pytest.raises(BadServerAddress) as e:
        parse_server_address(given)
    assert str(e.value).startswith(repr(given)) and says in str(e.value)


def test_the_setting_is_checked_with_the_settings_naming_the_flag():
    settings = load_settings(None, overrides={"decoder.server": "grpc://gpu-box:8001"})
    assert settings.decoder.server == "gpu-box:8001"
    with pytest.raises(ConfigError) as e:
        load_settings(None, overrides={"decoder.server": "gpu-box:99999"})
    assert "[decoder]: server (--llm-server) 'gpu-box:99999': port 99999 is out of range" in str(e.value)
