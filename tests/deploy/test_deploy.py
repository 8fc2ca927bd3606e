"""deploy/: the Kubernetes manifests, the systemd unit and the container build file, checked offline.

The manifests are validated against the Kubernetes API schemas of a pinned version (``kubernetes-validate``),
the unit with ``systemd-analyze verify``; all three are read for what docs/deployment.md promises, and held
against the code: every flag they pass is in the flag table and the argv they pass is a valid agentd
configuration (``load_config``, with their mounted files made real in a temporary directory), the grace
periods exceed the drain they configure, the probe paths are the ones the server answers.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import trio
import yaml

from agentd import defaults as D
from agentd.config.argv import FLAGS
from agentd.config.durations import parse_duration
from agentd.config.load import load_config
from agentd.telemetry.health import PROBES
from tests.integration.agents import agentd_worker
from tests.selfmcp.certs import Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: The Kubernetes version the manifests are validated against (the oldest we document, docs/deployment.md).
KUBERNETES = "1.33.0"
FLAG_NAMES = {flag.name for flag in FLAGS}
#: The kill ladder after --drain-timeout runs out: cancel, then SIGTERM, then SIGKILL (docs/cli.md).
LADDER = D.CANCEL_GRACE + D.TERM_GRACE
UID = 10001


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def kind(docs: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == wanted]
    return found


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [only] = workload["spec"]["template"]["spec"]["containers"]
    return dict(only)


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def flags_in(argv: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


def materialise(argv: list[str], mounts: dict[str, Path], pki: Pki) -> list[str]:
    """``argv`` with each mount point replaced by its local directory, and each file it names there created
    if missing: a test certificate or key for ``*.crt``/``*.key``, a token otherwise (Secret volumes)."""
    out = []

    def local(match: re.Match[str]) -> str:
        path = Path(match.group(0))
        for mount, directory in mounts.items():
            if path.is_relative_to(mount):
                target = directory / path.relative_to(mount)
                if not target.exists():
                    source = {".crt": pki.server.cert, ".key": pki.server.key}.get(target.suffix)
                    target.write_bytes(source.read_bytes() if source else b"t" * 40)
                return str(target)
        return match.group(0)

    for arg in argv:
        out.append(re.sub(r"(?<![\w/])/[\w./-]+", local, arg))
    return out


# --- Kubernetes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["worker.yaml", "job.yaml"])
def test_manifests_validate_against_the_pinned_kubernetes_schemas(name: str) -> None:
    for document in documents(name):
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_the_validator_really_rejects_a_broken_manifest() -> None:
    job = kind(documents("job.yaml"), "Job")
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty-five"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES, strict=True)


def pod_security(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == UID
    assert pod["automountServiceAccountToken"] is False
    box = container(workload)["securityContext"]
    assert box["readOnlyRootFilesystem"] is True and box["allowPrivilegeEscalation"] is False
    assert box["runAsNonRoot"] is True and box["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in container(workload)["volumeMounts"]}
    assert "/tmp" in mounts  # a read-only root file system still needs a scratch directory


def mounts_of(workload: dict[str, Any], docs: list[dict[str, Any]], tmp_path: Path) -> dict[str, Path]:
    """Each volume mount of the container as a local directory (config maps' files written into it)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    local: dict[str, Path] = {}
    for mount in container(workload)["volumeMounts"]:
        directory = tmp_path / "mounts" / mount["name"]
        directory.mkdir(parents=True)
        source = volumes[mount["name"]]
        if "configMap" in source:
            config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                              and d["metadata"]["name"] == source["configMap"]["name"])
            for file, text in config_map["data"].items():
                (directory / file).write_text(text)
        local[mount["mountPath"]] = directory
    return local


