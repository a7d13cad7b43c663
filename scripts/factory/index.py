"""PEP 503 simple index for a release: one index per wheel variant (local version label).

Why one index per variant: local labels sort as text, so if the sm75 and sm89 wheels for the same
Python/platform shared a page, "the highest version" pip would choose between them would be
arbitrary. With one page per label, a page never holds two wheels with the same tags.

Layout under ``<root>`` (``<label>``: the wheel's local label, e.g. ``sm75.torch2.12cu130``)::

    index.html                          human overview: one link per variant
    <label>/index.html                  PEP 503 root: lists the project
    <label>/sageattention/index.html    PEP 503 project page: the variant's wheels, #sha256= links

Use: ``pip install --index-url <root>/<label>/ sageattention==<version>+<label>``.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlparse

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

__all__ = ["IndexEntry", "variant_of", "write_index", "wheel_href", "entries_from_manifest",
           "project_from_manifest", "main"]

# hashlib's hexdigest() form, as the release step writes it and pip compares it.
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The manifest.json format this reads (release.py's MANIFEST_SCHEMA_VERSION; release imports this
# module, so the number is repeated here, and a test keeps the two equal).
MANIFEST_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class IndexEntry:
    """One wheel as the index sees it."""

    filename: str
    sha256: str
    requires_python: str | None = None

    def __post_init__(self) -> None:
        # Each field goes into a link pip acts on: a malformed hash fails every install of the
        # wheel, a malformed Requires-Python makes pip skip or reject the link.
        if not isinstance(self.filename, str):
            raise ValueError(f"'filename' must be a wheel file name, got {self.filename!r}")
        try:
            parse_wheel_filename(self.filename)
        except InvalidWheelFilename as exc:
            raise ValueError(f"'filename' {self.filename!r} is not a wheel file name ({exc}); "
                             "expected '<name>-<version>-<python tag>-<abi tag>-<platform "
                             "tag>.whl'") from None
        if not (isinstance(self.sha256, str) and _SHA256.fullmatch(self.sha256)):
            raise ValueError(f"{self.filename}: 'sha256' must be 64 lowercase hex digits, got "
                             f"{self.sha256!r}")
        if self.requires_python is not None:
            if not isinstance(self.requires_python, str):
                raise ValueError(f"{self.filename}: 'requires_python' must be a string such as "
                                 f"'>=3.9' or null, got {self.requires_python!r}")
            try:
                SpecifierSet(self.requires_python)
            except InvalidSpecifier:
                raise ValueError(f"{self.filename}: 'requires_python' {self.requires_python!r} "
                                 "is not a version specifier such as '>=3.9'") from None


def variant_of(filename: str) -> str:
    """The index variant a wheel belongs to: its local version label.

    Raises ValueError for a wheel without a local label: such a wheel names no GPU/torch/CUDA
    variant, so it has no index of its own in this release layout.
    """
    _name, version, _build, _tags = parse_wheel_filename(filename)
    if not version.local:
        raise ValueError(
            f"wheel {filename!r} has no local version label; release wheels must carry one "
            "(for example 2.2.0+sm75.torch2.12cu130)"
        )
    return version.local


def wheel_href(filename: str, sha256: str, base_url: str | None) -> str:
    """Link from a project page to a wheel.

    Without ``base_url`` the wheel is expected three levels up (the release folder holds the wheels
    and ``simple/`` side by side), which works for a local folder served as-is or via file://.
    """
    target = quote(filename)
    if base_url:
        if not base_url.endswith("/"):
            base_url += "/"
        url = base_url + target
    else:
        url = "../../../" + target
    return f"{url}#sha256={sha256}"


def _page(title: str, body_lines: list[str]) -> str:
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "  <head>",
        '    <meta name="pypi:repository-version" content="1.0">',
        f"    <title>{html.escape(title)}</title>",
        "  </head>",
        "  <body>",
        f"    <h1>{html.escape(title)}</h1>",
        *(f"    {line}<br>" for line in body_lines),
        "  </body>",
        "</html>",
        "",
    ]
    return "\n".join(lines)


def write_index(
    root: Path,
    project: str,
    entries: list[IndexEntry],
    base_url: str | None = None,
) -> dict[str, str]:
    """Write the per-variant indexes under ``root``; return {filename: its variant}.

    Raises ValueError when two wheels of one variant share a tag (pip could not tell them apart),
    one file name is listed twice with different hashes or Requires-Python (which file is it?),
    or a wheel belongs to another project. An entry listed twice, identical, is written once.
    """
    project_dir = canonicalize_name(project)
    by_variant: dict[str, list[IndexEntry]] = defaultdict(list)
    by_filename: dict[str, IndexEntry] = {}
    for entry in entries:
        first = by_filename.get(entry.filename)
        if first is not None:
            if first == entry:
                continue  # identical entries: one link serves both
            raise ValueError(
                f"wheel {entry.filename!r} is listed twice, with sha256 {first.sha256} and "
                f"{entry.sha256}" + ("" if first.requires_python == entry.requires_python else
                                     f" and requires_python {first.requires_python!r} and "
                                     f"{entry.requires_python!r}")
                + "; one file has one hash: keep the entry of the file being published"
            )
        by_filename[entry.filename] = entry
        name, _version, _build, _tags = parse_wheel_filename(entry.filename)
        if name != project_dir:
            raise ValueError(f"wheel {entry.filename!r} is not a {project!r} wheel")
        by_variant[variant_of(entry.filename)].append(entry)

    for variant, group in sorted(by_variant.items()):  # every page is checked before any is written
        seen: dict[object, str] = {}
        for entry in group:
            for tag in parse_wheel_filename(entry.filename)[3]:
                other = seen.setdefault(tag, entry.filename)
                if other != entry.filename:
                    raise ValueError(
                        f"wheels {other!r} and {entry.filename!r} share the tag {tag} in index "
                        f"variant {variant!r}; one page may hold only one wheel per tag"
                    )

    where: dict[str, str] = {}
    for variant, group in sorted(by_variant.items()):
        variant_dir = root / variant
        (variant_dir / project_dir).mkdir(parents=True, exist_ok=True)
        (variant_dir / "index.html").write_text(
            _page(
                f"Simple index: {variant}",
                [f'<a href="{project_dir}/">{html.escape(project_dir)}</a>'],
            ),
            encoding="utf-8",
        )
        links = []
        for entry in sorted(group, key=lambda e: e.filename):
            attrs = f'href="{html.escape(wheel_href(entry.filename, entry.sha256, base_url))}"'
            if entry.requires_python:
                attrs += f' data-requires-python="{html.escape(entry.requires_python)}"'
            links.append(f"<a {attrs}>{html.escape(entry.filename)}</a>")
            where[entry.filename] = variant
        (variant_dir / project_dir / "index.html").write_text(
            _page(f"Links for {project_dir} ({variant})", links), encoding="utf-8"
        )

    overview = [
        f'<a href="{quote(variant)}/">{html.escape(variant)}</a>' for variant in sorted(by_variant)
    ]
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_text(
        _page(f"{project}: one simple index per wheel variant", overview), encoding="utf-8"
    )
    return where


def entries_from_manifest(manifest: dict) -> list[IndexEntry]:
    """Index entries for the wheels a release manifest (scripts/factory/release.py) lists."""
    schema = manifest.get("schema_version", MANIFEST_SCHEMA_VERSION) \
        if isinstance(manifest, dict) else None
    if isinstance(manifest, dict) and (type(schema) is not int
                                       or schema != MANIFEST_SCHEMA_VERSION):
        raise ValueError(f"manifest schema_version {schema!r} is not supported: this index reads "
                         f"schema_version {MANIFEST_SCHEMA_VERSION} (written by "
                         "scripts/factory/release.py of the same checkout)")
    wheels = manifest.get("wheels") if isinstance(manifest, dict) else None
    if not isinstance(wheels, list):
        raise ValueError(
            "manifest has no 'wheels' list; is it a sageattention release manifest.json?"
        )
    if not wheels:
        raise ValueError("manifest lists no wheels: nothing to index (a release manifest lists "
                         "at least one; release.py writes none when no wheel is accepted)")
    entries = []
    for i, w in enumerate(wheels):
        try:
            entries.append(IndexEntry(w["filename"], w["sha256"], w.get("requires_python")))
        except (KeyError, TypeError):
            raise ValueError(f"manifest wheels[{i}] needs 'filename' and 'sha256'") from None
        except ValueError as exc:
            raise ValueError(f"manifest wheels[{i}]: {exc}") from None
    return entries


def project_from_manifest(manifest: dict) -> str:
    """The project a release manifest is for (its ``project``; sageattention when absent)."""
    project = manifest.get("project", "sageattention")
    if not isinstance(project, str) or not project.strip():
        raise ValueError(f"manifest 'project' must be the project name, a string such as "
                         f"'sageattention' (or absent: sageattention), got {project!r}")
    return project


def absolute_url(text: str) -> str:
    """argparse type of the URL options here and in release.py: a link written into an index or a
    manifest must be absolute, or every install from it breaks."""
    parsed = urlparse(text)
    if parsed.scheme not in ("https", "http", "file") or not (parsed.netloc or parsed.path):
        raise argparse.ArgumentTypeError(
            f"not an absolute URL: {text!r}; write it with its scheme and host, e.g. "
            "'https://github.com/OWNER/REPO/releases/download/v2.2.0/' or "
            "'https://OWNER.github.io/REPO/v2.2.0/simple/'"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    """Rebuild a release's simple index from its manifest.json (e.g. to host it on GitHub Pages)."""
    parser = argparse.ArgumentParser(
        prog="python scripts/factory/index.py",
        description="Write the per-variant PEP 503 indexes of the wheels a release manifest lists.",
        epilog="exit codes: 0 written; 2 bad arguments or manifest",
    )
    parser.add_argument("--manifest", type=Path, required=True, help="the release's manifest.json")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the index into")
    parser.add_argument(
        "--wheel-base-url",
        default=None,
        type=absolute_url,
        help="absolute URL the wheels are downloaded from (e.g. the GitHub release "
        "download URL); default: relative links, as in the release folder",
    )
    args = parser.parse_args(argv)
    try:
        try:
            manifest = json.loads(args.manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            why = ("it is a folder" if args.manifest.is_dir() else
                   getattr(exc, "strerror", None) or f"not JSON: {exc}")
            raise ValueError(f"cannot read --manifest {args.manifest} ({why}); name the "
                             "release's manifest.json") from None
        under = next((p for p in (args.out, *args.out.parents) if p.exists()), None)
        if under is not None and not under.is_dir():
            raise ValueError(f"--out {args.out} " + ("is a file" if under == args.out else
                                                     f"lies under the file {under}")
                             + "; name a folder (it is created if missing)")
        entries = entries_from_manifest(manifest)
        where = write_index(
            args.out, project_from_manifest(manifest), entries, args.wheel_base_url
        )
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for variant in sorted(set(where.values())):
        print(f"wrote {args.out / variant}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
