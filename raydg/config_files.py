"""Config documents: the bounded YAML loader that reads every config file, ``--set`` and
``--grid`` value, and the config files themselves (ready-made ones by name, ``extends``).

Plain data and parsing, as :mod:`raydg.config`: no dataset, model or method is imported.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from raydg.errors import RaydgError, cut, quoted
from raydg.seeding import MAX_SEED

MAX_YAML_BYTES = 2**20  # a config document: a file or a --set value
MAX_YAML_VALUES = 100_000  # the values of a document, each alias counted as what it repeats
MAX_YAML_DEPTH = 50  # lists and mappings within each other


class _Refused(yaml.YAMLError):
    """A document beyond :class:`BoundedLoader`'s limits."""


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data: no tag constructs an object) that refuses, while it
    composes, a document nesting deeper than ``MAX_YAML_DEPTH`` or holding more than
    ``MAX_YAML_VALUES`` values once its aliases are expanded: the "billion laughs" shape, a
    few hundred bytes of aliases of aliases, is refused before anything expands it."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self.sizes: dict[yaml.Node, int] = {}  # values under each composed node, expanded
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = super().compose_node(parent, index)
            if node not in self.sizes:
                raise _Refused(f"alias *{cut(anchor)} refers to a value that holds it")
            return node
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            raise _Refused(f"nests lists and mappings deeper than the limit of {MAX_YAML_DEPTH} "
                           "levels")
        node = super().compose_node(parent, index)
        self.depth -= 1
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for pair in node.value for n in pair]
                    if isinstance(node, yaml.MappingNode) else [])
        self.sizes[node] = 1 + sum(self.sizes[child] for child in children)
        if self.sizes[node] > MAX_YAML_VALUES:
            raise _Refused(f"holds more than the limit of {MAX_YAML_VALUES:,} values once its "
                           "aliases are expanded")
        return node


def _reason(err: yaml.YAMLError) -> str:
    """What is wrong with a YAML document, in one short line."""
    mark = getattr(err, "problem_mark", None)
    if isinstance(err, yaml.MarkedYAMLError) and mark is not None:
        what = ", ".join(filter(None, (err.context, err.problem)))
        return f"{cut(what, 120)} (line {mark.line + 1}, column {mark.column + 1})"
    return cut(str(err).split("\n")[0], 120)


def load_text(text: str | bytes, where: str) -> Any:
    """The YAML document ``text`` (a config file's bytes, a ``--set`` or ``--grid`` value)
    as plain data, within the limits of :class:`BoundedLoader` and ``MAX_YAML_BYTES``;
    ``where`` names it in errors."""
    if len(text) > MAX_YAML_BYTES:
        raise RaydgError(f"{where} is refused: it is larger than the limit of "
                         f"{MAX_YAML_BYTES // 2**20} MiB for a config document")
    try:
        loader = BoundedLoader(text)  # reads the first bytes: an encoding error is raised here
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _Refused as err:
        raise RaydgError(f"{where} is refused: its YAML {err}") from None
    except yaml.YAMLError as err:
        raise RaydgError(f"{where} is not valid YAML: {_reason(err)}") from None


def configs_dir() -> Path:
    """The ready-made configs (and ``sweeps/``): the copy an installed wheel carries
    (``raydg/configs``), else the checkout's ``configs/``."""
    packaged = Path(__file__).resolve().parent / "configs"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "configs"


def ready_made() -> dict[str, Path]:
    """The ready-made configs by name: ``csac-rotmnist``, ``sweeps/fedprox-digits-style``."""
    root = configs_dir()
    return {str(p.relative_to(root).with_suffix("")): p
            for p in sorted([*root.glob("*.yaml"), *root.glob("sweeps/*.yaml")])}


def config_file(path: str | Path) -> Path:
    """``path`` if it is a file, else the ready-made config it names (``csac-rotmnist``, with
    or without ``.yaml``, ``configs/`` or ``sweeps/``)."""
    p = Path(path)
    if p.is_file():
        return p
    name = str(path).removesuffix(".yaml").removeprefix("configs/")
    known = ready_made()
    found = known.get(name) or known.get(f"sweeps/{name}")
    if found is None:
        close = difflib.get_close_matches(name, list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else " (raydg list configs)"
        raise RaydgError(f"config file {quoted(str(path))} does not exist, nor is it the name of "
                         f"a ready-made config{hint}")
    return found


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's keys (a file, or a ready-made config by name: :func:`config_file`).
    ``extends: OTHER.yaml`` (relative to the file) loads that file first; this file's keys
    override its keys, and ``options`` are merged key by key."""
    p = config_file(path) if not _seen else Path(path)
    if not p.is_file():
        raise RaydgError(f"config file {str(p)!r} does not exist")
    if p.resolve() in _seen:
        raise RaydgError(f"config file {str(p)!r} extends itself")
    with p.open("rb") as f:  # no more than the limit, however large the file
        data = load_text(f.read(MAX_YAML_BYTES + 1), f"config file {str(p)!r}") or {}
    if not isinstance(data, dict):
        raise RaydgError(f"config file {str(p)!r} must hold a mapping of config keys")
    if "extends" not in data:
        return data
    base = load_yaml(p.parent / str(data.pop("extends")), (*_seen, p.resolve()))
    merged = {**base, **data}
    if "options" in base and "options" in data:
        merged["options"] = {**base["options"], **data["options"]}
    if "method_options" in base and "method_options" in data:
        methods = {**base["method_options"], **data["method_options"]}
        merged["method_options"] = {m: {**base["method_options"].get(m, {}), **o}
                                    for m, o in methods.items()}
    return merged


FILE_SCHEMA = {  # the sections' and ``extends``'s JSON Schema (:func:`raydg.config.schema`)
    "extends": {"type": "string", "description": "a config file to start from, relative to "
                                                "this one"},
    "grid": {"type": "object", "additionalProperties": {"type": "array", "minItems": 1},
             "description": "every combination of these keys' values (a sweep)"},
    "random": {"type": "object", "additionalProperties": False, "required": ["samples", "space"],
               "properties": {"samples": {"type": "integer", "exclusiveMinimum": 0},
                              "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
                              "space": {"type": "object"}},
               "description": "random draws: {samples, seed, space: {key: {distribution: "
                              "[args]}}}"},
    "paper": {"type": "object", "description": "the published numbers that raydg report "
                                               "--paper prints beside the measured"},
}
