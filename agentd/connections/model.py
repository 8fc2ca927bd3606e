"""The shape of an agent manifest, as written (docs/connections.md); the host config's is agentd.config.host.

::

    version: "1.0"
    name: triage
    connections: [{ref: documents, alias: docs, mode: read, tools: [search], required: true}]
    limits: {maxSteps: 20, maxTokens: 100000, deadlineMs: 300000, maxToolCallsPerIteration: 8}
    steps: [{id: find, prompt: "...", tools: [docs__search]}]
    output: "a JSON object {summary}"

Structured by the one strict converter (agentd.config.structure): unknown keys are errors naming their path.
"""

from __future__ import annotations

from typing import Literal

import attrs

from agentd import defaults
from agentd.config.host import Mode
from agentd.config.structure import register_aliases

# --- manifest --------------------------------------------------------------------------------------------


@attrs.frozen
class Binding:
    ref: str
    alias: str | None = None
    mode: Mode | None = None
    tools: list[str] | None = None
    required: bool = True

    @property
    def name(self) -> str:
        """What the agent calls this connection: its alias, else the host's name."""
        return self.alias or self.ref


@attrs.frozen
class ManifestLimits:
    max_tool_calls_per_iteration: int | None = attrs.field(default=None, alias="maxToolCallsPerIteration")
    #: Model calls per step (each one followed by its tool calls).
    max_steps: int = attrs.field(default=defaults.MAX_STEPS, alias="maxSteps")
    #: Tokens for the whole run (every step).
    max_tokens: int = attrs.field(default=defaults.MAX_TOKENS, alias="maxTokens")
    #: Wall clock for the whole run.
    deadline_ms: int = attrs.field(default=int(defaults.DEADLINE * 1000), alias="deadlineMs")


@attrs.frozen
class Step:
    id: str
    prompt: str
    type: Literal["prompt"] = "prompt"
    tools: list[str] = attrs.field(factory=list)


@attrs.frozen
class Manifest:
    steps: list[Step]
    connections: list[Binding] = attrs.field(factory=list)
    limits: ManifestLimits = attrs.field(factory=ManifestLimits)
    version: str = "1.0"
    name: str | None = None
    #: The output contract of the last step (as ``--output-contract``).
    output: str | None = None


register_aliases(ManifestLimits)
