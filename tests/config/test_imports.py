"""agentd.config and agentd.security.secrets are leaves-only: no trio, httpx, hypercorn or jsonschema behind them.

That holds for loading a config file too, host keys (``connections:``, ``intelligence:``) included: the
config layer reads every agentd file format itself and never imports agentd.connections or the gateway
client.
"""

import subprocess
import sys
from pathlib import Path

RUNTIME = ("trio", "httpx", "hypercorn", "jsonschema", "agentd.connections", "agentd.intelligence")


def _loaded_after(code: str) -> list[str]:
    check = f"bad = [m for m in {RUNTIME!r} if m in sys.modules]\nprint(','.join(bad))"
    proc = subprocess.run([sys.executable, "-c", f"import sys\n{code}\n{check}"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [name for name in proc.stdout.strip().split(",") if name]


def test_config_imports_no_runtime() -> None:
    assert _loaded_after("import agentd.config.load, agentd.config.file, agentd.config.host, agentd.config.cron, "
                         "agentd.security.secrets, agentd.defaults, agentd.formats.tool_separator") == []


def test_loading_a_host_file_imports_no_runtime(tmp_path: Path) -> None:
    path = tmp_path / "host.yaml"
    path.write_text(
        "version: '1.0'\n"
        "intelligence: {url: test, model: m, key: {env: GW_KEY}}\n"
        "connections:\n"
        "  docs:\n"
        "    url: https://docs.example/mcp\n"
        "    auth: {type: bearer, token: {env: DOCS_TOKEN}}\n"
        "    mode: read\n"
        "    tools: [search]\n"
        "    readTools: [search]\n"
        "mcp_servers: [{name: fs, url: 'https://fs.example/mcp', connect_timeout: 5s}]\n"
        "transcript: {enabled: false}\n"
    )
    code = (
        "from agentd.config import load_config\n"
        "from agentd.config.host import load_host\n"
        f"env = {{'GW_KEY': 'k', 'DOCS_TOKEN': 't'}}\n"
        f"cfg = load_config(['--config', {str(path)!r}, '--instruction', 'x'], env)\n"
        "assert [s.name for s in cfg.mcp] == ['docs', 'fs'] and cfg.mcp[0].tools == ('search',), cfg.mcp\n"
        f"host = load_host({str(path)!r}, env)\n"
        "assert sorted(host.connections) == ['docs', 'fs'], host\n"
    )
    assert _loaded_after(code) == []


ABOVE_CONFIG = ("agentd.connections", "agentd.intelligence", "agentd.client", "agentd.agent", "agentd.supervisor",
                "agentd.modes", "agentd.selfmcp", "agentd.daemon", "agentd.cli", "agentd.oversight.drain")


def _imports(path: Path) -> list[str]:
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_config_never_imports_the_layers_above_it() -> None:
    root = Path(__file__).resolve().parents[2] / "agentd"
    found = [f"{path.name}: {name}" for path in sorted((root / "config").rglob("*.py")) for name in _imports(path)
             if any(name == above or name.startswith(above + ".") for above in ABOVE_CONFIG)]
    assert found == []
    for leaf in ("defaults.py", "formats/tool_separator.py"):
        assert [name for name in _imports(root / leaf) if name.startswith("agentd")] == []
