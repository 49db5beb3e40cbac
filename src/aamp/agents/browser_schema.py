"""The `browser` tool's JSON schema: what the model sees and what its calls are checked against
before anything reaches the sandbox (`aamp.agents.tools.ToolSet`)."""

from __future__ import annotations

from typing import Any

ACTIONS = (
    "open",
    "back",
    "snapshot",
    "click",
    "fill",
    "type",
    "press",
    "select",
    "check",
    "uncheck",
    "upload",
    "hover",
    "scroll",
    "wait_for",
    "dialog",
    "tabs",
    "switch_tab",
    "close_tab",
    "read",
    "download",
    "screenshot",
)
# Actions that address one element (ref, role+name or selector).
ELEMENT_ACTIONS = ("click", "fill", "select", "check", "uncheck", "upload", "hover")
NAVIGATIONS = ("open", "back", "download")

_TARGET = [{"required": ["ref"]}, {"required": ["role"]}, {"required": ["selector"]}]

DESCRIPTION = (
    "Operate a real web browser (one per sandbox; tabs, logins and cookies are kept across "
    "calls). Most actions answer with a snapshot of the page: its accessibility tree with "
    "roles, names, values, states, link targets and frames, each element with a ref such as "
    "e12 (f1e3 inside a frame); a ref is valid until the tab navigates. Address an element "
    "by exactly one of: ref (from the latest snapshot), role plus its exact name (e.g. role "
    "button, name 'Log in'), or a CSS selector; frame (a frame's ref or name) scopes role and "
    "selector. Nothing is matched loosely: no match, or several, is an error. Actions: open "
    "url, back, snapshot, click, fill (text fields), type (key by key), press (key such as "
    "Enter, Tab, Control+A, optionally on an element), select (options: values or labels of "
    "a drop-down), check, uncheck, upload (files: paths in /workspace), hover, scroll "
    "(an element into view, or direction and amount in pixels), wait_for (text, or an "
    "element; state visible or hidden), dialog (answer an open dialog: accept true/false, "
    "prompt_text), tabs, switch_tab, close_tab (tab such as t2), read (the page or one "
    "element as text; format rows gives tables as rows), download (click an element or open "
    "a url; saved as /workspace/downloads/NAME), screenshot (full_page, or one element). "
    "timeout (seconds) bounds waiting: default 5 for element actions, 30 for open, back and "
    "download. Dialogs, new tabs, downloads and requests the egress policy refused are "
    "reported after each action."
)

SCHEMA: dict[str, Any] = {
    "description": DESCRIPTION,
    "parameters": {
        "type": "object",
        "properties": {
            "action": {"enum": list(ACTIONS)},
            "url": {"type": "string", "pattern": "^https?://", "maxLength": 8192},
            "ref": {"type": "string", "pattern": "^(f[0-9]{1,6})?e[0-9]{1,7}$"},
            "role": {"type": "string", "pattern": "^[a-z]{2,40}$"},
            "name": {"type": "string", "maxLength": 1000},
            "selector": {"type": "string", "minLength": 1, "maxLength": 1000},
            "frame": {"type": "string", "minLength": 1, "maxLength": 200},
            "value": {"type": "string", "maxLength": 100_000},
            "text": {"type": "string", "minLength": 1, "maxLength": 10_000},
            "key": {"type": "string", "pattern": "^\\S{1,50}$"},
            "options": {
                "type": "array",
                "items": {"type": "string", "maxLength": 1000},
                "minItems": 1,
                "maxItems": 100,
            },
            "files": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "minItems": 1,
                "maxItems": 20,
            },
            "state": {"enum": ["visible", "hidden"]},
            "accept": {"type": "boolean"},
            "prompt_text": {"type": "string", "maxLength": 10_000},
            "dialog": {
                "enum": ["accept", "dismiss"],
                "description": "how to answer dialogs this call opens (else the agent's default)",
            },
            "tab": {"type": "string", "pattern": "^t[0-9]{1,6}$"},
            "format": {"enum": ["text", "rows"]},
            "full_page": {"type": "boolean"},
            "direction": {"enum": ["down", "up", "left", "right"]},
            "amount": {"type": "integer", "minimum": 1, "maximum": 100_000},
            "timeout": {"type": "number", "minimum": 0.1, "maximum": 3600},
        },
        "required": ["action"],
        "additionalProperties": False,
        "allOf": [
            *(
                {"if": {"properties": {"action": {"const": a}}}, "then": {"required": [f]}}
                for a, f in (
                    ("open", "url"),
                    ("fill", "value"),
                    ("type", "text"),
                    ("press", "key"),
                    ("select", "options"),
                    ("upload", "files"),
                    ("dialog", "accept"),
                    ("switch_tab", "tab"),
                )
            ),
            {
                "if": {"properties": {"action": {"enum": list(ELEMENT_ACTIONS)}}},
                "then": {"anyOf": _TARGET},
            },
            {
                "if": {"properties": {"action": {"const": "download"}}},
                "then": {"anyOf": [{"required": ["url"]}, *_TARGET]},
            },
            {
                "if": {"properties": {"action": {"const": "wait_for"}}},
                "then": {"anyOf": [{"required": ["text"]}, *_TARGET]},
            },
        ],
    },
}
