"""One config key, declared once: :class:`Field` (type, default, bounds or choices, meaning, source)
and the one check of a single value against it (:meth:`Field.problem_with`).

Every key of the run config is a `Field` in jaxrl/config/schema.py or jaxrl/config/algorithm.py;
`base_config()`, `validate()`'s per-key checks, `python -m jaxrl.config show` and docs/config.md
are generated from those declarations, and the objective's dataclasses (`jaxrl.rl.LossConfig`,
`jaxrl.rl.AdvantageConfig`) take their fields, defaults and per-field checks from the same
objects (:func:`schema_dataclass`). Nothing here imports the rest of jaxrl.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Optional

_UNSET = object()  # `off` not given: the key has no "off" value
_BOUNDS = re.compile(r"^\s*(?:(?P<op>>=|>|<=|<)\s*(?P<one>\S+)|(?P<lb>[\[(])\s*(?P<lo>[^,\s]+)\s*,\s*(?P<hi>[^\])\s]+)"
                     r"\s*(?P<rb>[\])]))\s*$")
_num = float  # a bound of `bounds` ("1e-4", "inf", ...)


@dataclasses.dataclass(frozen=True)
class Field:
    """The declaration of one config key.

    Attributes:
      key: the dotted key, e.g. "trainer.algorithm.eps_clip_high".
      default: its default value (the CPU scale's; a recipe or a scale may set another); its type
        is the key's type (tuples: `item` or the default's element type).
      doc: one line: what the key means, with units and allowed values.
      bounds: "[lo, hi]", "(lo, hi]", ">= lo", "> lo", "<= hi" or "< hi" for a number (a tuple: each item); "" = none.
      choices: the allowed values of a string key; () = any.
      also: values accepted outside `bounds` (sentinels such as -1 = "all remaining").
      off: the config value that turns the option off; the objective's dataclass holds None for it
        (e.g. "" for `tis_ratio_type`, 0 for `max_seq_len`). Not checked against bounds/choices.
      item: element type of a tuple key whose default is empty.
      noun: what a value of a choice key is ("unknown {noun} 'x'"); "value" by default.
      problem: a template ({v}: the value) for the problem text of a bounds violation, replacing
        the generic "{v} must be >= lo" / "{v} is outside [lo, hi]".
      fix: the "Fix:" text of a violation; "" = generated from bounds / choices and the default.
      source: where the key and its default come from (paper, section, upstream default).
      attr: the attribute of the objective dataclass the key sets ("" = not an objective option).
      owner: that dataclass: "loss" (LossConfig), "advantage" (AdvantageConfig) or "error_policy"
        (jaxrl.train.error_policy.ErrorPolicy, the `harbor.error_policy` section).
      finite: a float value must be finite (also implied by `bounds`).
    """

    key: str
    default: Any
    doc: str
    bounds: str = ""
    choices: tuple = ()
    also: tuple = ()
    off: Any = _UNSET
    item: Optional[type] = None
    noun: str = "value"
    problem: str = ""
    fix: str = ""
    source: str = ""
    attr: str = ""
    owner: str = ""
    finite: bool = False

    def __post_init__(self):
        if self.bounds and not _BOUNDS.match(self.bounds):
            raise ValueError(f"{self.key}: bounds {self.bounds!r} is not '[lo, hi]', '(lo, hi]', '>= lo', ...")
        if self.owner and not self.attr:
            object.__setattr__(self, "attr", self.leaf)

    @property
    def leaf(self) -> str:
        """The last component of the key ("eps_clip_high")."""
        return self.key.rsplit(".", 1)[-1]

    @property
    def has_off(self) -> bool:
        """True when the key has an "off" value (`off`), None in the objective's dataclass."""
        return self.off is not _UNSET

    @property
    def value_type(self) -> type:
        """The Python type of a value: bool, int, float, str or tuple."""
        return type(self.default)

    @property
    def item_type(self) -> Optional[type]:
        """Element type of a tuple key (None for other keys, or a tuple of mixed types)."""
        if not isinstance(self.default, tuple):
            return None
        if self.item is not None:
            return self.item
        types = {type(v) for v in self.default}
        return types.pop() if len(types) == 1 else None

    @property
    def type_name(self) -> str:
        """The type as `show` and docs/config.md print it: int, float, str, bool, tuple[int], ..."""
        if isinstance(self.default, tuple):
            types = sorted({type(v).__name__ for v in self.default} or
                           ({self.item.__name__} if self.item else set()))
            return f"tuple[{' | '.join(types)}]" if types else "tuple"
        return type(self.default).__name__

    def _interval(self):
        """(lo, lo_closed, hi, hi_closed) of `bounds`, None for an open side."""
        m = _BOUNDS.match(self.bounds)
        if m.group("op"):
            v = _num(m.group("one"))
            return {">=": (v, True, None, False), ">": (v, False, None, False),
                    "<=": (None, False, v, True), "<": (None, False, v, False)}[m.group("op")]
        return _num(m.group("lo")), m.group("lb") == "[", _num(m.group("hi")), m.group("rb") == "]"

    def in_bounds(self, v: float) -> bool:
        """True when the number `v` satisfies `bounds` (always, without bounds)."""
        if not self.bounds:
            return True
        lo, lo_closed, hi, hi_closed = self._interval()
        ok_lo = lo is None or (v >= lo if lo_closed else v > lo)
        ok_hi = hi is None or (v <= hi if hi_closed else v < hi)
        return ok_lo and ok_hi

    def fix_text(self) -> str:
        """The "Fix:" text of a violation of this key."""
        if self.fix:
            return self.fix
        if self.choices:
            return "use " + _one_of(self.choices)
        if self.bounds:
            return f"use a value {_bounds_words(self.bounds)}, e.g. {self.default!r}"
        return f"use {_a(self.type_name)}, e.g. {self.default!r}"

    def problem_with(self, v: Any, as_object: bool = False) -> Optional[str]:
        """What is wrong with the value `v` of this key, or None when it is valid: its type, then
        `bounds` (numbers) or `choices` (strings). Values in `also` are valid. `as_object`: `v` is
        the dataclass form (None = off, the config's off value is then checked like any other);
        else the config form (the off value is valid)."""
        if v is None and (self.has_off or self.default is None):
            return None
        if self.has_off and not as_object and _same(v, self.off):
            return None
        template = "" if as_object else self.problem
        if any(_same(v, a) for a in self.also):
            return None
        want = self.value_type
        if want is bool:
            return None if isinstance(v, bool) else "must be True or False"
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{v!r} is not an integer"
        if want is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"{v!r} is not a number"
        if want is str and not isinstance(v, str):
            return f"{v!r} is not a string"
        if want is tuple:
            return self._tuple_problem(v)
        if want in (int, float):
            if (self.finite or self.bounds) and not math.isfinite(v):
                return template.format(v=v) if template else f"{v} is not finite"
            if not self.in_bounds(v):
                if template:
                    return template.format(v=v)
                words = f"is outside {self.bounds}" if self.bounds.lstrip()[:1] in "[(" else f"must be {self.bounds}"
                return f"{v!r} {words}"
        if self.choices and v not in self.choices:
            return f"unknown {self.noun} {v!r}"
        return None

    def _tuple_problem(self, v: Any) -> Optional[str]:
        if not isinstance(v, (tuple, list)):  # e.g. one string, which the key's own check may accept
            return None
        want = self.item_type
        if want is None:
            return None
        ok = (int, float) if want is float else (want,)
        bad = [x for x in v if not isinstance(x, ok) or (isinstance(x, bool) and want is not bool)]
        if bad:
            return f"{tuple(v)!r} holds {bad[0]!r}, which is not {_a(want.__name__)}"
        if self.bounds:  # the bounds of every item
            out = [x for x in v if not math.isfinite(x) or not self.in_bounds(x)]
            if out:
                return f"{tuple(v)!r} holds {out[0]!r}, which is not {_bounds_words(self.bounds)}"
        return None

    def to_object(self, v: Any) -> Any:
        """The value the objective's dataclass holds for the config value `v` (the off value -> None)."""
        if self.has_off and (v is None or _same(v, self.off)):
            return None
        want = self.value_type
        return want(v) if want in (bool, int, float, str, tuple) else v

    def dataclass_field(self) -> dataclasses.Field:
        """A `dataclasses.field` with this key's default (dataclass form) and the Field as metadata."""
        return dataclasses.field(default=self.to_object(self.default), metadata={"schema": self})


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and not isinstance(a, bool)
                                             and isinstance(b, (int, float)) and not isinstance(b, bool) and a == b)


