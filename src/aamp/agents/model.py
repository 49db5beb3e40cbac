"""The model client: one chat-completions call with tools, against the agent's model endpoint
(any OpenAI-compatible server: vLLM, llama.cpp server, Ollama), through the `openai` package.

Where it connects is the endpoint's, never the agent's: `EndpointAccess` carries the
endpoint's base URL, the transport whose every connection is resolved once, address-checked
and made to the checked address (`aamp.egress.registered.CheckedTransport`), and where each
call's API key comes from (the vault, audited per call). Redirects are not followed.

Transient failures (connection refused or reset, timeouts, 429, 5xx) are retried with
exponential backoff; when the retries are spent, or the server refuses the request itself
(400, 401, 404), `ModelError` says what happened in words the run's failure reason can carry.
A connection the transport refuses (an address the endpoint may not reach) is not retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from aamp.agents.definition import ModelConfig
from aamp.egress.registered import ConnectionRefused

RETRYABLE = (
    openai.APIConnectionError,  # includes APITimeoutError
    openai.RateLimitError,
    openai.InternalServerError,
)


class ModelError(Exception):
    """The model could not answer; the message is the run's failure reason."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    seconds: float
    attempts: int
    raw_message: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EndpointAccess:
    """How the client reaches the agent's model endpoint: its name (for messages), its base
    URL, the checked transport, and the API key source — called once per model call (None:
    the endpoint takes no key)."""

    name: str
    base_url: str
    transport: httpx.AsyncBaseTransport
    api_key: Callable[[], Awaitable[str]] | None = None


class ModelClient:
    def __init__(
        self, config: ModelConfig, endpoint: EndpointAccess, *, backoff_base: float = 0.5
    ) -> None:
        self.config = config
        self.endpoint = endpoint
        self.backoff_base = backoff_base
        self._where = f"the model endpoint {endpoint.name} ({endpoint.base_url})"
        self._http = httpx.AsyncClient(
            transport=endpoint.transport,
            follow_redirects=False,
            trust_env=False,
            timeout=float(config.timeout_seconds),
        )
        self._client = openai.AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key="no-key",  # the key, if any, is fetched and sent per call
            timeout=float(config.timeout_seconds),
            max_retries=0,  # retried here, with our backoff and our reasons
            http_client=self._http,
        )

    async def close(self) -> None:
        await self._client.close()
        await self._http.aclose()

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int | None
    ) -> ModelReply:
        cfg = self.config
        kwargs: dict[str, Any] = {"model": cfg.name, "messages": messages}
        if tools:
            kwargs["tools"] = tools
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if self.endpoint.api_key is not None:
            kwargs["extra_headers"] = {"Authorization": f"Bearer {await self.endpoint.api_key()}"}
        where = self._where
        attempts = 0
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                response = await self._client.chat.completions.create(**kwargs)
                break
            except RETRYABLE as exc:
                if isinstance(exc.__cause__, ConnectionRefused):
                    raise ModelError(f"the host refused to connect: {exc.__cause__}") from None
                if attempts > cfg.retries:
                    raise ModelError(
                        f"{where} failed {attempts} times; last: {_describe(exc)}"
                    ) from None
                await asyncio.sleep(self.backoff_base * 2 ** (attempts - 1))
            except openai.APIStatusError as exc:
                raise ModelError(f"{where} refused the request: {_describe(exc)}") from None
            except openai.OpenAIError as exc:
                raise ModelError(f"{where}: {exc}") from None
        seconds = time.monotonic() - started
        if not response.choices:
            raise ModelError(f"{where} returned no choices")
        choice = response.choices[0]
        msg = choice.message
        calls = tuple(
            ToolCall(c.id or f"call_{i}", c.function.name, c.function.arguments or "")
            for i, c in enumerate(msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        )
        usage = response.usage
        raw: dict[str, Any] = {"role": "assistant", "content": msg.content}
        if calls:
            raw["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        return ModelReply(
            content=msg.content,
            tool_calls=calls,
            prompt_tokens=int(usage.prompt_tokens) if usage else 0,
            completion_tokens=int(usage.completion_tokens) if usage else 0,
            finish_reason=choice.finish_reason,
            seconds=seconds,
            attempts=attempts,
            raw_message=raw,
        )


def _describe(exc: Exception) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {str(exc.message)[:300]}"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"could not connect ({cause or exc})"
    return str(exc)[:300]
