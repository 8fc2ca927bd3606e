"""A small seeded mutational fuzzer for the tests that throw hostile bytes at a live agentd over a real socket.

The sans-io parsers are fuzzed coverage-guided (tests/fuzz, ``scripts/fuzz``); a live endpoint is fuzzed by
mutating valid requests: byte flips, deletions, duplications, and insertions of the shapes that broke agentd
before (deep nesting, lone surrogates, bytes that are not UTF-8, huge strings, numbers no float holds).
Deterministic for a seed, so a failure is reproducible from the test's output.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

#: Fragments a mutation may insert: each once crashed, froze or bloated some JSON reader.
SPECIALS: tuple[bytes, ...] = (
    b"[" * 60000,
    b'{"a":' * 3000,
    b"[" * 600 + b"]" * 600,
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b"\xff\xfe\x00",
    b"\xed\xa0\x80",
    b"1e999",
    b"-1e-999",
    b"NaN",
    b'"' + b"x" * 70000 + b'"',
    b"\x00",
    b"null",
    b"{}",
    b"[]",
    b'"\\u0000"',
)


def mutations(seeds: Sequence[bytes], count: int, *, seed: int) -> Iterator[bytes]:
    """``count`` mutated copies of ``seeds`` (each one to four mutations deep)."""
    rng = random.Random(seed)
    for _ in range(count):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            pos = rng.randrange(len(data) + 1)
            if op == 0 and data:
                data[pos % len(data)] = rng.randrange(256)
            elif op == 1:
                data[pos:pos] = rng.choice(SPECIALS)
            elif op == 2:
                del data[pos : pos + rng.randint(1, 8)]
            elif op == 3:
                data[pos:pos] = data[: rng.randint(0, min(len(data), 256))]
            else:
                depth = rng.randint(100, 3000)
                data[pos:pos] = b"[" * depth + b"]" * depth
        yield bytes(data)
