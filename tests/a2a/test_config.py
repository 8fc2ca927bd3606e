"""``--a2a-peer`` and ``a2a_peers:``: declared like MCP servers, the same endpoint and secret rules (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.config import TlsConfig
from agentd.config.load import load_config
from agentd.errors import ConfigError

BASE = ["--instruction", "x", "--intelligence", "test"]


def test_flags_and_file_merge(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    (tmp_path / "c.yaml").write_text(
        "a2a_peers:\n"
        "  - name: rev\n    url: https://rev.example\n    required: false\n"
        "    headers: {Authorization: 'Bearer {{secret:REV_TOKEN}}'}\n    call_timeout: 90s\n"
    )
    cfg = load_config([*BASE, "--config", str(tmp_path / "c.yaml"), "--tls-ca", str(ca),
                            "--a2a-peer", "rev=https://rev.example", "--a2a-peer", "local=http://127.0.0.1:9000"],
                           env={"REV_TOKEN": "t0k3n-value"})
    rev, local = cfg.a2a_peers
    assert (rev.name, rev.required, rev.call_timeout, rev.tls) == ("rev", False, 90.0, TlsConfig(ca=str(ca)))
    assert rev.headers == {"Authorization": "Bearer {{secret:REV_TOKEN}}"}
    assert (local.name, local.call_timeout, local.tls) == ("local", 600.0, None)
    assert cfg.mcp == ()


@pytest.mark.parametrize(("argv", "error"), [
    (["--a2a-peer", "nope"], "missing '='"),
    (["--a2a-peer", "x=http://example.com"], "plain http://"),
    (["--a2a-peer", "x=https://u:p@example.com"], "credentials"),
    (["--a2a-peer", "a__b=https://example.com"], "bad server name"),
    (["--a2a-peer", "x=https://a.example", "--a2a-peer", "x=https://b.example"], "duplicate peer name"),
    (["--serve-a2a"], "--serve-a2a needs --serve-mcp"),
    (["--a2a-peer", "docs=https://a.example", "--mcp", "docs=https://b.example/mcp"], "names both an MCP server"),
])
def test_bad_flags(argv: list[str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_config([*BASE, *argv], env={})


@pytest.mark.parametrize(("entry", "error"), [
    ("  - {name: w, url: https://w.example, hedaers: {}}\n", r"extra fields found \(hedaers\) @ \$.a2a_peers\[0\]"),
    ("  - {name: w, url: 'https://w.example', headers: {Authorization: 'Bearer abcdefabcdef1234567890abcd'}}\n",
     "inline credential"),
    ("  - {name: w, url: 'https://w.example', headers: {Authorization: 'Bearer {{secret:MISSING_X}}'}}\n",
     "MISSING_X"),
    ("  - {name: w, url: https://w.example}\n  - {name: w, url: https://v.example}\n", "duplicate peer name"),
    ("  - {name: w, url: https://w.example, tls: {ca: /no/such/ca.pem}}\n", "tls.ca"),
])
def test_bad_file_entries(tmp_path: Path, entry: str, error: str) -> None:
    (tmp_path / "c.yaml").write_text("a2a_peers:\n" + entry)
    with pytest.raises(ConfigError, match=error):
        load_config([*BASE, "--config", str(tmp_path / "c.yaml")], env={})
