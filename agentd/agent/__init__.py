"""The agent loop: prompt, steps, budgets, the control-tool seam, distillation (docs/loop.md).

Import from the modules (``agentd.agent.control``, ``agentd.agent.runner``, ...): this package imports
nothing on purpose, so a part that needs only the control-tool types does not load the whole loop.
"""
