"""`--help` for every job: each key with its type, domain, default and one-line doc.

The doc of a field is its trailing `# comment` in the dataclass source, read with `tokenize`, so the help
text is the code's own comment and cannot drift from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize
import typing
from typing import Annotated, get_args, get_origin

from wxray.config import Range, to_dict, type_name


def field_docs(cls: type) -> dict[str, str]:
    """{field: doc} over `cls` and its dataclass bases (subclasses win).

    A field's doc is its trailing `# comment`, or else the block of comment lines right above it.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        comments = {tok.start[0]: tok.string.lstrip("#").strip()
                    for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
        block: list[str] = []
        for number, row in enumerate(source.splitlines(), start=1):
            text = row.strip()
            if text.startswith("#"):
                block.append(comments.get(number, ""))
                continue
            field = re.match(r"\s+(\w+)\s*:[^=]*=", row)
            if field and not text.startswith(("def ", "return", "if ", "raise")):
                doc = comments.get(number) or " ".join(block)
                if doc:
                    docs[field.group(1)] = doc
            block = []
    return docs


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per key: `key (type, default value): doc`, nested sections flattened with dots."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    defaults = cls()
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(describe(tp, key + "."))
            continue
        rng = [e for e in get_args(tp)[1:] if isinstance(e, Range)] if get_origin(tp) is Annotated else []
        kind = type_name(tp) + (f" {rng[0]}" if rng and (rng[0].lo is not None or rng[0].hi is not None) else "")
        default = to_dict(getattr(defaults, f.name)) if dataclasses.is_dataclass(getattr(defaults, f.name)) \
            else getattr(defaults, f.name)
        default = list(default) if isinstance(default, tuple) else default
        doc = docs.get(f.name, "")
        out.append(f"  {key} ({kind}, default {default!r})" + (f": {doc}" if doc else ""))
    return out
