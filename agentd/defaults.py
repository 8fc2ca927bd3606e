"""Every tunable default agentd has, written once.

A leaf (no imports) because the values are used on both sides of the layering: ``agentd.config`` (the
``Config`` defaults and the flag table's help text) sits below the supervisor, the router and the served
surface that own the behaviour (``Graces``, ``Caps``, ``Router``, ``SelfMcpLimits``), and neither side may
import the other. Durations are float seconds.
"""

from __future__ import annotations

from typing import Final

# --- per-run budgets ------------------------------------------------------------------------------------
MAX_STEPS: Final = 50
MAX_TOKENS: Final = 200_000
DEADLINE: Final = 600.0
#: A model reply cut before the gateway reported its usage (a deadline, a cancellation mid-stream) is counted
#: as an estimate: this many characters of the request and of the streamed text per token (agentd.intelligence.tally).
CHARS_PER_TOKEN: Final = 4
#: How long a run cut mid-reply may take to report that reply's tokens to its supervisor (shielded).
CUT_REPORT_WAIT: Final = 1.0

# --- subagent tree caps (agentd.supervisor.caps.Caps) ---------------------------------------------------
MAX_DEPTH: Final = 4
MAX_CHILDREN: Final = 8
MAX_SUBAGENTS: Final = 64
#: Spawns the whole tree may start per second, sustained, and at once (a token bucket).
SPAWN_RATE: Final = 2
SPAWN_BURST: Final = 8
TOKEN_CEILING: Final = 2_000_000
#: A default token slice (a spawn without ``token_budget``, agentd.supervisor.caps.default_slice) is an even
#: share of what the parent has left unless that is below enough for a turn: SLICE_MIN tokens, or
#: 1/SLICE_MIN_PARTS of a smaller ceiling.
SLICE_MIN: Final = 8192
SLICE_MIN_PARTS: Final = 64

# --- the kill ladder (agentd.supervisor.ladder.Graces) --------------------------------------------------
CANCEL_GRACE: Final = 5.0
EOF_GRACE: Final = 0.5
TERM_GRACE: Final = 2.0

#: ``subagent.await`` without a timeout, and a warm session's ``send`` with ``wait``, wait this long.
AWAIT_TIMEOUT: Final = 30.0

# --- subagent liveness (agentd.supervisor.liveness.LivenessSettings) ------------------------------------
PONG_TIMEOUT: Final = 10.0
PROGRESS_TIMEOUT: Final = 120.0
#: How often an idle warm session is pinged (a running turn: every 3.3 s). Each ping costs the parent CPU;
#: a tree of hundreds of idle sessions would otherwise spend more on pings than on work.
IDLE_PING_INTERVAL: Final = 30.0

# --- daemon lifetime ------------------------------------------------------------------------------------
DRAIN_TIMEOUT: Final = 25.0
#: ``--cron`` is read in this zone unless ``--cron-tz`` names another (agentd.config.cron).
CRON_TIME_ZONE: Final = "UTC"

# --- reactive mode (agentd.modes.router.Router) ------------------------------------------------------
DEBOUNCE: Final = 0.25
MAX_CONCURRENT_WAKES: Final = 4
#: URIs one wake may cover when wakes queue for the concurrent slots (a saturated daemon batches).
MAX_URIS_PER_WAKE: Final = 16
#: Wakes the whole daemon / one URI may start in any 60 s (0 = no limit); more wait, coalesced.
MAX_WAKES_PER_MINUTE: Final = 60
MAX_WAKES_PER_URI_PER_MINUTE: Final = 10

