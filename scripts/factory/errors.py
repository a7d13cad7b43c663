"""Factory errors. Each class has its own exit code so CI logs say which stage failed."""

from __future__ import annotations


class FactoryError(Exception):
    """Base class; ``exit_code`` is what a command-line entry point returns."""

    exit_code = 1


class MatrixError(FactoryError):
    """build_matrix.yaml is malformed or asks for something impossible."""

    exit_code = 2

    def __init__(self, problems: list[str] | str, source: str = "build_matrix.yaml") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n{lines}")


class PlanError(FactoryError):
    """The request cannot be planned (unknown SM or cell, nothing buildable)."""

    exit_code = 3


class ToolchainError(FactoryError):
    """A compiler, torch or repair tool is missing or does not fit the cell."""

    exit_code = 4


class BuildError(FactoryError):
    """A compile, link, packaging or repair step failed."""

    exit_code = 5


class WheelCheckError(FactoryError):
    """A built wheel's name, metadata and build info disagree, or its file set is wrong."""

    exit_code = 6


def exit_codes(*errors: type[FactoryError], narrower: dict[type[FactoryError], str] | None = None) -> str:
    """The exit statuses of a command that fails with ``errors``, for its --help epilog; each
    class's docstring says what its status means (2 also covers bad arguments: argparse's), or
    ``narrower[class]`` where this command raises it for fewer reasons."""
    meanings = {0: "done", 2: "bad arguments"}
    for error in sorted(errors, key=lambda e: e.exit_code):
        meaning = (narrower or {}).get(error) or error.__doc__.strip().rstrip(".")
        meaning = meaning[0].lower() + meaning[1:]
        meanings[error.exit_code] = (f"{meanings[error.exit_code]}, or {meaning}"
                                     if error.exit_code in meanings else meaning)
    return "exit codes: " + "; ".join(f"{code} {text}" for code, text in sorted(meanings.items()))
