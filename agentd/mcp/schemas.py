"""JSON Schemas from peers, compiled so that checking a value against one is bounded and stays inside it.

An MCP server writes the ``inputSchema`` agentd checks a model's arguments against (and the
``outputSchema`` it checks the server's own results against); agentd's served tools have schemas too.
These rules make that safe on the event loop:

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
  A ``pattern`` not run is not enforced by agentd; the server still judges the arguments it receives.
  A ``patternProperties`` key decides which subschema applies, so it cannot be skipped: a property name
  too long for it stops the check (:class:`CheckTooCostly`).
* **One check has one budget.** Every keyword applied to a value, every value compared (``uniqueItems``,
  ``enum``, ``const``), every character of an error message and every pattern's worst case is charged
  to :data:`CHECK_BUDGET`; past it the check stops with :class:`CheckTooCostly`, whatever the schema and
  the value. ``uniqueItems`` compares canonical forms in a set (linear), not every pair. Messages are cut
  to :data:`MAX_MESSAGE_CHARS` (jsonschema quotes the whole value in many of them).

No I/O here. jsonschema (with ``referencing`` behind it) is imported on the first compile, not with this
module: a run whose catalogue compiles nothing eagerly (agentd's own tools only) never loads it.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
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
#: Work one check of one value may cost, in steps: one step is one backtracking step of Python's regular
#: expression engine (some ten nanoseconds), so a check stops after a quarter of a second or so.
CHECK_BUDGET: Final = 30_000_000
#: Work compiling one schema may cost (checking it against its dialect's metaschema, then probing it):
#: once per distinct schema, when a tool list loads; a few seconds at most (a metaschema step costs about
#: twice a pattern step). A 1000-property schema costs about half of it.
COMPILE_BUDGET: Final = 5 * CHECK_BUDGET
#: Work compiling the schemas of one tool list may cost together (a list of thousands of schemas each just
#: under :data:`COMPILE_BUDGET` must not hold the event loop for as many times as long).
LISTING_BUDGET: Final = 2 * COMPILE_BUDGET
#: Steps charged for one keyword applied to one value (jsonschema's own work: several microseconds).
_KEYWORD_STEPS: Final = 1000
#: Steps charged for following a reference (``$ref``, ``$dynamicRef``, ``$recursiveRef``): a lookup as well.
_REF_STEPS: Final = 4000
#: Steps charged per value visited when values are compared (``uniqueItems``, ``enum``, ``const``).
_NODE_STEPS: Final = 400
#: Steps charged per character of an error message (jsonschema builds many with ``repr`` of the value).
_MESSAGE_STEPS: Final = 8
#: Longest error message kept (a longer one is cut after its cost was charged).
MAX_MESSAGE_CHARS: Final = 300
#: Longest ``$ref`` chain followed when checking a schema for reference cycles.
_MAX_REF_HOPS: Final = 64
#: Keywords whose values are data, not subschemas (a ``$ref`` key in there is not a reference).
_DATA_KEYWORDS: Final = frozenset({"enum", "const", "default", "examples"})


class SchemaUnusable(Exception):
    """Checking a value ran into a schema that cannot be evaluated (a reference or recursion problem)."""


class CheckTooCostly(Exception):
    """Checking a value against a schema was stopped at :data:`CHECK_BUDGET`: the value is neither valid nor
    invalid. The message says what ran out (never the value)."""


class _Meter:
    """What one check has left of its budget (one per :func:`first_errors` call, found through a context
    variable by the keywords, which jsonschema calls without any state of ours)."""

    __slots__ = ("_patterns", "left", "root")

    def __init__(self, budget: int, root: Any) -> None:
        self.left = budget
        self.root = root
        self._patterns: tuple[str, ...] | None = None

    def charge(self, steps: int, what: str) -> None:
        self.left -= steps
        if self.left < 0:
            raise CheckTooCostly(f"{what} exceeds the budget of one check")

    def all_patterns(self) -> tuple[str, ...]:
        """Every ``patternProperties`` key in the whole schema (``unevaluatedProperties`` may run any)."""
        if self._patterns is None:
            self._patterns = tuple(sorted({key for node in _subschemas(self.root)
                                           if isinstance(node.get("patternProperties"), Mapping)
                                           for key in node["patternProperties"] if isinstance(key, str)}))
        return self._patterns


_METER: contextvars.ContextVar[_Meter | None] = contextvars.ContextVar("agentd_schema_meter", default=None)


@attrs.frozen
class Compiled:
    """A compiled schema. ``validator`` is ``None`` when there is nothing agentd will check locally:
    ``error`` says the schema is not a valid JSON Schema, ``unusable`` that it cannot be evaluated at all."""

    validator: Any
    error: str | None = None
    unusable: str | None = None
    #: The steps compiling it cost (to charge a tool list's :data:`LISTING_BUDGET`).
    cost: int = 0


def _refuse(uri: str) -> referencing.Resource[Any]:
    """The registry's retrieval: nothing outside the schema is ever fetched or read."""
    import referencing.exceptions

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


