"""Real text that every CPython install carries, so a fresh CI machine needs no download.

- prose: ``pydoc_data.topics`` -- the Python Language Reference / Library Reference sections
  that ``help()`` shows (~460 KB of edited English technical prose, ~110K SmolLM2 tokens).
- code: standard-library modules (``argparse``, ``inspect``, ``subprocess``): real, documented
  Python source, ~75K tokens together.

Long English documents and source code are the two kinds of input of LongBench-style long
context tasks. The exact text follows the interpreter's version, so the reports record the
Python version and a hash of the token stream.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path
from typing import Dict, List, NamedTuple

CODE_MODULES = ("argparse.py", "inspect.py", "subprocess.py")
DOCUMENT_SEPARATOR_ID = 0  # <|endoftext|>: SmolLM2 separates pre-training documents with it


class TextSource(NamedTuple):
    name: str
    description: str
    text: str


def prose_source() -> TextSource:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    text = "\n\n".join(topics[key] for key in sorted(topics))
    return TextSource("prose", "Python reference docs (stdlib pydoc_data.topics)", text)


def code_source() -> TextSource:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [(stdlib / name).read_text(encoding="utf-8") for name in CODE_MODULES]
    return TextSource("code", "CPython stdlib source (" + ", ".join(CODE_MODULES) + ")", "\n\n".join(parts))


def sources() -> Dict[str, TextSource]:
    return {source.name: source for source in (prose_source(), code_source())}


def token_stream(tokenizer, source: TextSource) -> List[int]:
    return tokenizer(source.text, add_special_tokens=False).input_ids


def windows(stream: List[int], context: int, count: int) -> List[List[int]]:
    """``count`` evenly spaced, non-overlapping windows of ``context`` tokens.

    Each starts with the document separator, as a fresh document would in pre-training, so the
    model sees the same start-of-text it was trained with.
    """
    body = context - 1
    if count < 1 or len(stream) < body * count:
        raise ValueError(f"need {body * count} tokens for {count} window(s) of {context}, have {len(stream)}")
    stride = (len(stream) - body) // max(count - 1, 1) if count > 1 else 0
    return [[DOCUMENT_SEPARATOR_ID] + stream[i * stride : i * stride + body] for i in range(count)]


def stream_digest(stream: List[int]) -> str:
    return hashlib.sha256(",".join(map(str, stream)).encode()).hexdigest()[:16]
