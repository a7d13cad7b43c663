"""An exception's text and its causes', for tests of errors raised under torch.compile (dynamo
raises its own exception, with the user's as the cause or context)."""

from __future__ import annotations


def chain_text(exc: BaseException | None) -> str:
    texts = []
    while exc is not None:
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(texts)