@functools.cache
def _registry() -> referencing.Registry[Any]:
    """The one registry every validator resolves ``$ref`` in (built on the first compile)."""
    import referencing

    return referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


def compile_schema(schema: Mapping[str, Any] | bool, default: Any = None, *, budget: int = COMPILE_BUDGET
                   ) -> Compiled:
    """Compile ``schema`` (its ``$schema`` dialect, else ``default``: 2020-12) with the rules above, within
    ``budget`` steps (past it the schema is unusable)."""
    import jsonschema
    import jsonschema.validators

    _install()
    default = _bounded(jsonschema.Draft202012Validator if default is None else default)
    meter = _Meter(budget, schema)
    try:
        cls = jsonschema.validators.validator_for(schema, default=default)
        error = _schema_error(cls, schema, meter)
    except RecursionError:
        return Compiled(None, unusable="the schema is nested too deeply", cost=budget - meter.left)
    except (CheckTooCostly, SchemaUnusable):
        return Compiled(None, unusable="the schema is too large to check against its dialect's metaschema",
                        cost=budget - meter.left)
    if error is not None:
        return Compiled(None, error=error, cost=budget - meter.left)
    unsafe = _unsafe_pattern(schema)
    if unsafe is not None:
        return Compiled(None, error=f"pattern {unsafe[:80]!r} is too complex to check safely",
                        cost=budget - meter.left)
    validator = _bounded(cls)(schema, registry=_registry())
    problem = _reference_problem(validator)
    if problem is None:
        try:
            probes: tuple[Any, ...] = ({}, None, 0, "", [])
            for probe in probes:
                _errors(validator, probe, meter)
        except SchemaUnusable as exc:
            problem = str(exc)
        except CheckTooCostly:
            problem = "is too large: checking even an empty value exceeds the budget of one check"
    if problem is not None:
        return Compiled(None, unusable=problem, cost=budget - meter.left)
    return Compiled(validator, cost=budget - meter.left)


def _schema_error(cls: Any, schema: Any, meter: _Meter) -> str | None:
    """Why ``schema`` is not a valid schema of ``cls``'s dialect, or ``None``: jsonschema's ``check_schema``,
    with the metaschema's own validator metered like any other (on the compile's ``meter``)."""
    import jsonschema.exceptions
    import jsonschema.validators

    meta = _bounded(jsonschema.validators.validator_for(cls.META_SCHEMA, default=_bounded(cls)))
    validator = meta(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER)
    errors = _errors(validator, schema, _Meter(meter.left, cls.META_SCHEMA), spent=meter)
    return jsonschema.exceptions.best_match(errors).message if errors else None


def first_error(validator: Any, instance: Any) -> jsonschema.ValidationError | None:
    """The most relevant of the first :data:`MAX_ERRORS` violations, or ``None`` when ``instance`` fits.

    Raises :class:`SchemaUnusable` when the schema cannot be evaluated and :class:`CheckTooCostly` when the
    check ran out of budget (it never raises anything else).
    """
    errors = first_errors(validator, instance)
    if not errors:
        return None
    import jsonschema.exceptions

    return jsonschema.exceptions.best_match(errors)


