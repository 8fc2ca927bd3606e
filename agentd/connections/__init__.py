"""Host-configured connections: host config + agent manifests, auth providers, allowlists, runtime modules,
tool lifecycle events and the durable transcript (docs/connections.md).

Modules: ``model`` (the manifest's shape; the host config's shapes and checks are agentd.config.host, read
and structured like every agentd file); ``plan`` (host + manifest -> a validated plan, before any side effect); ``auth`` (httpx auth flows: oauth provider, client
credentials); ``runtime`` (runtime modules: tool adapter, credentials, authorize callbacks, HTTP policy);
``steps`` (the step runner, events, limits); ``transcript`` (SQLite store); ``cli`` (``agentd run`` and
``agentd transcript``).
"""
