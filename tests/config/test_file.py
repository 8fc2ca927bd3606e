"""The YAML config file: mcp_servers, scalar settings, path-named errors, merging with --mcp."""

from pathlib import Path

import pytest

from agentd.config import Config, McpServerConfig, TlsConfig
from agentd.config.load import load_config
from agentd.errors import ConfigError

BASE = ["--instruction", "do it", "--intelligence", "test"]


def load(tmp_path: Path, text: str, *extra: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "agentd.yaml"
    path.write_text(text)
    return load_config([*BASE, "--config", str(path), *extra], env=env or {})


def refused(tmp_path: Path, text: str, *extra: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, *extra, env=env)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_full_server_entry(tmp_path: Path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("pem")
    cfg = load(tmp_path, """
mcp_servers:
  - name: fs
    url: https://mcp-fs.internal/mcp
    required: false
    headers: {Authorization: "Bearer {{secret:FS_TOKEN}}", X-Tenant: acme}
    tls: {ca: ca.pem, cert: client.pem, key: client.key}
    connect_timeout: 2s
    call_timeout: 1.5m
  - name: local
    url: http://127.0.0.1:9000/mcp
""", env={"FS_TOKEN": "t"})
    fs, local = cfg.mcp
    assert fs == McpServerConfig(
        name="fs", url="https://mcp-fs.internal/mcp", required=False,
        headers={"Authorization": "Bearer {{secret:FS_TOKEN}}", "X-Tenant": "acme"},
        tls=TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "client.pem"), str(tmp_path / "client.key")),
        connect_timeout=2.0, call_timeout=90.0,
    )
    assert local == McpServerConfig(name="local", url="http://127.0.0.1:9000/mcp")


def test_unknown_top_level_key_is_named(tmp_path: Path) -> None:
    message = refused(tmp_path, "max_step: 3\n")
    assert "unknown key 'max_step'" in message and "$.max_step" in message and "did you mean 'max_steps'" in message


