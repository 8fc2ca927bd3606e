"""The root's child config is unstructured on the first spawn, not at start-up (agentd/supervisor/wiring.py).

What the lazy form must keep: the same document a child receives, and the same secrets registered with the
redactor from the start (found without cattrs). The DSN of ``--cluster`` and the operator socket stay with
the daemon, so a secret named only there is not the child config's.
"""

from __future__ import annotations

import subprocess
import sys

from agentd.config.model import ClusterConfig, Config, McpServerConfig
from agentd.supervisor.supervisor import referenced_secrets
from agentd.supervisor.wiring import ChildConfig, child_secrets, config_to_wire

ENV = {"FS_TOKEN": "fs-secret", "PEER_TOKEN": "peer-secret", "PGPW": "pg-secret", "TASK": "task-secret",
       "UNUSED": "never"}


def _config() -> Config:
    return Config(
        instruction="do it with {{secret:TASK}}",
        mcp=(McpServerConfig(name="fs", url="https://fs.example/mcp",
                             headers={"Authorization": "Bearer {{secret:FS_TOKEN}}"}),),
        a2a_peers=(McpServerConfig(name="peer", url="https://peer.example/a2a",
                                   headers={"X-Key": "{{secret:PEER_TOKEN}}"}),),
        cluster=ClusterConfig(dsn="postgresql://agentd:{{secret:PGPW}}@db.example/agentd"),
    )


def test_child_secrets_are_the_wire_configs_without_cattrs() -> None:
    cfg = _config()
    assert child_secrets(cfg, ENV) == referenced_secrets(config_to_wire(cfg), ENV)
    assert child_secrets(cfg, ENV) == {"FS_TOKEN": "fs-secret", "PEER_TOKEN": "peer-secret", "TASK": "task-secret"}


def test_the_lazy_child_config_reads_as_the_wire_config() -> None:
    cfg = _config()
    lazy = ChildConfig(cfg)
    assert dict(lazy) == config_to_wire(cfg)
    assert lazy["cluster"] is None and lazy["mcp_servers"][0]["name"] == "fs"
    assert len(lazy) == len(config_to_wire(cfg))


def test_building_it_imports_no_cattrs_until_it_is_read() -> None:
    program = (
        "import sys\n"
        "from agentd.config.model import Config\n"
        "from agentd.supervisor.wiring import ChildConfig, child_secrets\n"
        "lazy = ChildConfig(Config(instruction='x'))\n"
        "child_secrets(Config(instruction='x'), {})\n"
        "print('cattrs' in sys.modules)\n"
        "dict(lazy)\n"
        "print('cattrs' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "True"]
