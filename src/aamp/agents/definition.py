"""An agent's definition: model, prompt, tools, policy, limits and browser settings, parsed
whole or not at all.

`parse_definition` takes the builder's YAML/JSON (or a dict from the API) and returns a frozen
`AgentDefinition`, or raises `DefinitionError` listing every problem with its field path
(`model.endpoint: ...`, `limits.max_steps: ...`). It is read the way policies are
(`aamp.policy.document`): unknown keys are errors — a typo must not silently drop a limit —
and so are duplicate keys. The model is named, never located: `model.endpoint` is a model
endpoint an admin registered and granted to the agent (its URL and API key secret are the
endpoint's), `model.name` one of the models it serves. A definition carrying `base_url` or
`api_key_secret` is refused, naming the field and what to do instead, since an agent that
could name a URL and a secret could send any secret anywhere. `endpoint_problems` checks the
model name against the endpoint's declared models. A definition may carry its `name`; the
agent's name is the agent's own, so that key is read and not kept.

Example::

    model: {endpoint: llm, name: qwen2.5-0.5b-instruct}
    system_prompt: You prepare the monthly finance report.
    tools: [python, files, browser, service:crm]
    policy: finance-reports
    limits: {max_steps: 20, wall_time: 10m, max_tokens: 200000}
    browser: {images: true, dialogs: ask}    # optional; see aamp.agents.browser_settings
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic.dataclasses import dataclass

from aamp.agents.browser_settings import BrowserBlock, BrowserSettings
from aamp.catalog.model_endpoints import ENDPOINT_NAME_RE, MODEL_NAME_RE
from aamp.policy import (
    DOCUMENT,
    NAME_RE,
    SERVICE_RE,
    distinct,
    load_yaml,
    parse_duration,
    parse_size,
    validate,
)

BUILTIN_TOOLS = ("shell", "python", "files", "browser", "documents")
MAX_PROMPT_CHARS = 64 * 1024
DEFAULT_PROMPT = "You are a careful assistant. Use the tools to do the task."
# Fields an agent used to carry, and what replaced them.
_MOVED_TO_ENDPOINTS = {
    "base_url": (
        "an agent does not carry a URL: an admin registers the model endpoint "
        "(`aamp model-endpoint put NAME --base-url URL`) and grants it to the agent "
        "(`aamp grant attach AGENT model-endpoint NAME`); name it as model.endpoint"
    ),
    "api_key_secret": (
        "an agent does not carry a secret: the model endpoint holds its API key secret "
        "(`aamp model-endpoint put NAME --base-url URL --api-key-secret SECRET`); name the "
        "endpoint as model.endpoint"
    ),
}


class DefinitionError(ValueError):
    """A definition that cannot be used; `problems` holds (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"{path}: {message}" if path else message for path, message in problems]
        super().__init__("invalid agent definition:\n  " + "\n  ".join(lines))


def _whole(lo: int, hi: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"expected a whole number from {lo} to {hi}, got {value!r}")
        return value

    return check


def _within(parse: Callable[[object], int], hi: int) -> Callable[[object], int]:
    """A duration or size as people write it, more than 0 and at most `hi`."""

    def check(value: object) -> int:
        parsed = int(parse(value))
        if not 0 < parsed <= hi:
            raise ValueError(f"must be more than 0 and at most {hi}, got {value!r}")
        return parsed

    return check