def test_unknown_server_key_is_named_with_its_path(tmp_path: Path) -> None:
    message = refused(tmp_path, "mcp_servers:\n  - {name: a, url: 'https://a', hedaers: {}}\n")
    assert "hedaers" in message and "$.mcp_servers[0]" in message


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("mcp_servers:\n  - {name: a}\n", ["$.mcp_servers[0].url", "required field missing"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', required: 'yes'}\n", ["$.mcp_servers[0].required",
                                                                                "true or false"]),
        ("mcp_servers:\n  - {name: 7, url: 'https://a'}\n", ["$.mcp_servers[0].name", "expected a string"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', connect_timeout: soon}\n",
         ["$.mcp_servers[0].connect_timeout", "'soon'"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', call_timeout: [1]}\n",
         ["$.mcp_servers[0].call_timeout", "expected a duration"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', tls: {ca: x, crt: y}}\n", ["$.mcp_servers[0].tls", "crt"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', headers: {X-N: 5}}\n", ["$.mcp_servers[0].headers"]),
        ("mcp_servers: {name: a}\n", ["$.mcp_servers", "list"]),
        ("mcp_servers:\n  - a\n", ["$.mcp_servers[0]", "expected a mapping (key: value lines), got str"]),
        ("connections:\n  - 1\n", ["$.connections", "expected a mapping (key: value lines), got list"]),
        ("mcp_servers:\n  - {name: a, url: 'http://example.com/'}\n", ["non-loopback host 'example.com'"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a'}\n  - {name: a, url: 'https://b'}\n", ["duplicate", "'a'"]),
        ("- a\n- b\n", ["top level must be a mapping"]),
        ("max_steps: [1\n", ["not valid YAML", "line"]),
        ("max_steps: 5\nmodel: m\nmax_steps: 10\n", ["duplicate key 'max_steps'", "line 3"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', name: b}\n", ["duplicate key 'name'"]),
        ("mode: sometimes\n", ["$.mode", "invalid choice 'sometimes'"]),
        ("mcp_servers:\n  - {name: a, url: 'https://a', connect_timeout: 0}\n", ["connect_timeout must be > 0"]),
    ],
)
def test_bad_files(tmp_path: Path, text: str, fragments: list[str]) -> None:
    message = refused(tmp_path, text)
    assert message.startswith("--config ")
    for fragment in fragments:
        assert fragment in message


def test_inline_credential_in_header_is_refused_without_echo(tmp_path: Path) -> None:
    token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    message = refused(tmp_path, f"mcp_servers:\n  - name: a\n    url: https://a\n    headers:\n"
                                f"      Authorization: Bearer {token}\n")
    assert "Authorization" in message and "inline credential" in message and token not in message


def test_missing_secret_in_header_names_it(tmp_path: Path) -> None:
    message = refused(tmp_path, "mcp_servers:\n  - name: a\n    url: https://a\n    headers:\n"
                                "      Authorization: 'Bearer {{secret:A_TOKEN}}'\n", env={"OTHER": "value-xyz"})
    assert "A_TOKEN" in message and "value-xyz" not in message


def test_managed_header_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, "mcp_servers:\n  - {name: a, url: 'https://a', headers: {Mcp-Session-Id: x}}\n")
    assert "Mcp-Session-Id" in message


def test_mcp_flags_merge_with_file(tmp_path: Path) -> None:
    text = "mcp_servers:\n  - {name: fs, url: 'https://fs/mcp', required: false}\n"
    cfg = load(tmp_path, text, "--mcp", "gh=https://gh/mcp", "--mcp", "fs=https://fs/mcp")
    assert [(s.name, s.url, s.required) for s in cfg.mcp] == [("fs", "https://fs/mcp", False),
                                                              ("gh", "https://gh/mcp", True)]


def test_mcp_flag_conflicting_with_file(tmp_path: Path) -> None:
    message = refused(tmp_path, "mcp_servers:\n  - {name: fs, url: 'https://fs/mcp'}\n", "--mcp", "fs=https://x/mcp")
    assert "conflicts" in message and "fs=https://x/mcp" in message


def test_relative_paths_follow_the_file(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "tok").write_text("v\n")
    (tmp_path / "instr.txt").write_text("from file")
    cfg = load(tmp_path, "instruction_file: instr.txt\nintelligence_token: '{{secret-file:secrets/tok}}'\n"
                         "mcp_servers:\n  - {name: a, url: 'https://a', headers: {X-K: '{{secret-file:secrets/tok}}'}}\n")
    assert cfg.intelligence.token == f"{{{{secret-file:{tmp_path / 'secrets' / 'tok'}}}}}"
    assert cfg.mcp[0].headers["X-K"] == f"{{{{secret-file:{tmp_path / 'secrets' / 'tok'}}}}}"


def test_instruction_file_in_config_overridden_by_flag_instruction(tmp_path: Path) -> None:
    (tmp_path / "instr.txt").write_text("from file")
    cfg = load(tmp_path, "instruction_file: instr.txt\n")  # BASE also passes --instruction: the flag wins
    assert cfg.instruction == "do it" and cfg.instruction_file is None


def test_lists_and_scalars(tmp_path: Path) -> None:
    cfg = load(tmp_path, "intelligence: [https://a/v1, https://b/v1]\nlog_content: true\nmode: reactive\n"
                         "subscribe: [file:///inbox]\ndebounce: 100ms\n"
                         "mcp_servers: [{name: fs, url: 'https://fs.example/mcp'}]\n",)
    assert cfg.intelligence.endpoints == ("test",)  # --intelligence flag wins over the file
    assert cfg.telemetry.log_content and cfg.mode == "reactive" and cfg.modes.subscribe == ("file:///inbox",) and cfg.modes.debounce == 0.1


def test_flag_only_keys_are_not_file_keys(tmp_path: Path) -> None:
    for key in ("mcp: []", "config: x.yaml", "validate_config: true"):
        assert "unknown key" in refused(tmp_path, key + "\n")


def test_empty_file_is_fine(tmp_path: Path) -> None:
    assert load(tmp_path, "").budgets.max_steps == 50
    cfg = load(tmp_path, "mcp_servers:\n#  - {name: a, url: 'https://a'}\nmax_steps:\n")
    assert cfg.mcp == () and cfg.budgets.max_steps == 50


def test_host_connections_key_errors_name_their_path(tmp_path: Path) -> None:
    """A host file's `connections:` is read by the same strict format as the rest of the file."""
    assert "$.connections" in refused(tmp_path, "connections: [1]\n")
    assert "$.connections['docs'].tools" in refused(tmp_path, "connections: {docs: {url: 'https://d/mcp'}}\n")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config([*BASE, "--config", str(tmp_path / "missing.yaml")], env={})


def test_tls_ca_applies_to_https_servers_without_their_own(tmp_path: Path) -> None:
    for name in ("global.pem", "own.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("pem")
    cfg = load(tmp_path, "mcp_servers:\n  - {name: own, url: 'https://own', tls: {ca: own.pem}}\n"
                         "  - {name: cert, url: 'https://cert', tls: {cert: c.pem, key: k.pem}}\n"
                         "  - {name: local, url: 'http://127.0.0.1:1/mcp'}\n",
               "--mcp", "flag=https://flag/mcp", "--tls-ca", str(tmp_path / "global.pem"))
    tls = {server.name: server.tls for server in cfg.mcp}
    assert tls["own"] == TlsConfig(ca=str(tmp_path / "own.pem"))
    assert tls["cert"] == TlsConfig(str(tmp_path / "global.pem"), str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    assert tls["flag"] == TlsConfig(ca=str(tmp_path / "global.pem"))
    assert tls["local"] is None


PIN = "a" * 64


def test_pin_and_pin_file(tmp_path: Path) -> None:
    (tmp_path / "fs.pins.yaml").write_text(f"read_file: {'b' * 64}\n")
    cfg = load(tmp_path, f"""
mcp_servers:
  - {{name: inline, url: 'https://a', pin: {{search: '{PIN}'}}}}
  - {{name: filed, url: 'https://b', pin_file: fs.pins.yaml}}
  - {{name: open, url: 'https://c'}}
""")
    inline, filed, unpinned = cfg.mcp
    assert inline.pin == {"search": PIN} and filed.pin == {"read_file": "b" * 64} and unpinned.pin is None


@pytest.mark.parametrize(("entry", "expected"), [
    ("pin: {search: 'abc'}", "$.mcp_servers[0].pin: 'search' must map to a tool hash"),
    (f"pin: {{search: '{PIN.upper()}'}}", "64 lowercase hex digits"),
    (f"pin: {{search: '{PIN}'}}, pin_file: p.yaml", "give 'pin' or 'pin_file', not both"),
    ("pin_file: missing.yaml", "$.mcp_servers[0].pin_file"),
])
def test_bad_pins_are_refused(tmp_path: Path, entry: str, expected: str) -> None:
    message = refused(tmp_path, f"mcp_servers:\n  - {{name: a, url: 'https://a', {entry}}}\n")
    assert expected in message


def test_pins_are_for_mcp_servers_only(tmp_path: Path) -> None:
    message = refused(tmp_path, f"a2a_peers:\n  - {{name: a, url: 'https://a', pin: {{x: '{PIN}'}}}}\n")
    assert "unknown key 'pin'" in message
