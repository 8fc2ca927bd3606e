"""Work deferred to first use, so a start-up pays only for what it runs.

Packages' lazily imported exports (agentd.deferred.lazy) and regular expressions compiled by their
first match (agentd.deferred.patterns); docs/benchmarks.md, "Start-up: what a once run imports".

Nothing is imported here: each part is imported from its module.
"""
