"""The text of a document a person wrote, read into plain data: YAML or JSON.

A mapping that repeats a key is refused, where PyYAML would keep the last one: a repeated
`deny:` in a policy, or `limits:` in an agent file, must not silently replace the first.
PyYAML only, so a client can read a file this way cheaply before sending it.
"""

from __future__ import annotations

import json

import yaml


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, what: str = "YAML") -> object:
    """The data of a YAML (or JSON) document; `ValueError` ("not valid YAML: ...", `what`
    naming what was expected) if it is not valid YAML or repeats a key of one mapping."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid {what}: {exc}") from None


def _refuse_repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    data: dict[str, object] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"not valid JSON: duplicate key {key!r}")
        data[key] = value
    return data


def load_json(text: str) -> object:
    """The data of a JSON document; `ValueError` ("not valid JSON: ...") if it is not valid
    JSON or repeats a key of one object, as `load_yaml` refuses."""
    try:
        return json.loads(text, object_pairs_hook=_refuse_repeated_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
