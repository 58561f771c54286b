"""The types of the config keys (:class:`raydg.config.RunConfig`'s annotations) and how a
value one of them refuses is said: in one line that names the key, what it takes, and the value.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from raydg.errors import RaydgError, quoted
from raydg.seeding import MAX_SEED

# The types of the config keys: what every value is checked against, strictly (no true for a
# number, no 1.5 for an integer, no NaN), wherever it comes from (YAML, --set, --grid, Python).
Count = Annotated[int, Field(gt=0)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, description="integers from 0 to 2**63 - 1, which "
                            "numpy, torch and MLflow's tables all take")]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Text = Annotated[str, Field(strict=False)]  # a number is its text: ``experiment: 2024``
LrSchedule = Literal["constant", "cosine"]  # cosine: annealed over the rounds
Optimizer = Literal["sgd", "adam"]
Placement = Literal["pack", "spread"]
TrainTransform = Literal["none", "flip", "flip-jitter", "crop-flip", "domainbed"]
ValidateClients = Annotated[str, Field(strict=False, pattern=r"^(all|sampled|[1-9][0-9]*)$",
                                       description="all, sampled or a positive number of clients")]
STRICT = ConfigDict(strict=True, allow_inf_nan=False, coerce_numbers_to_str=True)


@functools.cache
def adapter(kind: Any) -> TypeAdapter:
    """The strict (:data:`STRICT`) validator of type ``kind``, made once."""
    return TypeAdapter(kind, config=STRICT)


def checked(where: str, kind: Any, value: Any, what: str = "config key") -> Any:
    """``value`` checked against the type ``kind``, refused as :func:`refusal` says
    (``where``: the key, ``what`` it is)."""
    try:
        return adapter(kind).validate_python(value)
    except ValidationError as err:
        raise refusal(where, adapter(kind).json_schema(), err, what) from None


def refusal(key: str, spec: dict[str, Any], err: ValidationError, what: str = "config key"
            ) -> RaydgError:
    """The error for config key ``key`` (JSON Schema ``spec``; ``what`` it is, if not a config
    key) that pydantic refused: the first place it names (``seeds[0]``,
    ``method_options.csac``), what that place takes, the value."""
    first = err.errors()[0]
    where = key
    for part in first["loc"]:
        if isinstance(part, int) or part.isdigit():  # an item of a list
            where, spec = f"{where}[{part}]", spec.get("items", spec)
        elif part != "[key]":  # a value of a mapping
            where, spec = f"{where}.{part}", spec.get("additionalProperties", spec)
    value = first["input"]
    shown = json.dumps(value) if value is None or isinstance(value, bool) else quoted(value)
    return RaydgError(f"{what} {quoted(where)} must be {expected(spec)}, not {shown}")


def expected(spec: dict[str, Any], many: bool = False) -> str:
    """``an integer > 0 or null``: what a JSON Schema of one value allows, in words
    (``many``: of several, ``integers > 0``)."""
    if "anyOf" in spec:
        return " or ".join(expected(s, many) for s in spec["anyOf"])
    if "description" in spec:
        return spec["description"]
    if "enum" in spec or "const" in spec:
        return "one of " + ", ".join(map(str, spec.get("enum", [spec.get("const")])))
    if spec.get("type") == "array":
        size = "a non-empty list" if spec.get("minItems") else "a list"
        return f"{size} of {expected(spec.get('items', {}), many=True)}"
    words = {"integer": "integer", "number": "finite number", "string": "string",
             "object": "mapping"}
    kind = spec.get("type", "")
    if kind in words:
        text = f"{words[kind]}s" if many else f"{'an' if kind == 'integer' else 'a'} {words[kind]}"
    else:
        text = {"boolean": "true or false", "null": "null"}.get(kind, "any value")
    bounds = [f"{op} {spec[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                               ("maximum", "<="), ("exclusiveMaximum", "<"))
              if k in spec]
    return " ".join([text, " and ".join(bounds)]).strip()
