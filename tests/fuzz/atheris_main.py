"""The atheris entry point behind ``scripts/fuzz``: ``python -m tests.fuzz.atheris_main TARGET [libFuzzer args]``.

agentd's modules are instrumented for coverage as they are imported; the target is one of
:data:`tests.fuzz.targets.TARGETS`, and a clean refusal (:class:`~tests.fuzz.targets.TargetRejected`) is not a
finding. Anything else raised is a crash, reported by libFuzzer with the input that caused it.
"""

from __future__ import annotations

import sys


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] == "--list":
        from tests.fuzz.targets import TARGETS

        print("targets:", " ".join(sorted(TARGETS)))
        return
    import atheris

    with atheris.instrument_imports(include=["agentd"]):
        from tests.fuzz.targets import TARGETS, TargetRejected

    name = sys.argv.pop(1)
    if name not in TARGETS:
        sys.exit(f"unknown target {name!r}; targets: {' '.join(sorted(TARGETS))}")
    target = TARGETS[name]

    def one_input(data: bytes) -> None:
        try:
            target(data)
        except TargetRejected:
            pass

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
