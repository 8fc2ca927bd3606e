"""agentd for a person at a terminal: the live view of a run on stderr, ``agentd trace``, the ``agentd check``
table and the ``--output human`` result.

Everything here is presentation over documents and event lines the rest of agentd already produces; nothing
below imports this package. rich is imported only by the modules that draw (:mod:`agentd.terminal.live`,
:mod:`agentd.terminal.render`), and only once a human view was chosen, so children, piped runs and
``--log-format json`` never load it (:mod:`agentd.terminal.mode` decides with the standard library alone).
"""
