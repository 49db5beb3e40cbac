"""The model client: one chat-completions call with tools, against the agent's model endpoint
(any OpenAI-compatible server: vLLM, llama.cpp server, Ollama), through the `openai` package.

Where it connects is the endpoint's, never the agent's: `EndpointAccess` carries the
endpoint's base URL, the transport whose every connection is resolved once, address-checked
and made to the checked address (`aamp.egress.registered.CheckedTransport`), and where each
call's API key comes from (the vault, audited per call). Redirects are not followed.

Transient failures (connection refused or reset, timeouts, 408, 409, 429, 5xx) are retried by
the `openai` SDK's own mechanism, at most `model.retries` times: it waits what the server's
`Retry-After` asks when that is up to 60 s, else an exponential backoff from 0.5 s, capped at
8 s, with jitter — so a call makes at most `retries + 1` attempts of at most `model.timeout`
each, with at most 60 s between two. When the retries are spent, or the server refuses the
request itself (400, 401, 404), `ModelError` says what happened in words the run's failure
reason can carry. A connection the host refuses (an address the endpoint may not reach) is
final: it is never tried again (`_RefusalIsFinal`). An answer is read only up to
`MAX_ANSWER_BYTES` and within `model.timeout` of its head (`_BoundedAnswer`): a compromised
endpoint, or anyone on the path of a plain-http one, could otherwise fill the control plane's
memory with one answer, or hold a run with a trickle that never times out a read.

`openai` is imported by the functions that use it, not here: the server imports this module
at start-up (the run service), and the SDK's hundreds of modules were a third of a second of
every `aamp up` before it could answer a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from aamp.agents.definition import ModelConfig
from aamp.egress.registered import ConnectionRefused

TYPE_CHECKING = False
if TYPE_CHECKING:
    import openai

# What the SDK retries: connection failures (timeouts included; `_retried`) and these statuses.
RETRIED_STATUSES = (408, 409)
_REFUSAL = "aamp.refusal"  # the extension of the answer `_RefusalIsFinal` makes
# The most of one answer that is read: a chat completion of many thousand tokens with tool
# calls is well under a megabyte.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


def _retried() -> tuple[type[openai.APIError], ...]:
    import openai

    return (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)


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


class _RefusalIsFinal(httpx.AsyncBaseTransport):
    """The endpoint's checked transport, with a connection the host refuses answered — 403,
    `x-should-retry: false` (which the SDK obeys), the refusal in the answer's extensions —
    instead of raised: the SDK retries every exception, and each try would resolve the name
    anew. Nothing is sent anywhere; the answer never leaves this process."""

    def __init__(self, checked: httpx.AsyncBaseTransport) -> None:
        self.checked = checked

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.checked.handle_async_request(request)
        except ConnectionRefused as refusal:
            return httpx.Response(
                403,
                headers={"x-should-retry": "false"},
                json={"error": {"message": str(refusal)}},
                extensions={_REFUSAL: refusal},
                request=request,
            )

    async def aclose(self) -> None:
        await self.checked.aclose()


class AnswerRefused(Exception):
    """An answer too large or too slow to be read whole (`_BoundedAnswer`)."""


class _BoundedAnswer(httpx.AsyncByteStream):
    """An answer's body, refused past `limit` bytes or `seconds` after its head arrived."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int, seconds: float) -> None:
        self.inner, self.limit, self.seconds = inner, limit, seconds

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        deadline, seen = loop.time() + self.seconds, 0
        iterator = aiter(self.inner)
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise AnswerRefused(f"its answer took over {self.seconds:g} s to arrive") from None
            seen += len(chunk)
            if seen > self.limit:
                raise AnswerRefused(f"its answer is over {self.limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _BoundedAnswers(httpx.AsyncBaseTransport):
    """Every answer's body read through `_BoundedAnswer`."""

    def __init__(self, inner: httpx.AsyncBaseTransport, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _BoundedAnswer(response.stream, MAX_ANSWER_BYTES, self.seconds)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class ModelClient:
    def __init__(self, config: ModelConfig, endpoint: EndpointAccess) -> None:
        self.config = config
        self.endpoint = endpoint
        self._where = f"the model endpoint {endpoint.name} ({endpoint.base_url})"
        self._http = httpx.AsyncClient(
            transport=_BoundedAnswers(
                _RefusalIsFinal(endpoint.transport), float(config.timeout_seconds)
            ),
            follow_redirects=False,
            trust_env=False,
            timeout=float(config.timeout_seconds),
        )
        import openai

        self._client = openai.AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key="no-key",  # the key, if any, is fetched and sent per call
            timeout=float(config.timeout_seconds),
            max_retries=config.retries,
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
        import openai

        retried = _retried()
        try:
            raw = await self._client.chat.completions.with_raw_response.create(**kwargs)
            response = raw.parse()
        except openai.APIStatusError as exc:
            refusal = exc.response.extensions.get(_REFUSAL)
            if refusal is not None:
                raise ModelError(f"the host refused to connect: {refusal}") from None
            if isinstance(exc, retried) or exc.status_code in RETRIED_STATUSES:
                raise ModelError(_spent(where, exc)) from None
            raise ModelError(f"{where} refused the request: {_describe(exc)}") from None
        except retried as exc:
            if isinstance(exc.__cause__, AnswerRefused):
                raise ModelError(f"{where} was not read: {exc.__cause__}") from None
            raise ModelError(_spent(where, exc)) from None
        except AnswerRefused as exc:
            raise ModelError(f"{where} was not read: {exc}") from None
        except openai.OpenAIError as exc:
            raise ModelError(f"{where}: {exc}") from None
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
        answer = assistant_message(msg.content, calls)
        return ModelReply(
            content=msg.content,
            tool_calls=calls,
            prompt_tokens=int(usage.prompt_tokens) if usage else 0,
            completion_tokens=int(usage.completion_tokens) if usage else 0,
            finish_reason=choice.finish_reason,
            seconds=raw.elapsed.total_seconds(),  # the attempt that answered
            attempts=raw.retries_taken + 1,
            raw_message=answer,
        )


def assistant_message(content: str | None, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """A reply as the conversation keeps it (and as a run taken over rebuilds it)."""
    answer: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        answer["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return answer


def _attempts(exc: openai.APIError) -> int:
    """How many attempts the SDK made, the last one's included (it numbers its retries)."""
    taken = exc.request.headers.get("x-stainless-retry-count", "0")
    return int(taken) + 1 if taken.isdigit() else 1


def _spent(where: str, exc: openai.APIError) -> str:
    return f"{where} failed {_attempts(exc)} times; last: {_describe(exc)}"


def _describe(exc: Exception) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {str(exc.message)[:300]}"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"could not connect ({cause or exc})"
    return str(exc)[:300]