def first_errors(
    validator: Any, instance: Any, *, budget: int = CHECK_BUDGET
) -> list[jsonschema.ValidationError]:
    """The first :data:`MAX_ERRORS` violations, in schema order, within ``budget`` steps.

    Raises :class:`SchemaUnusable` when the schema cannot be evaluated and :class:`CheckTooCostly` when the
    check ran out of budget (it never raises anything else)."""
    return _errors(validator, instance, _Meter(budget, getattr(validator, "schema", {})))


def _errors(validator: Any, instance: Any, meter: _Meter, *, spent: _Meter | None = None
            ) -> list[jsonschema.ValidationError]:
    """:func:`first_errors` on ``meter`` (what it used is taken from ``spent`` too, when given)."""
    import referencing.exceptions

    left = meter.left
    token = _METER.set(meter)
    try:
        return list(itertools.islice(validator.iter_errors(instance), MAX_ERRORS))
    except referencing.exceptions.Unresolvable as exc:
        raise SchemaUnusable(f"a $ref cannot be resolved ({_ref_of(exc)})") from None
    except RecursionError:
        raise SchemaUnusable("the schema refers to itself without end") from None
    finally:
        _METER.reset(token)
        if spent is not None:
            spent.left -= left - meter.left


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


def pattern_cost(pattern: str, length: int) -> int | None:
    """Worst-case steps of running ``pattern`` on a string of ``length`` characters, or ``None`` when it is
    never run on one that long (:func:`pattern_limit`)."""
    limit = pattern_limit(pattern)
    if limit is None or length > limit:
        return None
    repeats, alternatives, anchored = _shape(pattern)
    if anchored:  # tried at the first position only: the other starts fail at once
        return int(alternatives * (length + 1) ** repeats + length + 1)
    return int(alternatives * (length + 1) ** (repeats + 1))


@functools.lru_cache(maxsize=1024)
def _shape(pattern: str) -> tuple[int, int, bool]:
    """``(repeats, alternatives, anchored at the start)`` of a pattern :func:`pattern_limit` accepted."""
    parser: Any = importlib.import_module("re._parser")
    tree = parser.parse(pattern)
    parsed = list(tree)
    cost = _cost(parsed, inside_repeat=False)
    assert cost is not None
    at = str(parsed[0][1]) if parsed and str(parsed[0][0]) == "AT" else ""
    # "^" under (?m) matches after every newline: only "\A", or "^" without it, is tried once.
    anchored = at == "AT_BEGINNING_STRING" or (at == "AT_BEGINNING" and not tree.state.flags & re.MULTILINE)
    return cost[0], cost[1], anchored


def _charge_names(patterns: Any, instance: Any, what: str) -> None:
    """Charge matching every property name of ``instance`` against every one of ``patterns``; a name too long
    for a pattern stops the check (whether it matches decides which subschema applies)."""
    meter = _METER.get()
    if meter is None or not isinstance(instance, Mapping) or not patterns:
        return
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue
        for name in instance:
            cost = pattern_cost(pattern, len(name)) if isinstance(name, str) else 0
            if cost is None:
                raise CheckTooCostly(f"{what}: a property name of {len(name)} characters is too long to match "
                                     f"against the pattern {pattern[:80]!r}")
            meter.charge(cost, f"{what}: matching property names")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """The ``pattern`` keyword, run only within :func:`pattern_limit` (a longer string is not checked)."""
    if not validator.is_type(instance, "string"):
        return
    cost = pattern_cost(pattern, len(instance))
    if cost is None:
        return
    meter = _METER.get()
    if meter is not None:
        meter.charge(cost, "pattern")
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


# -- comparing values --------------------------------------------------------------------------------------


def _freeze(value: Any, meter: _Meter | None) -> Any:
    """A hashable form of a JSON value under JSON Schema equality (``1 == 1.0``, ``true != 1``, key order
    ignored), its size charged before it is built."""
    if meter is not None:
        meter.charge(_size(value) * _NODE_STEPS, "comparing values")
    return _build(value)


