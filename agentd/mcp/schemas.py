"""JSON Schemas from peers, compiled so that checking a value against one is bounded and stays inside it.

An MCP server writes the ``inputSchema`` agentd checks a model's arguments against (and the
``outputSchema`` it checks the server's own results against); agentd's served tools have schemas too.
Three rules make that safe on the event loop:

* **References resolve only inside the schema.** Every validator is built with a ``referencing`` registry
  whose retrieval refuses everything: no ``http://`` fetch, no ``file://`` read. A ``$ref`` that cannot be
  resolved that way, or a chain of ``$ref`` that only points at itself, makes the schema *unusable*
  (:attr:`Compiled.unusable`): the caller refuses the tool rather than crash on the first call.
* **Checking stops early.** :func:`first_error` looks at no more than :data:`MAX_ERRORS` violations, so a
  huge invalid value costs one error, not millions.
* **Patterns are bounded.** A ``pattern`` is matched by Python's backtracking engine, so one written to
  backtrack catastrophically could stall the daemon on a short string. :func:`pattern_limit` reads the
  pattern's structure once: backreferences, a repetition inside a repetition, or alternatives inside a
  repetition are never run; otherwise its worst case grows like ``n**(repeats+1) * alternatives`` and
  the pattern is run only on strings short enough to keep that under :data:`PATTERN_BUDGET` steps.
  A pattern not run is not enforced by agentd; the server still judges the arguments it receives.

No I/O here. jsonschema (with ``referencing`` behind it) is imported on the first compile, not with this
module: a run whose catalogue compiles nothing eagerly (agentd's own tools only) never loads it.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

if TYPE_CHECKING:
    import jsonschema
    import referencing
    import referencing.exceptions

#: At most this many violations are produced (then the most relevant one is reported).
MAX_ERRORS: Final = 16
#: Longest pattern agentd will run at all.
MAX_PATTERN_CHARS: Final = 1000
#: Worst-case backtracking steps a pattern may cost on one string.
PATTERN_BUDGET: Final = 10_000_000
#: Longest ``$ref`` chain followed when checking a schema for reference cycles.
_MAX_REF_HOPS: Final = 64
#: Keywords whose values are data, not subschemas (a ``$ref`` key in there is not a reference).
_DATA_KEYWORDS: Final = frozenset({"enum", "const", "default", "examples"})


class SchemaUnusable(Exception):
    """Checking a value ran into a schema that cannot be evaluated (a reference or recursion problem)."""


@attrs.frozen
class Compiled:
    """A compiled schema. ``validator`` is ``None`` when there is nothing agentd will check locally:
    ``error`` says the schema is not a valid JSON Schema, ``unusable`` that it cannot be evaluated at all."""

    validator: Any
    error: str | None = None
    unusable: str | None = None


def _refuse(uri: str) -> referencing.Resource[Any]:
    """The registry's retrieval: nothing outside the schema is ever fetched or read."""
    import referencing.exceptions

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


@functools.cache
def _registry() -> referencing.Registry[Any]:
    """The one registry every validator resolves ``$ref`` in (built on the first compile)."""
    import referencing

    return referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


def compile_schema(schema: Mapping[str, Any] | bool, default: Any = None) -> Compiled:
    """Compile ``schema`` (its ``$schema`` dialect, else ``default``: 2020-12) with the rules above."""
    import jsonschema
    import jsonschema.validators

    if default is None:
        default = jsonschema.Draft202012Validator
    try:
        cls = jsonschema.validators.validator_for(schema, default=default)
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return Compiled(None, error=exc.message)
    except RecursionError:
        return Compiled(None, unusable="the schema is nested too deeply")
    unsafe = _unsafe_pattern(schema)
    if unsafe is not None:
        return Compiled(None, error=f"pattern {unsafe[:80]!r} is too complex to check safely")
    validator = _bounded(cls)(schema, registry=_registry())
    problem = _reference_problem(validator)
    if problem is None:
        try:
            probes: tuple[Any, ...] = ({}, None, 0, "", [])
            for probe in probes:
                first_error(validator, probe)
        except SchemaUnusable as exc:
            problem = str(exc)
    if problem is not None:
        return Compiled(None, unusable=problem)
    return Compiled(validator)


