"""The tools an agent can call: their JSON schemas (what the model sees), argument checking
against those schemas before anything runs, and truncating results to a budget.

A tool call whose arguments are not JSON, or do not match the schema, never reaches the
sandbox: `check_call` returns the problem, and the loop hands it back to the model as an error
observation so it can correct itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema_rs

from aamp.agents.browser_schema import SCHEMA as BROWSER_SCHEMA
from aamp.agents.documents_schema import SCHEMA as DOCUMENTS_SCHEMA
from aamp.agents.rag_tool import schema as rag_schema

SERVICE_PREFIX = "service_"

_TIMEOUT = {"type": "integer", "minimum": 1, "maximum": 3600, "description": "seconds"}

SCHEMAS: dict[str, dict[str, Any]] = {
    "shell": {
        "description": "Run a shell command (sh -c) in the sandbox's /workspace. Returns the "
        "exit code, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1, "maxLength": 100_000},
                "timeout": _TIMEOUT,
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    "python": {
        "description": "Run Python 3 code in the sandbox's /workspace; print what you need "
        "to see. Input files are in /workspace/in; write results to /workspace/out.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "minLength": 1, "maxLength": 1_000_000},
                "timeout": _TIMEOUT,
            },
            "required": ["code"],
            "additionalProperties": False,
        },
    },
    "files": {
        "description": "List, read or write files inside /workspace (paths are relative to it).",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"enum": ["list", "read", "write"]},
                "path": {"type": "string", "minLength": 1, "maxLength": 4096},
                "content": {"type": "string", "maxLength": 10_000_000},
            },
            "required": ["action", "path"],
            "additionalProperties": False,
            "if": {"properties": {"action": {"const": "write"}}},
            "then": {"required": ["content"]},
        },
    },
    "browser": BROWSER_SCHEMA,
    "documents": DOCUMENTS_SCHEMA,
}


def service_schema(name: str, upstream: str) -> dict[str, Any]:
    """A granted service as a tool: an HTTP request to its upstream, credentials added
    host-side by the egress proxy (the agent never sees them)."""
    return {
        "description": f"Call the {name} service ({upstream}); authentication is added for you.",
        "parameters": {
            "type": "object",
            "properties": {
                "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                "path": {"type": "string", "pattern": "^/", "maxLength": 8192},
                "body": {"type": "string", "maxLength": 10_000_000},
                "headers": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "maxLength": 8192},
                    "maxProperties": 32,
                },
            },
            "required": ["method", "path"],
            "additionalProperties": False,
        },
    }


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolSet:
    """The tools of one run, with a compiled validator per tool."""

    def __init__(self, specs: list[ToolSpec]) -> None:
        self.specs = {s.name: s for s in specs}
        self._validators = {s.name: jsonschema_rs.validator_for(s.parameters) for s in specs}

    @classmethod
    def build(cls, tools: tuple[str, ...], services: dict[str, str]) -> ToolSet:
        """`tools` from the definition; `services` maps each granted service to its upstream."""
        specs = []
        knowledge_bases = tuple(
            t.split(":", 1)[1] for t in tools if t.startswith("knowledge-base:")
        )
        if knowledge_bases:  # one `rag` tool for all of them
            specs.append(ToolSpec("rag", **rag_schema(knowledge_bases)))
        for tool in tools:
            if tool.startswith("knowledge-base:"):
                continue
            if tool.startswith("service:"):
                name = tool.split(":", 1)[1]
                schema = service_schema(name, services[name])
                specs.append(ToolSpec(SERVICE_PREFIX + name.replace("-", "_"), **schema))
            else:
                specs.append(ToolSpec(tool, **SCHEMAS[tool]))
        return cls(specs)

    def openai(self) -> list[dict[str, Any]]:
        return [s.openai() for s in self.specs.values()]

    def check_call(self, name: str, raw_arguments: str) -> tuple[dict[str, Any] | None, str | None]:
        """(arguments, None) when the call may run, else (None, the problem in words)."""
        if name not in self.specs:
            return None, f"there is no tool {name!r}; the tools are {', '.join(self.specs)}"
        try:
            args = json.loads(raw_arguments or "{}")
        except ValueError as exc:
            return None, f"the arguments of {name} are not valid JSON: {exc}"
        if not isinstance(args, dict):
            return None, f"the arguments of {name} must be a JSON object"
        problems = []
        for error in self._validators[name].iter_errors(args):
            where = "/".join(str(p) for p in error.instance_path) or "(arguments)"
            problems.append(f"{where}: {error.message}")
        if problems:
            return None, f"invalid arguments for {name}: " + "; ".join(problems[:10])
        return args, None


def truncate(text: str, budget: int) -> str:
    """At most `budget` bytes of `text` (UTF-8), head and tail kept, with a note saying how
    much was left out, so the model knows it did not see everything."""
    data = text.encode("utf-8")
    if len(data) <= budget:
        return text
    head = budget * 2 // 3
    tail = budget - head
    kept = (
        data[:head].decode("utf-8", "ignore")
        + f"\n[... {len(data) - budget} bytes truncated by aamp; {len(data)} bytes in all ...]\n"
        + data[len(data) - tail :].decode("utf-8", "ignore")
    )
    return kept
