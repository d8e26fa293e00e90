"""verispec.bench: ``verispec demo``, ``verispec bench`` and the energy meter.

The harness is split by concern: :mod:`.suites` (prompts), :mod:`.grid` (methods ×
temperatures × γ × batch sizes), :mod:`.runner` (the resumable loop writing
``results.jsonl``), :mod:`.peers` (transformers' generate, plain and assisted),
:mod:`.measure` (memory, seeds, perplexity), :mod:`.metrics` (summary statistics and
paired speed-ups), :mod:`.report` (``summary.md`` / ``summary.json`` / ``--compare``),
:mod:`.plots` (PNGs) and :mod:`.progress` (the progress bar).
"""

__all__: list[str] = []
