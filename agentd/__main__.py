"""``python -m agentd``: the command line, and the re-exec entry point for subagents."""

from agentd.cli import console_main

if __name__ == "__main__":
    console_main()
