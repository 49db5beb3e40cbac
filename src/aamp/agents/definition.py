"""An agent's definition: model, prompt, tools, policy and limits, parsed whole or not at all.

`parse_definition` takes the builder's YAML/JSON (or a dict from the API) and returns a frozen
`AgentDefinition`, or raises `DefinitionError` listing every problem with its field path
(`model.endpoint: ...`, `limits.max_steps: ...`). Unknown keys are errors, as in policies: a
typo must not silently drop a limit. The model is named, never located: `model.endpoint` is a
model endpoint an admin registered and granted to the agent (its URL and API key secret are
the endpoint's), `model.name` one of the models it serves. A definition carrying `base_url` or
`api_key_secret` is refused, naming the field and what to do instead, since an agent that
could name a URL and a secret could send any secret anywhere. `endpoint_problems` checks the
model name against the endpoint's declared models.

Example::

    model: {endpoint: llm, name: qwen2.5-0.5b-instruct}
    system_prompt: You prepare the monthly finance report.
    tools: [python, files, browser, service:crm]
    policy: finance-reports
    limits: {max_steps: 20, wall_time: 10m, max_tokens: 200000}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from aamp.catalog.model_endpoints import ENDPOINT_NAME_RE, MODEL_NAME_RE
from aamp.policy.model import NAME_RE, SERVICE_RE
from aamp.policy.units import parse_duration, parse_size

BUILTIN_TOOLS = ("shell", "python", "files", "browser")
MAX_PROMPT_CHARS = 64 * 1024
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


@dataclass(frozen=True)
class ModelConfig:
    endpoint: str
    name: str
    temperature: float | None = None
    timeout_seconds: int = 120
    retries: int = 3


@dataclass(frozen=True)
class Limits:
    max_steps: int = 20
    wall_time_seconds: int = 600
    max_tokens: int = 200_000
    tool_timeout_seconds: int = 120
    approval_timeout_seconds: int = 1800
    observation_bytes: int = 8000


@dataclass(frozen=True)
class AgentDefinition:
    model: ModelConfig
    policy: str
    system_prompt: str = "You are a careful assistant. Use the tools to do the task."
    tools: tuple[str, ...] = ("shell", "python", "files")
    limits: Limits = field(default_factory=Limits)

    @property
    def services(self) -> tuple[str, ...]:
        """The services named as tools (`service:NAME`)."""
        return tuple(t.split(":", 1)[1] for t in self.tools if t.startswith("service:"))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tools"] = list(self.tools)
        return data


class _Reader:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append((path, message))

    def mapping(self, value: object, path: str, keys: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in keys:
                self.fail(f"{path}.{key}" if path else str(key), f"unknown field; use {keys}")
        return value

    def integer(
        self, m: dict[str, Any], key: str, path: str, default: int, lo: int, hi: int
    ) -> int:
        if key not in m:
            return default
        value = m[key]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(f"{path}.{key}", f"expected a whole number from {lo} to {hi}, got {value!r}")
            return default
        return value

    def converted(
        self, m: dict[str, Any], key: str, path: str, fn: Any, default: int, hi: int
    ) -> int:
        if key not in m:
            return default
        try:
            value = int(fn(m[key]))
        except ValueError as exc:
            self.fail(f"{path}.{key}", str(exc))
            return default
        if not 0 < value <= hi:
            self.fail(f"{path}.{key}", f"must be more than 0 and at most {hi}, got {m[key]!r}")
            return default
        return value


def _parse_model(r: _Reader, raw: object) -> ModelConfig:
    keys = ("endpoint", "name", "temperature", "timeout", "retries")
    if isinstance(raw, dict):
        raw = _without_moved(r, raw)
    m = r.mapping(raw, "model", keys)
    endpoint = m.get("endpoint")
    if not isinstance(endpoint, str) or not ENDPOINT_NAME_RE.match(endpoint):
        r.fail(
            "model.endpoint",
            f"required: the name of a model endpoint granted to the agent, got {endpoint!r}",
        )
        endpoint = ""
    name = m.get("name")
    if not isinstance(name, str) or not MODEL_NAME_RE.match(name):
        r.fail("model.name", f"required: the model's name at the endpoint, got {name!r}")
        name = ""
    temperature = m.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature <= 2
    ):
        r.fail("model.temperature", f"expected a number from 0 to 2, got {temperature!r}")
        temperature = None
    timeout = r.converted(m, "timeout", "model", parse_duration, 120, 3600)
    retries = r.integer(m, "retries", "model", 3, 0, 10)
    return ModelConfig(
        endpoint,
        name,
        float(temperature) if temperature is not None else None,
        timeout,
        retries,
    )


def _without_moved(r: _Reader, model: dict[str, Any]) -> dict[str, Any]:
    """`model` without the fields that moved to model endpoints, each refused by name."""
    for key, why in _MOVED_TO_ENDPOINTS.items():
        if key in model:
            r.fail(f"model.{key}", why)
    return {k: v for k, v in model.items() if k not in _MOVED_TO_ENDPOINTS}


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


def _parse_tools(r: _Reader, raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        r.fail("tools", "expected a non-empty list such as [shell, python, files]")
        return ()
    tools: list[str] = []
    for i, item in enumerate(raw):
        path = f"tools[{i}]"
        if not isinstance(item, str):
            r.fail(path, f"expected a tool name, got {item!r}")
        elif item.startswith("service:"):
            if not SERVICE_RE.match(item.split(":", 1)[1]):
                r.fail(path, f"{item!r} does not name a service")
            else:
                tools.append(item)
        elif item not in BUILTIN_TOOLS:
            r.fail(path, f"unknown tool {item!r}; use {', '.join(BUILTIN_TOOLS)} or service:NAME")
        else:
            tools.append(item)
        if isinstance(item, str) and tools.count(item) > 1:
            r.fail(path, f"{item!r} is listed twice")
    return tuple(tools)


def _parse_limits(r: _Reader, raw: object) -> Limits:
    keys = (
        "max_steps",
        "wall_time",
        "max_tokens",
        "tool_timeout",
        "approval_timeout",
        "observation_bytes",
    )
    m = r.mapping(raw, "limits", keys)
    d = Limits()
    return Limits(
        max_steps=r.integer(m, "max_steps", "limits", d.max_steps, 1, 1000),
        wall_time_seconds=r.converted(
            m, "wall_time", "limits", parse_duration, d.wall_time_seconds, 86400
        ),
        max_tokens=r.integer(m, "max_tokens", "limits", d.max_tokens, 1, 100_000_000),
        tool_timeout_seconds=r.converted(
            m, "tool_timeout", "limits", parse_duration, d.tool_timeout_seconds, 3600
        ),
        approval_timeout_seconds=r.converted(
            m, "approval_timeout", "limits", parse_duration, d.approval_timeout_seconds, 7 * 86400
        ),
        observation_bytes=r.converted(
            m, "observation_bytes", "limits", parse_size, d.observation_bytes, 1_000_000
        ),
    )


def definition_from_dict(data: object) -> AgentDefinition:
    r = _Reader()
    keys = ("name", "model", "system_prompt", "tools", "policy", "limits")
    m = r.mapping(data, "", keys)
    if "model" not in m:
        r.fail("model", "required: {endpoint, name}")
    model = _parse_model(r, m.get("model", {})) if "model" in m else ModelConfig("", "")
    prompt = m.get("system_prompt", AgentDefinition.system_prompt)
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        r.fail("system_prompt", f"expected text of 1 to {MAX_PROMPT_CHARS} characters")
        prompt = ""
    tools = _parse_tools(r, m["tools"]) if "tools" in m else AgentDefinition.tools
    policy = m.get("policy")
    if not isinstance(policy, str) or not NAME_RE.match(policy):
        r.fail("policy", f"required: the name of a policy granted to the agent, got {policy!r}")
        policy = ""
    limits = _parse_limits(r, m.get("limits", {}))
    if r.problems:
        raise DefinitionError(r.problems)
    return AgentDefinition(model, policy, prompt, tools, limits)


def parse_definition(text: str) -> AgentDefinition:
    """A definition from YAML or JSON text (JSON is YAML)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DefinitionError([("", f"not valid YAML/JSON: {exc}")]) from None
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
    return json.dumps(out, sort_keys=True)
