"""Endpoint rules: https anywhere, http only on loopback, and the --mcp name=URL form."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.config.endpoints import (
    check_endpoint,
    check_intelligence_endpoint,
    is_loopback_host,
    parse_mcp_flag,
    split_endpoints,
)
from agentd.errors import ConfigError


@pytest.mark.parametrize(
    "url",
    ["https://mcp.example/mcp", "https://mcp.example:8443", "http://127.0.0.1:9000/mcp", "http://127.9.9.9/",
     "http://localhost:1/x", "http://[::1]:8080/mcp", "HTTP://LOCALHOST/", "http://api.localhost/mcp",
     "https://10.0.0.1/mcp", "https://host/path?x=1"],
)
def test_accepted(url: str) -> None:
    assert check_endpoint(url, what="--mcp a") == url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://example.com/mcp", "non-loopback host 'example.com'"),
        ("http://10.0.0.1/mcp", "non-loopback"),
        ("http://[::2]/mcp", "non-loopback"),
        ("http://localhost.example.com/", "non-loopback"),
        ("http://0.0.0.0:80/", "non-loopback"),
        ("ftp://example.com/", "must use https://"),
        ("ws://127.0.0.1/", "must use https://"),
        ("file:///etc/passwd", "must use https://"),
        ("example.com/mcp", "must use https://"),
        ("https://", "has no host"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://exa mple.com/", "whitespace"),
        ("", "empty"),
        ("https://example.com:99999/", "invalid endpoint"),
        ("https://example.com/#x", "fragment"),
    ],
)
def test_refused(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_endpoint(url, what="--mcp a")
    assert fragment in str(info.value)
    assert str(info.value).startswith("--mcp a")
    assert "pw" not in str(info.value)


def test_loopback_hosts() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("127.1.2.3") and is_loopback_host("[::1]")
    assert is_loopback_host("localhost.") and is_loopback_host("LocalHost")
    assert not is_loopback_host("128.0.0.1") and not is_loopback_host("::") and not is_loopback_host("my-host")


@pytest.mark.parametrize(
    ("value", "message"),
    [("fs", "missing '='"), ("=https://x", "empty server name"), ("a b=https://x", "bad server name"),
     ("a__b=https://x", "bad server name"), ("fs=http://example.com", "non-loopback"), ("fs=", "empty")],
)
def test_mcp_flag_refused(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mcp_flag(value)
    assert message in str(info.value)


def test_mcp_flag_ok() -> None:
    assert parse_mcp_flag("fs=https://mcp-fs.internal/mcp") == ("fs", "https://mcp-fs.internal/mcp")
    assert parse_mcp_flag("a.b-c_1=http://127.0.0.1:1/x=y") == ("a.b-c_1", "http://127.0.0.1:1/x=y")


def test_intelligence_endpoints() -> None:
    assert check_intelligence_endpoint("test") == "test"
    assert split_endpoints("https://a/v1, http://127.0.0.1:1/v1") == ("https://a/v1", "http://127.0.0.1:1/v1")
    with pytest.raises(ConfigError, match="empty endpoint"):
        split_endpoints("https://a/v1,,https://b/v1")
    with pytest.raises(ConfigError, match="--intelligence"):
        check_intelligence_endpoint("http://gateway.example/v1")


# --- properties -----------------------------------------------------------------------------------------

ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
ports = st.integers(1, 65535)
paths = st.sampled_from(["", "/", "/mcp", "/a/b?x=1"])


@given(ipv4, ports, paths)
def test_http_is_allowed_exactly_for_127_slash_8(host: str, port: int, path: str) -> None:
    url = f"http://{host}:{port}{path}"
    if host.startswith("127."):
        assert check_endpoint(url, what="--mcp a") == url
    else:
        with pytest.raises(ConfigError, match="non-loopback"):
            check_endpoint(url, what="--mcp a")


@given(ipv4, ports, paths)
def test_https_is_allowed_anywhere(host: str, port: int, path: str) -> None:
    url = f"https://{host}:{port}{path}"
    assert check_endpoint(url, what="--mcp a") == url


@given(st.text(max_size=40))
def test_mcp_flag_never_crashes(value: str) -> None:
    try:
        name, url = parse_mcp_flag(value)
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        raw_name, _, raw_url = value.partition("=")
        assert (name, url) == (raw_name.strip(), raw_url)
