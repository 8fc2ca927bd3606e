"""Security decisions every layer shares: one answer each.

Secret references and their resolution (agentd.security.secrets), the Rule of Two verdict
(agentd.security.rule_of_two), and which hosts are this machine (agentd.security.loopback: where
``http://`` is allowed, what is never proxied).

Nothing is imported here: each part is imported from its module.
"""