def _a(noun: str) -> str:
    """`noun` with its indefinite article ("an int", "a str")."""
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _one_of(choices) -> str:
    names = [repr(c) for c in choices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _bounds_words(bounds: str) -> str:
    return f"in {bounds.strip()}" if bounds.lstrip()[:1] in "[(" else bounds.strip()


def section_fields(prefix: str, *fields: Field) -> tuple[Field, ...]:
    """`fields` declared with keys relative to `prefix` ("trainer.optimizer"), with full keys."""
    return tuple(dataclasses.replace(f, key=f"{prefix}.{f.key}" if prefix else f.key) for f in fields)


def schema_dataclass(fields, owner: str):
    """A class decorator: the frozen dataclass whose fields are the `fields` with `owner` (in their
    declaration order), each with that Field's default (dataclass form) and the Field as its
    metadata "schema"; `__post_init__` runs :func:`check_dataclass` before the class's own checks.

    Raises:
      TypeError: the class declares a field of its own (a second default would then be possible).
    """
    fields = [f for f in fields if f.owner == owner]

    def wrap(cls):
        if cls.__dict__.get("__annotations__"):
            raise TypeError(f"{cls.__name__} must not declare fields: they come from the config schema "
                            f"({sorted(cls.__dict__['__annotations__'])})")
        cls.__annotations__ = {f.attr: _annotation(f) for f in fields}
        for f in fields:
            setattr(cls, f.attr, f.dataclass_field())
        own = cls.__dict__.get("__post_init__")

        def __post_init__(self):
            check_dataclass(self)
            if own is not None:
                own(self)

        cls.__post_init__ = __post_init__
        return dataclasses.dataclass(frozen=True)(cls)

    return wrap


def _annotation(f: Field) -> str:
    name = f.type_name if not isinstance(f.default, tuple) else "tuple"
    return f"Optional[{name}]" if f.has_off else name


def check_dataclass(obj) -> None:
    """Checks every field of a `schema_dataclass` instance against its Field.

    Raises:
      ValueError: `Name.attr: problem (config key K). Fix: ...` for the first invalid field.
    """
    for fld in dataclasses.fields(obj):
        spec: Optional[Field] = fld.metadata.get("schema")
        if spec is None:
            continue
        problem = spec.problem_with(getattr(obj, fld.name), as_object=True)
        if problem:
            raise ValueError(f"{type(obj).__name__}.{fld.name}: {problem} (config key {spec.key}). "
                             f"Fix: {spec.fix_text()}")