def _build(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return value
    if kind is bool:
        return ("b", value)
    if kind is int or kind is float:
        return ("n", value)
    if kind is dict:
        return ("o", frozenset((k, _build(v)) for k, v in value.items()))
    if kind is list:
        return ("a", tuple(_build(v) for v in value))
    return ("?", repr(value))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """``uniqueItems`` in linear time: the canonical forms go into a set."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    meter = _METER.get()
    for index, item in enumerate(instance):
        form = _freeze(item, meter)
        if form in seen:
            import jsonschema

            yield jsonschema.ValidationError(f"has non-unique elements (item {index} repeats an earlier one)")
            return
        seen.add(form)


def _size(value: Any) -> int:
    """How many values ``value`` holds, itself included (iterative: no depth is too deep)."""
    count, todo = 0, [value]
    while todo:
        node = todo.pop()
        count += 1
        if type(node) is dict:
            todo.extend(node.values())
        elif type(node) is list:
            todo.extend(node)
    return count


# -- the budget --------------------------------------------------------------------------------------------

#: Extra steps a keyword costs beyond :data:`_KEYWORD_STEPS`, by keyword, given ``(value, instance, schema)``.
_EXTRA: Final[Mapping[str, Callable[[_Meter, Any, Any, Any], None]]] = {
    "patternProperties": lambda meter, value, instance, schema: _charge_names(
        list(value) if isinstance(value, Mapping) else (), instance, "patternProperties"),
    "additionalProperties": lambda meter, value, instance, schema: _charge_names(
        list(schema.get("patternProperties", ())) if isinstance(schema, Mapping) else (), instance,
        "additionalProperties"),
    "unevaluatedProperties": lambda meter, value, instance, schema: _charge_names(
        meter.all_patterns(), instance, "unevaluatedProperties"),
    "enum": lambda meter, value, instance, schema: meter.charge(
        (len(value) if isinstance(value, list) else 1) * _size(instance) * _NODE_STEPS, "enum"),
    "const": lambda meter, value, instance, schema: meter.charge(_size(instance) * _NODE_STEPS, "const"),
}


def _metered(name: str, keyword: Any) -> Any:
    """``keyword`` charged to the check's meter: its application, its extra work, and each error message
    (jsonschema quotes whole values in many), which is then cut to :data:`MAX_MESSAGE_CHARS`."""
    extra = _EXTRA.get(name)
    cost = _REF_STEPS if name in ("$ref", "$dynamicRef", "$recursiveRef") else _KEYWORD_STEPS

    def metered(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
        meter = _METER.get()
        if meter is not None:
            meter.charge(cost, name)
            if extra is not None:
                extra(meter, value, instance, schema)
        for error in keyword(validator, value, instance, schema) or ():
            if meter is not None:
                meter.charge(len(error.message) * _MESSAGE_STEPS, f"{name}: error messages")
            if len(error.message) > MAX_MESSAGE_CHARS:
                error.message = error.message[:MAX_MESSAGE_CHARS] + "…"
            yield error

    return metered


_BOUNDED: dict[Any, Any] = {}


def _bounded(cls: Any) -> Any:
    """``cls`` with the bounded ``pattern``, ``uniqueItems`` and size keywords, every keyword metered (one
    class per dialect; a class that is already bounded is returned as it is)."""
    if cls in _BOUNDED.values():
        return cls
    bounded = _BOUNDED.get(cls)
    if bounded is None:
        bounded = _BOUNDED[cls] = _extend(cls)
    return bounded


@functools.cache
def _install() -> None:
    """Register the bounded classes as the validators of their dialects' ``$schema`` URIs.

    jsonschema picks a subschema's validator class by its own ``$schema`` (``evolve`` calls
    ``validator_for``): without this, a subschema naming another dialect, and every metaschema that names
    its own, would be checked by jsonschema's unbounded classes.
    """
    import jsonschema.validators

    for cls in (jsonschema.Draft3Validator, jsonschema.Draft4Validator, jsonschema.Draft6Validator,
                jsonschema.Draft7Validator, jsonschema.Draft201909Validator, jsonschema.Draft202012Validator):
        jsonschema.validators.validates(cls.__name__)(_bounded(cls))


def _extend(cls: Any) -> Any:
    import jsonschema.validators

    keywords = {
        **cls.VALIDATORS,
        "pattern": _pattern,
        "uniqueItems": _unique_items,
        "maxItems": _too_many("array", "items"),
        "maxLength": _too_many("string", "characters"),
        "maxProperties": _too_many("object", "properties"),
    }
    return jsonschema.validators.extend(cls, {name: _metered(name, fn) for name, fn in keywords.items()})
