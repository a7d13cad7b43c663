"""Build sageattention: one extension per kernel family the SM targets need.

    SAGEATTENTION_SM_TARGETS="sm80;sm90+PTX" pip install --no-build-isolation .

Without SAGEATTENTION_SM_TARGETS (or TORCH_CUDA_ARCH_LIST) the build targets the visible
GPUs. The version gets its local label (2.2.0+sm80.torch2.14cu130) and the wheel gets
sageattention/_build_info.json here, at build time; a built wheel is never renamed.
Kernel .cu objects are compiled by scripts/factory/kernels.py into a cache shared across
torch versions; only each family's bindings .cpp is compiled against torch.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from scripts.factory import buildinfo, kernels, source_build  # noqa: E402
from scripts.factory.errors import FactoryError  # noqa: E402
from scripts.factory.labels import base_version  # noqa: E402

# Commands that produce a wheel or an install need the full toolchain; metadata-only and
# sdist commands must work without torch or nvcc (an sdist is version BASE_VERSION, no label).
COMPILE_COMMANDS = {"bdist_wheel", "build", "build_ext", "build_py", "install", "develop",
                    "editable_wheel"}
commands = set(sys.argv[1:])  # option values in here are harmless: only names are compared
if "sdist" in commands and commands & COMPILE_COMMANDS:
    # one process cannot do both: the sdist must carry no label and no kernels, the wheel both
    sys.exit("\nerror: build the sdist and the wheel in two commands (python -m build does: "
             "python -m build --sdist, then python -m build --wheel --no-isolation); `setup.py "
             f"sdist {' '.join(sorted(commands & COMPILE_COMMANDS))}` in one process would give a "
             "wheel without its kernels\n")
building = bool(commands & (COMPILE_COMMANDS | {"dist_info"})) and "sdist" not in commands
compiling = bool(commands & COMPILE_COMMANDS) and "sdist" not in commands


def stop(exc: FactoryError) -> None:
    """Exit with what went wrong and how to fix it (the error says both), without a traceback."""
    sys.exit(f"\nerror: cannot build sageattention's CUDA kernels:\n{exc}\n")


config = None
if compiling and hasattr(sys.stdout, "reconfigure"):
    # pip (and CI logs) read the build's stdout through a pipe, which Python buffers in 8 KiB
    # blocks: the per-object and `still compiling` lines of a minutes-long compile would only
    # show once it ended. One line at a time instead.
    sys.stdout.reconfigure(line_buffering=True)
if building:
    try:
        config = source_build.resolve()
    except FactoryError as exc:
        stop(exc)
    print(config.describe(), flush=True)
    # torch's extension builder must use the toolkit our kernel objects were compiled with.
    # A CUDA_HOME set but empty counts as unset (as for resolve, which then took nvcc from PATH):
    # setdefault kept it, and torch then guessed the toolkit from PATH's nvcc without following
    # a link or wrapper (/usr/bin/nvcc -> headers from /usr/include, another toolkit or none).
    if not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = str(kernels.cuda_home_of(config.nvcc))


@functools.lru_cache(maxsize=1)  # one build date for every place it is written
def build_info_json() -> str:
    info = buildinfo.make_build_info(
        version=config.version, local_label=str(config.label), targets=config.targets,
        builds=config.builds, torch_version=config.torch_version, cuda=config.cuda,
        torch_requirement=config.torch_requirement, nvcc_version=str(config.nvcc_version),
        cell_id=config.cell_id)
    return json.dumps(info, indent=2, sort_keys=True) + "\n"


def write_build_info(package_dir: Path) -> None:
    if config is not None:
        package_dir.mkdir(parents=True, exist_ok=True)
        (package_dir / "_build_info.json").write_text(build_info_json(), "utf-8")


class BuildPyWithInfo(build_py):
    """Writes _build_info.json into the build tree (never into the source tree)."""

    def run(self) -> None:
        super().run()
        write_build_info(Path(self.build_lib) / "sageattention")


def extensions_and_commands():
    # Metadata only (dist_info) needs the version, not torch's build machinery.
    if config is None or not compiling:
        return [], {"build_py": BuildPyWithInfo}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    windows = sys.platform == "win32"
    # After every other include dir, so the toolkit's own headers still win.
    late_includes = source_build.wheel_cuda_include_dirs(config.cuda)
    cxx = ([f"/I{d}" for d in late_includes] + ["/O2", f"/std:{config.cxx_std}", "/DNDEBUG"]
           if windows else
           [f"-idirafter{d}" for d in late_includes]
           + ["-O3", "-g0", f"-std={config.cxx_std}", "-DNDEBUG"])
    link = [] if windows else ["-Wl,--strip-debug"]

    class BuildExt(BuildExtension):
        """Kernel objects first (cached, parallel), then torch's build of the bindings."""

        def build_extensions(self) -> None:
            started = time.monotonic()
            cache = kernels.default_cache_dir(ROOT)
            try:
                per_family = kernels.compile_families(
                    config.builds, nvcc=config.nvcc, nvcc_id=config.nvcc_id, cache_dir=cache,
                    jobs=config.jobs, root=ROOT)
            except FactoryError as exc:  # nvcc's own output is in the message; no traceback
                stop(exc)
            for ext, objects in zip(self.extensions, per_family):
                ext.extra_objects = [str(o.path) for o in objects]
            print(f"[bindings] compiling and linking {len(self.extensions)} extension(s)",
                  flush=True)
            super().build_extensions()
            print(f"[build] extensions done in {time.monotonic() - started:.1f}s", flush=True)

        def run(self) -> None:
            super().run()
            # Editable installs (inplace) use the source tree as the package.
            write_build_info(ROOT / "sageattention" if self.inplace
                             else Path(self.build_lib) / "sageattention")

    exts = []
    for family_build in config.builds:
        sources = kernels.binding_sources(family_build, ROOT)
        exts.append(CUDAExtension(
            name=family_build.family.extension,
            sources=[s.relative_to(ROOT).as_posix() for s in sources],
            include_dirs=[str(d) for d in kernels.include_dirs(family_build, ROOT)],
            extra_compile_args={"cxx": cxx, "nvcc": []},
            extra_link_args=link))
    os.environ.setdefault("MAX_JOBS", str(config.jobs))  # torch's ninja build reads it
    return exts, {"build_py": BuildPyWithInfo, "build_ext": BuildExt.with_options(use_ninja=True)}


try:
    ext_modules, cmdclass = extensions_and_commands()
except FactoryError as exc:
    stop(exc)
build_base = f"build/cells/{config.label}" if config else "build/meta"

setup(
    version=config.version if config else base_version(ROOT),
    install_requires=[config.torch_requirement] if config else ["torch"],
    packages=find_packages(include=["sageattention", "sageattention.*"]),
    package_data={"sageattention": ["**/*.json"]},
    exclude_package_data={"sageattention": ["_build_info.json"]},
    include_package_data=False,
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"build": {"build_base": build_base}},
    zip_safe=False,
)
