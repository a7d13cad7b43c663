"""``python -m scripts.factory``: the build half's command line (nox sessions call this).

    python -m scripts.factory matrix [--check FILE] [--json]
    python -m scripts.factory plan  (--sm sm75 | --cell ID) [--matrix FILE] [--no-repair]
    python -m scripts.factory build (--sm sm75 | --cell ID) [--matrix FILE] [--no-repair]
                                    [--jobs N] [--out DIR]
    python -m scripts.factory check WHEEL... [--matrix FILE] [--no-file-set]
    python -m scripts.factory ptxas [--family F ...] [--sm XY ...] [-D NAME[=VALUE]] [--strict]
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path
from typing import Sequence

from . import matrix as matrix_module
from .errors import (BuildError, FactoryError, MatrixError, PlanError, ToolchainError,
                     WheelCheckError, exit_codes)
from .kernels import jobs_argument
from .report import ReportError, output_dir, parse_wheel_name


class _Once(argparse.Action):
    """--sm / --cell name one selection: a second one would silently replace the first (and
    `nox -s build-sm75 -- --sm sm90` would build sm90)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest)
        if given is not None:
            parser.error(f"argument {option_string}: given twice ({given!r}, then {values!r}); "
                         "name one, and run the command once per SM or cell")
        setattr(namespace, self.dest, values)


def _sm_arg(text: str) -> str:
    """argparse type of --sm: one SM such as 'sm75'. '+PTX' is a cell's choice in the matrix,
    not a selection (it was dropped silently), and a malformed SM is a usage error (exit 2)."""
    from .model import Target
    try:
        target = Target.parse(text)
    except ValueError:
        # 75, sm_75, 7.5, compute_75: the spellings the source build reads, named back as smXY
        from .source_build import other_spelling
        other = other_spelling(text)
        hint = f"; did you mean 'sm{other[1]}{other[2]}'?" if other else ""
        raise argparse.ArgumentTypeError(f"not an SM: {text!r}; write e.g. 'sm80'{hint}") from None
    if target.ptx:
        raise argparse.ArgumentTypeError(
            f"{text!r}: --sm selects every cell of an SM; whether a cell embeds PTX is set in "
            f"build_matrix.yaml (write 'sm{target.sm}')")
    return f"sm{target.sm}"


