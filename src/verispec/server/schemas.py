"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions``, validated.

Types are strict (``"1"`` is not an integer, ``true`` is not a number) and unknown fields
are refused: an option this server does not implement is a 400 naming it, never silently
ignored. Options OpenAI defines but this server does not implement are accepted only at
their neutral value (``n: 1``, ``logprobs: null``, ``echo: false``, penalties 0, ...).

:func:`parse_completion` and :func:`parse_chat` return a :class:`Generation`: the prompt
(text, token ids, or chat messages) and the decoding parameters, or raise
:class:`~verispec.server.errors.APIError` (400) naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from verispec.server.errors import APIError

__all__ = ["ChatBody", "CompletionBody", "Generation", "Speculative", "parse_body",
           "parse_chat", "parse_completion"]

SEED_MAX = (1 << 63) - 1
STRICT = ConfigDict(strict=True, extra="forbid")


class Speculative(BaseModel):
    """The ``speculative`` extension object: which speculation decodes this request."""

    model_config = STRICT
    method: str | None = Field(default=None, min_length=1, max_length=200)
    gamma: Any = None  # int >= 0 or "auto"
    drafter: Literal["model", "ngram"] | None = None

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, value: Any) -> int | str | None:
        if value is None or value == "auto":
            return value  # type: ignore[no-any-return]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError("must be an integer >= 0 or \"auto\"")
        if not 0 <= value <= 64:
            raise ValueError(f"must lie in [0, 64], got {value}")
        return value


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = None


class _Common(BaseModel):
    """Fields both endpoints take."""

    model_config = STRICT
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)  # an extension (as vLLM)
    ignore_eos: bool | None = None  # an extension (as vLLM): decode to the budget
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    stop: Any = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    user: str | None = None  # an end-user id for the caller's records; no effect on output
    speculative: Speculative | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> list[str]:
        if value is None:
            return []
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise ValueError("must be a string or a list of strings")
        if any(not s for s in items):
            raise ValueError("stop strings must not be empty")
        return list(items)


class CompletionBody(_Common):
    """``POST /v1/completions``."""

    prompt: Any
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            value = value[0]  # a batch of one prompt
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in value):
            return list(value)
        if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
            raise ValueError("one prompt per request: a list of several prompts is not supported")
        raise ValueError("must be a string or a list of token ids")


class Message(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Any
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                and set(p) <= {"type", "text"} for p in value):
            return "".join(p["text"] for p in value)
        raise ValueError("must be a string or a list of {\"type\": \"text\", "
                         "\"text\": ...} parts (text only)")


class ChatBody(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


@dataclass
class Generation:
    """A validated request: what to condition on and how to decode.

    Attributes:
        prompt: text or token ids (completions), or None for chat.
        messages: the chat messages as ``{"role", "content"}`` dicts (chat only).
    """

    model: str
    prompt: str | list[int] | None
    messages: list[dict[str, str]] | None
    max_tokens: int | None
    temperature: float
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    speculative: Speculative = field(default_factory=Speculative)
    ignore_eos: bool = False


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or a 400."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got "
                            f"{type(body).__name__}", code="invalid_json")
    return body


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validate(model: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _param(tuple(err["loc"]))
        kind = err["type"]
        if kind == "extra_forbidden":
            raise APIError(400, f"unrecognized request argument supplied: {param}", param=param,
                           code="unrecognized_argument") from None
        if kind == "missing":
            raise APIError(400, f"missing required parameter: {param}", param=param,
                           code="missing_required_parameter") from None
        message = str(err["msg"]).removeprefix("Value error, ")
        raise APIError(400, f"{param}: {message}", param=param,
                       code="invalid_type" if kind.endswith("_type") else "invalid_value") from None


def _refuse(param: str, what: str) -> APIError:
    return APIError(400, f"{param}: {what} is not supported by this server", param=param,
                    code="unsupported_parameter")


def _check_common(body: _Common) -> None:
    if body.n not in (None, 1):
        raise _refuse("n", "n > 1 (several choices per request)")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0):
            raise _refuse(name, "a non-zero penalty")
    if body.logit_bias:
        raise _refuse("logit_bias", "logit_bias")


def _generation(body: _Common, prompt: str | list[int] | None,
                messages: list[dict[str, str]] | None, max_tokens: int | None) -> Generation:
    stream = bool(body.stream)
    if body.stream_options is not None and not stream:
        raise APIError(400, "stream_options: only allowed with stream: true",
                       param="stream_options", code="invalid_value")
    include = bool(body.stream_options and body.stream_options.include_usage)
    return Generation(
        model=body.model, prompt=prompt, messages=messages, max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature, top_p=body.top_p,
        top_k=body.top_k, seed=body.seed, stop=body.stop or [], stream=stream,
        include_usage=include, speculative=body.speculative or Speculative(),
        ignore_eos=bool(body.ignore_eos))


def parse_completion(raw: dict[str, Any]) -> Generation:
    """Validate a ``/v1/completions`` body."""
    body: CompletionBody = _validate(CompletionBody, raw)
    _check_common(body)
    if body.logprobs is not None:
        raise _refuse("logprobs", "logprobs")
    if body.echo:
        raise _refuse("echo", "echo")
    if body.suffix:
        raise _refuse("suffix", "suffix (insertion)")
    if body.best_of not in (None, 1):
        raise _refuse("best_of", "best_of > 1")
    return _generation(body, body.prompt, None, body.max_tokens)


def parse_chat(raw: dict[str, Any]) -> Generation:
    """Validate a ``/v1/chat/completions`` body."""
    body: ChatBody = _validate(ChatBody, raw)
    _check_common(body)
    if body.logprobs or body.top_logprobs:
        raise _refuse("logprobs" if body.logprobs else "top_logprobs", "logprobs")
    for name in ("tools", "functions"):
        if getattr(body, name):
            raise _refuse(name, "tool and function calling")
    for name in ("tool_choice", "function_call"):
        if getattr(body, name) not in (None, "none"):
            raise _refuse(name, "tool and function calling")
    if body.response_format not in (None, {"type": "text"}):
        raise _refuse("response_format", "a response format other than text")
    if body.modalities not in (None, ["text"]):
        raise _refuse("modalities", "output other than text")
    if body.store:
        raise _refuse("store", "storing completions")
    if (body.max_tokens is not None and body.max_completion_tokens is not None
            and body.max_tokens != body.max_completion_tokens):
        raise APIError(400, "max_tokens and max_completion_tokens disagree; give one",
                       param="max_completion_tokens", code="invalid_value")
    budget = body.max_completion_tokens if body.max_completion_tokens is not None \
        else body.max_tokens
    messages = [{"role": m.role, "content": m.content} for m in body.messages]
    return _generation(body, None, messages, budget)