def test_worker_deployment_is_consistent_with_agentd(tmp_path: Path) -> None:
    docs = documents("worker.yaml")
    deployment, service, budget = kind(docs, "Deployment"), kind(docs, "Service"), kind(docs, "PodDisruptionBudget")
    box = container(deployment)
    argv = list(box["args"])
    assert set(flags_in(argv)) <= FLAG_NAMES, set(flags_in(argv)) - FLAG_NAMES
    env = {e["name"]: e["value"] for e in box.get("env", []) if "value" in e}
    config = load_config(materialise(argv, mounts_of(deployment, docs, tmp_path), make_pki(tmp_path / "pki")), env=env)
    assert config.serve.mcp is not None and config.serve.bearer is not None
    assert str(config.serve.bearer).startswith("{{secret-file:" + str(tmp_path / "mounts" / "serve-bearer"))
    # Probes: the paths the serve port answers without authentication, on the serve port.
    serve_port = int(config.serve.mcp.rsplit(":", 1)[1].split("/")[0])
    [port] = box["ports"]
    assert port["containerPort"] == serve_port
    assert box["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert box["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in (box["readinessProbe"], box["livenessProbe"]):
        assert probe["httpGet"]["path"] in PROBES
        assert probe["httpGet"]["port"] in (port["name"], serve_port)
        assert probe["httpGet"]["scheme"] == ("HTTPS" if config.serve.mcp.startswith("https") else "HTTP")
    # The grace period outlasts the preStop pause, the drain and the kill ladder.
    pod = deployment["spec"]["template"]["spec"]
    pause = box["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert config.ladder.drain_timeout == parse_duration(flag_value(argv, "--drain-timeout"))
    assert pod["terminationGracePeriodSeconds"] > pause + config.ladder.drain_timeout + LADDER
    pod_security(deployment)
    # Secrets by reference: mounted Secret volumes, never a literal in the manifest.
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert {"agentd-tls", "agentd-serve-bearer", "agentd-intelligence"} <= secrets
    # The Service and the budget select the Deployment's pods; the Service targets the serve port.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [port["name"]]
    assert deployment["spec"]["replicas"] > budget["spec"]["maxUnavailable"]


@pytest.mark.slow
async def test_worker_pod_answers_its_probes_and_guards_its_endpoint(tmp_path: Path) -> None:
    """The worker's own argv, run for real (bound to 127.0.0.1:0 instead of the pod's 0.0.0.0:8443): the
    probe paths answer 200 without credentials, as the kubelet asks them; the MCP endpoint wants the bearer."""
    docs = documents("worker.yaml")
    deployment = kind(docs, "Deployment")
    box = container(deployment)
    pki = make_pki(tmp_path / "pki")
    argv = materialise(list(box["args"]), mounts_of(deployment, docs, tmp_path), pki)
    argv[argv.index("--serve-mcp") + 1] = "https://127.0.0.1:0"
    env = {e["name"]: e["value"] for e in box.get("env", []) if "value" in e}
    async with agentd_worker(argv, env=env) as worker, httpx.AsyncClient(verify=pki.client_context()) as http:
        base = worker.url.rsplit("/", 1)[0]
        with trio.fail_after(30):
            for probe in (box["readinessProbe"], box["livenessProbe"]):
                answer = await http.get(base + probe["httpGet"]["path"])
                assert answer.status_code == 200, (probe, answer.text)
            refused = await http.post(worker.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                      headers={"Accept": "application/json, text/event-stream"})
        assert refused.status_code == 401
    assert worker.returncode == 0  # SIGTERM: a clean drain


def test_job_maps_exit_codes_as_documented(tmp_path: Path) -> None:
    docs = documents("job.yaml")
    job = kind(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    actions: dict[int, str] = {}
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["containerName"] == "agentd" and rule["onExitCodes"]["operator"] == "In"
            for code in rule["onExitCodes"]["values"]:
                assert code not in actions
                actions[code] = rule["action"]
        else:
            assert rule == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert actions[2] == actions[5] == actions[7] == actions[3] == "FailJob"
    assert actions[6] == actions[4] == actions[1] == "Count"
    # Every code agentd documents has a decision, and only those (0 is success, never in a policy).
    documented = {int(c) for c in re.findall(r"^\| (\d) \|", (ROOT / "docs" / "cli.md").read_text(), re.M)}
    assert set(actions) == documented - {0}
    # The table in docs/deployment.md says the same.
    table = deployment_table()
    for code, action in actions.items():
        assert action in table[code], (code, table[code])
    box = container(job)
    argv = list(box["args"])
    assert set(flags_in(argv)) <= FLAG_NAMES
    env = {e["name"]: e["value"] for e in box.get("env", []) if "value" in e}
    config = load_config(materialise(argv, mounts_of(job, docs, tmp_path), make_pki(tmp_path / "pki")), env=env)
    assert config.serve.mcp is None and config.instruction
    assert pod["terminationGracePeriodSeconds"] > config.ladder.drain_timeout + LADDER
    assert job["spec"]["activeDeadlineSeconds"] > config.budgets.deadline  # agentd's own deadline ends the run first
    pod_security(job)


def test_the_user_page_names_what_the_files_pin() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert f"Kubernetes {KUBERNETES.rsplit('.', 1)[0]} API schemas" in page
    base = stages()[-1][0].split()[0]
    assert f"`{base}`" in page
    assert all(f"deploy/{name}" in page for name in ("Dockerfile", "systemd/agentd.service",
                                                      "kubernetes/worker.yaml", "kubernetes/job.yaml"))
    assert "[docs/deployment.md](docs/deployment.md)" in (ROOT / "README.md").read_text()


def deployment_table() -> dict[int, str]:
    """docs/deployment.md's exit-code table: code -> the whole row."""
    rows = re.findall(r"^\| (\d) \|(.*)$", (ROOT / "docs" / "deployment.md").read_text(), re.M)
    return {int(code): rest for code, rest in rows}


# --- systemd ----------------------------------------------------------------------------------------------------


def unit(name: str = "agentd.service") -> tuple[str, dict[str, list[str]]]:
    """The unit's text and its [Service]/[Unit]/[Install] keys (continuation lines joined)."""
    text = (DEPLOY / "systemd" / name).read_text()
    keys: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, value = line.split("=", 1)
        keys.setdefault(key, []).append(value)
    return text, keys


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` (systemd's own parser) finds nothing to say about the unit; the binary it
    checks for is this checkout's ``agentd``."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (the unit's keys are still checked by the test below)")
    agentd = shutil.which("agentd", path=str(Path(sys.executable).parent))
    assert agentd is not None
    text, _ = unit()
    copy = tmp_path / "agentd.service"
    copy.write_text(text.replace("/usr/local/bin/agentd", agentd))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False)
    ours = [line for line in (done.stdout + done.stderr).splitlines() if "agentd.service" in line]
    assert done.returncode == 0 and ours == [], done.stdout + done.stderr


def test_systemd_unit_is_consistent_with_agentd(tmp_path: Path) -> None:
    _, keys = unit()
    one = {k: v[-1] for k, v in keys.items()}
    # agentd does not implement sd_notify, so the unit must not wait for a READY=1 that never comes.
    sources = "".join(p.read_text() for p in (ROOT / "agentd").rglob("*.py"))
    assert ("NOTIFY_SOCKET" in sources) == (one["Type"] == "notify")
    assert one["Type"] in ("exec", "notify")
    assert one["ExecReload"] == "/bin/kill -HUP $MAINPID" and one["KillSignal"] == "SIGTERM"
    assert one["KillMode"] == "mixed"  # SIGTERM to agentd only: it drains and stops its own subagents
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("DynamicUser", "yes"),
                       ("PrivateTmp", "yes"), ("RestrictSUIDSGID", "yes")):
        assert one[key] == value, key
    assert one["CapabilityBoundingSet"] == ""
    # Not "yes" or "tmpfs": those hide /home and /root, and an agentd installed there would not start.
    assert one["ProtectHome"] == "read-only"
    assert "2" in one["RestartPreventExitStatus"].split()
    argv = shlex.split(one["ExecStart"])
    assert argv[0] == "/usr/local/bin/agentd"
    args = argv[1:]
    assert set(flags_in(args)) <= FLAG_NAMES, set(flags_in(args)) - FLAG_NAMES
    # Writable places: the state directory and the health file's directory are the ones systemd makes.
    assert flag_value(args, "--state-dir") == f"/var/lib/{one['StateDirectory']}"
    assert Path(flag_value(args, "--health-file")).parent == Path(f"/run/{one['RuntimeDirectory']}")
    drain = parse_duration(flag_value(args, "--drain-timeout"))
    assert parse_duration(one["TimeoutStopSec"]) > drain + LADDER
    # The argv is a valid configuration once %d (the credentials directory) and /etc/agentd are real.
    credentials, etc = tmp_path / "credentials", tmp_path / "etc"
    credentials.mkdir()
    etc.mkdir()
    (etc / "agentd.yaml").write_text("mcp_servers: []\n")
    pki = make_pki(tmp_path / "pki")
    for name in (c.split(":", 1)[0] for c in keys["LoadCredential"]):
        source = {"tls.crt": pki.server.cert, "tls.key": pki.server.key}.get(name)
        (credentials / name).write_bytes(source.read_bytes() if source else b"t" * 40)
    local = [a.replace("%d", str(credentials)).replace("/etc/agentd", str(etc)) for a in args]
    config = load_config(local, env={"AGENTD_INTELLIGENCE": "https://gateway.example/v1"})
    assert config.serve.bearer == f"{{{{secret-file:{credentials}/serve-bearer}}}}"
    assert config.ladder.drain_timeout == drain


def test_the_user_unit_runs_a_real_pipx_install(tmp_path: Path) -> None:
    """``pipx install`` of this checkout into a throw-away home; the user unit then verifies against that
    home (``systemd-analyze --user verify`` checks its ExecStart binary exists), and its ExecStart, with the
    files its install comment makes (``agentd init``, the bearer file), is a valid configuration for that
    pipx-installed agentd, run from another directory with nothing set in the environment."""
    home = tmp_path / "home"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
           "PIPX_HOME": str(home / ".local/share/pipx"), "PIPX_BIN_DIR": str(home / ".local/bin")}
    pipx = [sys.executable, "-m", "pipx"]
    done = subprocess.run([*pipx, "install", str(ROOT)], env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    agentd = home / ".local/bin/agentd"
    assert agentd.exists()

    text, keys = unit("agentd-user.service")
    one = {k: v[-1] for k, v in keys.items()}
    assert one["ExecStart"].split()[0] == "%h/.local/bin/agentd"
    assert "DynamicUser" not in one and "User" not in one  # a user manager runs it as that user
    assert one["KillSignal"] == "SIGTERM" and one["RestartPreventExitStatus"] == "2"
    copy = tmp_path / "agentd.service"
    copy.write_text(text)
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        done = subprocess.run([analyze, "--user", "verify", str(copy)], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        ours = [line for line in (done.stdout + done.stderr).splitlines() if "agentd.service" in line]
        assert done.returncode == 0 and ours == [], done.stdout + done.stderr

    # The install comment's steps, then ExecStart's arguments with systemd's specifiers filled in.
    config = home / ".config/agentd"
    done = subprocess.run([str(agentd), "init", str(config)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (config / "serve-bearer").write_text("b" * 44 + "\n")
    specifiers = {"%h": str(home), "%E": str(home / ".config"), "%S": str(home / ".local/state"),
                  "%t": str(runtime)}
    args = shlex.split(one["ExecStart"])[1:]
    for key, value in specifiers.items():
        args = [a.replace(key, value) for a in args]
    assert set(flags_in(args)) <= FLAG_NAMES, set(flags_in(args)) - FLAG_NAMES
    done = subprocess.run([str(agentd), *args, "--validate-config"], env=env, cwd="/", capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    effective = json.loads(done.stdout)["config"]
    assert effective["state_dir"] == str(home / ".local/state/agentd")
    assert parse_duration(one["TimeoutStopSec"]) > parse_duration(flag_value(args, "--drain-timeout")) + LADDER


# --- container image --------------------------------------------------------------------------------------------


def stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """The Dockerfile as stages: (FROM line, [(instruction, arguments)]), continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text()
    found: list[tuple[str, list[tuple[str, str]]]] = []
    args: dict[str, str] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not found:
            name, _, value = rest.partition("=")
            args[name] = value
        elif instruction == "FROM":
            for name, value in args.items():
                rest = rest.replace(f"${{{name}}}", value)
            found.append((rest, []))
        else:
            assert found, f"{instruction} before the first FROM"
            found[-1][1].append((instruction, rest))
    return found


BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|cc|make|build-essential|python3?-dev|libc6?-dev|rustc|cargo)\b")


def test_container_image_build_file() -> None:
    built = stages()
    assert len(built) >= 2, "multi-stage: build, then a runtime stage"
    final_from, final = built[-1]
    base = final_from.split()[0]
    # A pinned slim Python base: an exact version tag (or a digest), never "latest".
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base), base
    assert all(from_line.split()[0] == base for from_line, _ in built)
    minor = tuple(int(x) for x in base.split(":")[1].split(".")[:2])
    requires = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert requires and minor >= (int(requires.group(1)), int(requires.group(2)))
    assert f'"Programming Language :: Python :: {minor[0]}.{minor[1]}"' in (ROOT / "pyproject.toml").read_text()
    # The final stage: copies the built environment, installs and compiles nothing, runs unprivileged.
    instructions = [i for i, _ in final]
    users = [rest for i, rest in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    assert users[-1].split(":")[0] == str(UID)  # the uid the Kubernetes manifests run as
    assert instructions.index("USER") > max(i for i, (ins, _) in enumerate(final) if ins in ("RUN", "COPY"))
    assert any(i == "COPY" and rest.startswith("--from=") for i, rest in final)
    for instruction, rest in final:
        if instruction == "RUN":
            assert "pip" not in rest and "apt-get" not in rest and not BUILD_TOOLS.search(rest), rest
    assert ("ENTRYPOINT", '["agentd"]') in final
    # The build stage installs from wheels only: no compiler is needed anywhere.
    build_runs = " ".join(rest for _, stage in built[:-1] for i, rest in stage if i == "RUN")
    assert "--only-binary=:all:" in build_runs and not BUILD_TOOLS.search(build_runs.replace("compileall", ""))
    # What the build copies exists in the checkout.
    for _, stage in built:
        for instruction, rest in stage:
            if instruction == "COPY" and not rest.startswith("--from="):
                for source in rest.split()[:-1]:
                    assert (ROOT / source).exists(), source