def _named(regex: Any, what: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        if not isinstance(value, str) or not regex.match(value):
            raise ValueError(f"required: {what}, got {value!r}")
        return value

    return check


def _temperature(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
        raise ValueError(f"expected a number from 0 to 2, got {value!r}")
    return float(value)


def _tool(item: object) -> str:
    if not isinstance(item, str):
        raise ValueError(f"expected a tool name, got {item!r}")
    if item.startswith("service:"):
        if not SERVICE_RE.match(item.split(":", 1)[1]):
            raise ValueError(f"{item!r} does not name a service")
    elif item.startswith("knowledge-base:"):
        if not NAME_RE.match(item.split(":", 1)[1]):
            raise ValueError(f"{item!r} does not name a knowledge base")
    elif item not in BUILTIN_TOOLS:
        raise ValueError(
            f"unknown tool {item!r}; use {', '.join(BUILTIN_TOOLS)}, service:NAME or "
            "knowledge-base:NAME"
        )
    return item


def _prompt(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"expected text of 1 to {MAX_PROMPT_CHARS} characters")
    return value


def _required_model(value: object) -> object:
    if value is None:
        raise ValueError("required: {endpoint, name}")
    return value


@dataclass(frozen=True, config=DOCUMENT)
class ModelConfig:
    endpoint: Annotated[
        str,
        BeforeValidator(
            _named(ENDPOINT_NAME_RE, "the name of a model endpoint granted to the agent")
        ),
    ] = Field(None, validate_default=True)
    name: Annotated[
        str, BeforeValidator(_named(MODEL_NAME_RE, "the model's name at the endpoint"))
    ] = Field(None, validate_default=True)
    temperature: Annotated[float | None, BeforeValidator(_temperature)] = None
    timeout_seconds: Annotated[int, BeforeValidator(_within(parse_duration, 3600))] = Field(
        120, alias="timeout"
    )
    retries: Annotated[int, BeforeValidator(_whole(0, 10))] = 3


@dataclass(frozen=True, config=DOCUMENT)
class Limits:
    max_steps: Annotated[int, BeforeValidator(_whole(1, 1000))] = 20
    wall_time_seconds: Annotated[int, BeforeValidator(_within(parse_duration, 86400))] = Field(
        600, alias="wall_time"
    )
    max_tokens: Annotated[int, BeforeValidator(_whole(1, 100_000_000))] = 200_000
    tool_timeout_seconds: Annotated[int, BeforeValidator(_within(parse_duration, 3600))] = Field(
        120, alias="tool_timeout"
    )
    approval_timeout_seconds: Annotated[
        int, BeforeValidator(_within(parse_duration, 7 * 86400))
    ] = Field(1800, alias="approval_timeout")
    observation_bytes: Annotated[int, BeforeValidator(_within(parse_size, 1_000_000))] = 8000


Tools = distinct(_tool, not_a_list="expected a non-empty list such as [shell, python, files]")


@dataclass(frozen=True, config=DOCUMENT)
class AgentDefinition:
    model: Annotated[ModelConfig, BeforeValidator(_required_model)] = Field(
        None, validate_default=True
    )
    policy: Annotated[
        str, BeforeValidator(_named(NAME_RE, "the name of a policy granted to the agent"))
    ] = Field(None, validate_default=True)
    system_prompt: Annotated[str, BeforeValidator(_prompt)] = DEFAULT_PROMPT
    tools: Tools = ("shell", "python", "files")
    limits: Limits = Field(default_factory=Limits)
    browser: BrowserBlock = Field(default_factory=BrowserSettings)

    @property
    def services(self) -> tuple[str, ...]:
        """The services named as tools (`service:NAME`)."""
        return tuple(t.split(":", 1)[1] for t in self.tools if t.startswith("service:"))

    @property
    def knowledge_bases(self) -> tuple[str, ...]:
        """The knowledge bases named as tools (`knowledge-base:NAME`): the `rag` tool searches
        them."""
        return tuple(t.split(":", 1)[1] for t in self.tools if t.startswith("knowledge-base:"))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tools"] = list(self.tools)
        return data


def _without_moved(data: object) -> tuple[object, list[tuple[str, str]]]:
    """`data` without what a definition may carry but is not kept (`name`, and the model
    fields that moved to model endpoints), and the refusals of the moved ones by name."""
    if not isinstance(data, dict):
        return data, []
    refused: list[tuple[str, str]] = []
    kept = {k: v for k, v in data.items() if k != "name"}
    model = kept.get("model")
    if isinstance(model, dict):
        refused = [(f"model.{k}", why) for k, why in _MOVED_TO_ENDPOINTS.items() if k in model]
        kept["model"] = {k: v for k, v in model.items() if k not in _MOVED_TO_ENDPOINTS}
    return kept, refused


def endpoint_problems(model: ModelConfig, served: tuple[str, ...] | None) -> list[tuple[str, str]]:
    """What is wrong with `model` against its endpoint: `served` is the endpoint's declared
    model names (empty: any), None when there is no endpoint by that name."""
    if served is None:
        return [
            (
                "model.endpoint",
                f"no model endpoint named {model.endpoint!r}; an admin registers it with "
                "`aamp model-endpoint put`",
            )
        ]
    if served and model.name not in served:
        return [
            (
                "model.name",
                f"model endpoint {model.endpoint!r} serves {', '.join(served)}; not {model.name!r}",
            )
        ]
    return []


def definition_from_dict(data: object) -> AgentDefinition:
    kept, refused = _without_moved(data)
    found = validate(AgentDefinition, kept)
    if isinstance(found, list) or refused:
        raise DefinitionError(refused + (found if isinstance(found, list) else []))
    return found


def parse_definition(text: str) -> AgentDefinition:
    """A definition from YAML or JSON text (JSON is YAML); a key given twice is refused."""
    try:
        data = load_yaml(text, "YAML/JSON")
    except ValueError as exc:
        raise DefinitionError([("", str(exc))]) from None
    return definition_from_dict(data)


def stored_form(definition: AgentDefinition) -> str:
    """The canonical JSON kept in `agent_versions.definition` (parses back to the same)."""
    d = definition.to_dict()
    out = {
        "model": {
            "endpoint": d["model"]["endpoint"],
            "name": d["model"]["name"],
            "timeout": d["model"]["timeout_seconds"],
            "retries": d["model"]["retries"],
        },
        "system_prompt": definition.system_prompt,
        "tools": list(definition.tools),
        "policy": definition.policy,
        "limits": {
            "max_steps": definition.limits.max_steps,
            "wall_time": definition.limits.wall_time_seconds,
            "max_tokens": definition.limits.max_tokens,
            "tool_timeout": definition.limits.tool_timeout_seconds,
            "approval_timeout": definition.limits.approval_timeout_seconds,
            "observation_bytes": definition.limits.observation_bytes,
        },
    }
    if definition.model.temperature is not None:
        out["model"]["temperature"] = definition.model.temperature
    if definition.browser.stored() is not None:
        out["browser"] = definition.browser.stored()
    return json.dumps(out, sort_keys=True)