def first_error(validator: Any, instance: Any) -> jsonschema.ValidationError | None:
    """The most relevant of the first :data:`MAX_ERRORS` violations, or ``None`` when ``instance`` fits.

    Raises :class:`SchemaUnusable` when the schema cannot be evaluated (it never raises anything else).
    """
    errors = first_errors(validator, instance)
    if not errors:
        return None
    import jsonschema.exceptions

    return jsonschema.exceptions.best_match(errors)


def first_errors(validator: Any, instance: Any) -> list[jsonschema.ValidationError]:
    """The first :data:`MAX_ERRORS` violations, in schema order (raises only :class:`SchemaUnusable`)."""
    import referencing.exceptions

    try:
        return list(itertools.islice(validator.iter_errors(instance), MAX_ERRORS))
    except referencing.exceptions.Unresolvable as exc:
        raise SchemaUnusable(f"a $ref cannot be resolved ({_ref_of(exc)})") from None
    except RecursionError:
        raise SchemaUnusable("the schema refers to itself without end") from None


def _ref_of(exc: referencing.exceptions.Unresolvable) -> str:
    ref = getattr(exc, "ref", "")
    return repr(ref[:120]) if isinstance(ref, str) else "?"


# -- references --------------------------------------------------------------------------------------------


def _subschemas(schema: Any) -> Iterator[Mapping[str, Any]]:
    """Every object in ``schema`` that may hold keywords, without recursion and skipping data keywords."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, Mapping):
            yield node
            stack.extend(v for k, v in node.items() if k not in _DATA_KEYWORDS and isinstance(v, list | Mapping))


def _reference_problem(validator: Any) -> str | None:
    """Why some ``$ref`` in the schema cannot be followed (unresolvable, or a cycle of bare references)."""
    schema = validator.schema
    resolver: Any = validator._resolver
    if not any(isinstance(node.get("$ref"), str) for node in _subschemas(schema)):
        return None
    import referencing.jsonschema

    specification = referencing.jsonschema.specification_with(
        validator.META_SCHEMA.get("$schema", ""), default=referencing.jsonschema.DRAFT202012
    )
    # Follow each reference from its nearest enclosing resource (a subschema with its own "$id").
    stack: list[tuple[Any, Any]] = [(schema, resolver)]
    while stack:
        node, scope = stack.pop()
        if isinstance(node, list):
            stack.extend((item, scope) for item in node)
            continue
        if not isinstance(node, Mapping):
            continue
        if node is not schema and isinstance(node.get("$id"), str):
            scope = scope.in_subresource(specification.create_resource(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            problem = _follow(ref, scope)
            if problem is not None:
                return problem
        stack.extend((v, scope) for k, v in node.items() if k not in _DATA_KEYWORDS and isinstance(v, list | Mapping))
    return None


def _follow(ref: str, scope: Any) -> str | None:
    import referencing.exceptions

    seen: set[int] = set()
    for _ in range(_MAX_REF_HOPS):
        try:
            resolved = scope.lookup(ref)
        except referencing.exceptions.Unresolvable:
            return f"$ref {ref[:120]!r} cannot be resolved inside the schema"
        contents = resolved.contents
        if not isinstance(contents, Mapping) or not isinstance(contents.get("$ref"), str):
            return None
        if id(contents) in seen:
            return f"$ref {ref[:120]!r} refers to itself without end"
        seen.add(id(contents))
        scope, ref = resolved.resolver, contents["$ref"]
    return "a chain of $ref is too long"


# -- patterns ----------------------------------------------------------------------------------------------


def _unsafe_pattern(schema: Any) -> str | None:
    """The first pattern in ``schema`` agentd will never run (``patternProperties`` keys must all be safe,
    since jsonschema matches them itself; a ``pattern`` keyword goes through :func:`_pattern`)."""
    for node in _subschemas(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern_limit(pattern) is None:
            return pattern
        properties = node.get("patternProperties")
        if isinstance(properties, Mapping):
            for key in properties:
                if isinstance(key, str) and pattern_limit(key) is None:
                    return key
    return None


@functools.lru_cache(maxsize=1024)
def pattern_limit(pattern: str) -> int | None:
    """The longest string ``pattern`` may be run on within :data:`PATTERN_BUDGET`, or ``None`` to never run it."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return None
    parser: Any = importlib.import_module("re._parser")
    try:
        parsed = parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    cost = _cost(list(parsed), inside_repeat=False)
    if cost is None:
        return None
    repeats, alternatives = cost
    if alternatives > PATTERN_BUDGET:
        return None
    return int((PATTERN_BUDGET / alternatives) ** (1 / (repeats + 1)))