# --- the served self-MCP (agentd.selfmcp.surface.SelfMcpLimits, agentd.transport.asgi_server) -----------
SERVE_MAX_SPAWNS: Final = 4
SERVE_MAX_SESSIONS: Final = 64
#: One OAuth principal holds at most ``--serve-max-sessions`` divided by this of the sessions (and of the
#: listen streams) at once, so one client keeping sessions alive cannot lock the others out.
SERVE_SESSIONS_PER_OWNER_DIVISOR: Final = 4
SERVE_MAX_WARM: Final = 8
#: ``--cluster``: served async spawns this member queued (cluster rows) that have not ended yet.
SERVE_MAX_QUEUED: Final = 1000
SERVE_MAX_BODY: Final = 8 * 1024 * 1024
SERVE_KEEPALIVE: Final = 15.0
SERVE_RETENTION: Final = 600.0
#: Finished served A2A tasks kept for ``GetTask``/``ListTasks`` (within ``SERVE_RETENTION``): per caller and in
#: all, by count and by bytes; past a bound the oldest finished task goes first.
SERVE_A2A_KEPT_PER_CALLER: Final = 256
SERVE_A2A_KEPT_BYTES_PER_CALLER: Final = 4 * 1024 * 1024
SERVE_A2A_KEPT: Final = 4096
SERVE_A2A_KEPT_BYTES: Final = 32 * 1024 * 1024
#: ``--serve-tasks``: the ``pollInterval`` a served task suggests to its requestor (seconds).
SERVE_TASK_POLL_INTERVAL: Final = 1.0
#: 2026-07-28 wire: how long a sync ``subagent.spawn`` that may become a task waits for its run before it
#: answers with a task instead (a short run's result comes inline, with no poll round).
SERVE_TASK_INLINE_WAIT: Final = 1.0
#: The served Events extension (2026-07-28 wire, agentd.selfmcp.served_events): events kept, at most, and for at
#: most this long (seconds); a cursor behind them reads ``truncated: true``. ``nextPollMs`` a poll suggests.
SERVE_EVENTS_KEPT: Final = 1000
SERVE_EVENTS_MAX_AGE: Final = 24 * 3600.0
SERVE_EVENTS_POLL_MS: Final = 2000
#: Push delivery (``events/stream``): open streams one principal may hold, and the daemon in all; seconds between
#: heartbeats on a quiet stream (the extension asks for at most 30); a stream whose reader takes longer than
#: SERVE_EVENTS_SEND_TIMEOUT to accept one frame is ended (it reconnects with its cursor and loses nothing).
SERVE_EVENTS_STREAMS_PER_PRINCIPAL: Final = 16
SERVE_EVENTS_STREAMS: Final = 64
SERVE_EVENTS_HEARTBEAT: Final = 15.0
SERVE_EVENTS_SEND_TIMEOUT: Final = 30.0
SERVE_MAX_CONNECTIONS: Final = 256
SERVE_MAX_PER_CLIENT: Final = 64

# --- reading config files (agentd.config.yaml_file; ``agentd ctl reload``) --------------------------------
#: Largest YAML file agentd reads (config, host config, manifest, pin file).
CONFIG_MAX_BYTES: Final = 4 * 1024 * 1024
#: Most nodes a YAML file may stand for once its aliases are expanded (a "billion laughs" file is a few lines).
CONFIG_MAX_NODES: Final = 200_000
#: Largest ``{{secret-file:PATH}}`` agentd reads (a credential, a key: never megabytes).
SECRET_FILE_MAX_BYTES: Final = 64 * 1024
#: How long a reload may take to read and check the config (off the event loop) before it fails.
RELOAD_READ_TIMEOUT: Final = 10.0