def _wheel_file(text: str) -> Path:
    """argparse type of check's WHEEL: an existing wheel file. A path that is not there (a typo,
    or a shell glob such as wheelhouse/*.whl that matched nothing), or a file that is no wheel (no
    wheel file name, or not a zip archive), is a usage error (exit 2), not a wheel whose name,
    metadata and build info disagree (exit 6)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"no such wheel file: {text}" + (" (it is a folder)" if path.is_dir() else "")
            + "; name built .whl files, e.g. wheelhouse/*.whl")
    try:
        parse_wheel_name(path.name)
    except ReportError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; name built .whl files, e.g. "
                                         "wheelhouse/*.whl") from None
    if not zipfile.is_zipfile(path):
        raise argparse.ArgumentTypeError(
            f"{text}: not a wheel (a wheel is a zip archive; this file is not one); name built "
            ".whl files, e.g. wheelhouse/*.whl")
    return path


def _select_cells(args, matrix):
    if args.cell:
        try:
            return [matrix.cell(args.cell)], f"cell {args.cell}"
        except KeyError:
            raise PlanError(f"no cell {args.cell!r} in {matrix.source}; cells: "
                            + ", ".join(c.id for c in matrix.cells)) from None
    sm = int(args.sm[2:])  # _sm_arg wrote it as smXY
    cells = matrix.cells_for_sm(sm)
    if not cells:
        raise PlanError(f"no cell targets sm{sm} in {matrix.source}; SMs there: "
                        + ", ".join(f"sm{s}" for s in matrix.sms()))
    return cells, f"sm{sm} ({len(cells)} cells)"


def _plan(args):
    from .host import detect_host
    from .plan import format_plan, plan_cells

    matrix = matrix_module.load_matrix(args.matrix)
    cells, title = _select_cells(args, matrix)
    host = detect_host({c.python for c in cells})
    plans = plan_cells(cells, host, repair_wheels=not getattr(args, "no_repair", False),
                       out_dir=getattr(args, "out", None))
    print(format_plan(plans, title), flush=True)
    return matrix, plans


def _cmd_plan(args) -> int:
    _plan(args)
    return 0


def _cmd_build(args) -> int:
    from .build import default_jobs, run_plans

    matrix, plans = _plan(args)
    wheels = run_plans(plans, jobs=args.jobs or default_jobs(), out_dir=args.out, matrix=matrix)
    print("built:")
    for wheel in wheels:
        print(f"  {wheel}")
    return 0


def _cmd_check(args) -> int:
    from .wheelcheck import check_wheel

    matrix = matrix_module.load_matrix(args.matrix)
    for wheel in args.wheels:
        check_wheel(wheel, matrix, exact_files=not args.no_file_set)
        print(f"{wheel.name}: OK (name, METADATA, build info agree"
              + ("" if args.no_file_set else "; exact file set") + ")")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.factory",
        description="sageattention wheel factory, build half: validate the matrix, plan and "
                    "build exact, repaired, self-describing wheels. The validation and release "
                    "halves have their own commands: python -m scripts.factory.validate, "
                    "python -m scripts.factory.notes, python -m scripts.factory.chart, "
                    "python -m scripts.factory.release, python -m scripts.factory.index.",
        epilog=exit_codes(MatrixError, PlanError, ToolchainError, BuildError, WheelCheckError)
        + " (matrix and ptxas: see their --help)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("matrix", help="validate build_matrix.yaml / print cells (see --help)",
                   add_help=False)
    sub.add_parser("ptxas", help="registers, spills and ptxas performance notes per kernel "
                                 "(see --help)", add_help=False)
    for name, help_text, errors in (
            ("plan", "print what would be built and why cells are skipped",
             (MatrixError, PlanError, ToolchainError)),
            ("build", "build (and repair and check) wheels",
             (MatrixError, PlanError, ToolchainError, BuildError, WheelCheckError))):
        if name == "plan":  # PlanError's "nothing buildable" is build's: a plan is still printed
            epilog = exit_codes(*errors, narrower={PlanError: "The request cannot be planned (unknown "
                                                              "SM or cell)"}) + (
                ". A plan that skips every cell is printed and exits 0 (build then exits 3)")
        else:
            epilog = exit_codes(*errors)
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog)
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--sm", action=_Once, type=_sm_arg,
                           help="every cell targeting this SM, e.g. sm75")
        which.add_argument("--cell", action=_Once,
                           help="one cell id, e.g. linux-cp311-torch2.14-cu130-sm80")
        p.add_argument("--matrix", type=Path, default=matrix_module.DEFAULT_MATRIX,
                       help="matrix file (default: build_matrix.yaml)")
        p.add_argument("--no-repair", action="store_true",
                       help="skip auditwheel/delvewheel (runners without them)")
        if name == "build":
            p.add_argument("--jobs", type=jobs_argument, default=None,
                           help="parallel compile jobs (default: MAX_JOBS or the CPU count)")
            p.add_argument("--out", type=output_dir, default=Path("wheelhouse"),
                           help="where final wheels go (default: wheelhouse/)")
    check = sub.add_parser("check", help="check built wheels: name, METADATA, build info, "
                                         "file set",
                           description="Check built wheels: the file name, METADATA and build "
                                       "info must agree and name a cell of the matrix, and the "
                                       "files must be exactly those the source tree and the "
                                       "build info predict. Stops at the first wheel that fails.",
                           epilog=exit_codes(MatrixError, WheelCheckError))
    check.add_argument("wheels", nargs="+", type=_wheel_file, metavar="WHEEL",
                       help="built .whl files, e.g. wheelhouse/*.whl")
    check.add_argument("--matrix", type=Path, default=matrix_module.DEFAULT_MATRIX,
                       help="matrix file the wheels' cells come from (default: build_matrix.yaml)")
    check.add_argument("--no-file-set", action="store_true",
                       help="skip the exact file set comparison with the source tree")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["matrix"]:
        return matrix_module.main(argv[1:])
    if argv[:1] == ["ptxas"]:
        from . import ptxas
        return ptxas.main(argv[1:])
    args = build_parser().parse_args(argv)
    handler = {"plan": _cmd_plan, "build": _cmd_build, "check": _cmd_check}[args.command]
    try:
        return handler(args)
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