def _cost(items: list[Any], *, inside_repeat: bool) -> tuple[int, int] | None:
    """``(repeats, alternatives)`` of a parsed pattern, or ``None`` when it could backtrack without bound."""
    repeats, alternatives = 0, 1
    for op, av in items:
        name = str(op)
        sub: list[Any] = []
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = av
            if high == low:
                # A fixed count: no choice, but anything it repeats that has a choice multiplies.
                inner = _cost(list(body), inside_repeat=inside_repeat or high > 1)
                if inner is None:
                    return None
                repeats, alternatives = repeats + inner[0], alternatives * inner[1]
                continue
            if inside_repeat:
                return None
            if high == 1:
                alternatives *= 2
                sub = list(body)
            else:
                repeats += 1
                inner = _cost(list(body), inside_repeat=True)
                if inner is None:
                    return None
                continue
        elif name == "BRANCH":
            if inside_repeat:
                return None
            for branch in av[1]:
                inner = _cost(list(branch), inside_repeat=False)
                if inner is None:
                    return None
                repeats += inner[0]
                alternatives *= inner[1]
            alternatives *= len(av[1])
            continue
        elif name == "SUBPATTERN":
            sub = list(av[-1])
        elif name == "ATOMIC_GROUP":
            sub = list(av)
        elif name in ("ASSERT", "ASSERT_NOT"):
            sub = list(av[1])
        elif name in ("GROUPREF", "GROUPREF_EXISTS", "GROUPREF_IGNORE", "GROUPREF_LOC_IGNORE",
                      "GROUPREF_UNI_IGNORE"):
            return None
        if sub:
            inner = _cost(sub, inside_repeat=inside_repeat)
            if inner is None:
                return None
            repeats, alternatives = repeats + inner[0], alternatives * inner[1]
        if alternatives > PATTERN_BUDGET or repeats > 8:
            return None
    return repeats, alternatives


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """The ``pattern`` keyword, run only within :func:`pattern_limit` (a longer string is not checked)."""
    if not validator.is_type(instance, "string"):
        return
    limit = pattern_limit(pattern)
    if limit is None or len(instance) > limit:
        return
    if re.search(pattern, instance) is None:
        import jsonschema

        yield jsonschema.ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")


def _too_many(kind: str, unit: str) -> Any:
    """A ``max*`` keyword whose message states the size instead of quoting the (possibly huge) value."""

    def keyword(validator: Any, limit: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
        if validator.is_type(instance, kind) and validator.is_type(limit, "integer") and len(instance) > limit:
            import jsonschema

            yield jsonschema.ValidationError(f"has {len(instance)} {unit}, more than the {limit} allowed")

    return keyword


@functools.cache
def _bounded(cls: Any) -> Any:
    """``cls`` with the bounded ``pattern`` and size keywords (one class per dialect)."""
    import jsonschema.validators

    return jsonschema.validators.extend(cls, {
        "pattern": _pattern,
        "maxItems": _too_many("array", "items"),
        "maxLength": _too_many("string", "characters"),
        "maxProperties": _too_many("object", "properties"),
    })