# --- one MCP connection (agentd.config.model.McpServerConfig, host ``connections:`` entries) ------------
#: A server's ``list_changed`` re-lists at most once per this many seconds (a flood is coalesced into one).
RELIST_INTERVAL: Final = 1.0
CONNECT_TIMEOUT: Final = 10.0
CALL_TIMEOUT: Final = 60.0
#: A task-run tool call (agentd.mcp.tasks): the ``ttl`` agentd asks a 2025-11-25 server to keep the task for (long
#: enough for a crashed run to resume polling it), and the ``tasks/get`` interval: the server's, kept within
#: [TASK_POLL_MIN, TASK_POLL_MAX], TASK_POLL_DEFAULT when it names none.
TASK_TTL: Final = 3600.0
TASK_POLL_DEFAULT: Final = 1.0
TASK_POLL_MIN: Final = 0.05
TASK_POLL_MAX: Final = 30.0
#: MCP events (``--on-event``, agentd.client.events): the ``events/poll`` interval is the server's ``nextPollMs``,
#: kept within [EVENT_POLL_MIN, EVENT_POLL_MAX] (the extension's suggested floor is 1 s), EVENT_POLL_DEFAULT when it
#: names none; a failing poll is retried after EVENT_POLL_RETRY doubling up to EVENT_POLL_MAX.
EVENT_POLL_DEFAULT: Final = 5.0
EVENT_POLL_MIN: Final = 1.0
EVENT_POLL_MAX: Final = 300.0
EVENT_POLL_RETRY: Final = 1.0
#: Occurrences one ``events/poll`` asks for (``maxEvents``); a fuller backlog comes with ``hasMore`` and is
#: drained at once.
EVENT_POLL_BATCH: Final = 100
#: Occurrences held for one subscription between its wakes; past it the oldest are dropped and the wake reports
#: a gap, as for a server's ``truncated``.
EVENT_PENDING_MAX: Final = 1000
#: ``events/stream``: a stream with neither an event nor a heartbeat for this long is dead and re-opened from its
#: cursor (twice the extension's 30 s heartbeat).
EVENT_STREAM_QUIET: Final = 60.0
#: A quiet subscription's newer cursor (no occurrence for it, the server's position moved) is journaled at most this
#: often; a wake's cursor is journaled at once. An older journaled cursor only replays a stretch with no occurrences.
EVENT_CURSOR_SAVE_INTERVAL: Final = 30.0
#: Webhook delivery (``events/subscribe``, agentd.client.event_webhook; where agentd serves HTTPS): the TTL agentd
#: suggests (``ttlMs``; the server's ``refreshBefore`` decides, and agentd refreshes half-way to it, at least
#: EVENT_WEBHOOK_REFRESH_MIN apart); a POST's body is at most EVENT_WEBHOOK_MAX_BODY bytes (the extension's
#: 256 KiB), read within EVENT_WEBHOOK_BODY_TIMEOUT; the last EVENT_WEBHOOK_SEEN ``webhook-id`` s of a
#: subscription are kept to drop duplicates.
EVENT_WEBHOOK_TTL: Final = 900.0
EVENT_WEBHOOK_REFRESH_MIN: Final = 1.0
EVENT_WEBHOOK_MAX_BODY: Final = 256 * 1024
EVENT_WEBHOOK_BODY_TIMEOUT: Final = 30.0
EVENT_WEBHOOK_SEEN: Final = 4096
#: Which protocol era a connection speaks first (``era:``, ``--mcp-era``): ``auto`` probes with ``initialize``.
MCP_ERA: Final = "auto"
#: One whole A2A delegation (``a2a_peers[].call_timeout``, ``--a2a-peer``): peers' tasks run for minutes.
A2A_CALL_TIMEOUT: Final = 600.0

#: A peer-supplied URL's name resolved to several vetted addresses: how long each gets to accept a TCP
#: connection before the next is tried (agentd.transport.egress.vet pins the first that does).
EGRESS_PROBE_TIMEOUT: Final = 2.0

#: Largest response body (or one SSE event) agentd's HTTP client reads from a peer (agentd.transport.http_client).
MAX_BODY: Final = 16 * 1024 * 1024

# --- telemetry ------------------------------------------------------------------------------------------
LOG_LEVEL: Final = "info"
#: ``--log-format``: ``auto`` is the human view when stderr is a terminal, JSON lines otherwise.
LOG_FORMAT: Final = "auto"

# --- intelligence ---------------------------------------------------------------------------------------
MODEL: Final = "default"

# --- the run journal (``--state-dir``, agentd.journal.store.Retention) ---------------------------------------
#: Finished runs are kept while younger than this (seconds) and among the newest JOURNAL_KEEP_RUNS; 0: no bound.
JOURNAL_KEEP_FOR: Final = 30 * 86400.0
JOURNAL_KEEP_RUNS: Final = 1000
#: A cancelled run's last journal commit (shielded, agentd.run) waits at most this long (seconds).
JOURNAL_CANCEL_COMMIT: Final = 3.0

# --- cluster (``--cluster``, docs/cluster.md) ------------------------------------------------------------
#: Work items a member runs at once.
CLUSTER_CAPACITY: Final = 4
#: A member's lease on its work: a dead member's work moves after at most this long.
CLUSTER_LEASE_TTL: Final = 15.0
