"""Build the Lambda layer directories from `layers/` without Docker.

The core layer needs no build: `layers/core` already has the `python/batchinfer/...` layout Lambda
expects. The third-party layer is `pip install`ed for the Lambda platform (manylinux wheels for
CPython 3.12 on arm64) into `build/layers/deps/python`, from `requirements-layer.lock`: every package,
direct or not, pinned with its hashes (`--require-hashes --no-deps`), so two builds from one lock install
the same bytes or fail. A stamp file next to it records a hash of the lock and the build recipe, so a
repeated synth skips the download when nothing changed; the same hash names the layer asset, so a changed
lock is always uploaded.

`requirements.txt` stays the place to choose versions (the venv and the tests install it); after changing
it, regenerate the lock with `python -m infra.layers --lock` (uv, resolving for Lambda's platform, not this
machine's) and commit both. tests/infra checks that the two agree.

Run `python -m infra.layers` to build (or check) the deps layer explicitly; `app.py` calls the same
function, so `cdk synth`/`cdk deploy` work from a clean clone too.

Set `BATCHINFER_SKIP_DEPS_BUILD=1` (or context `skip_deps_build=true`) to synthesize against an empty
placeholder layer instead: unit tests of the stack do this, so they need no network. A stack built that
way carries a warning and must not be deployed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CORE_LAYER_DIR = REPO_ROOT / "layers" / "core"
REQUIREMENTS_FILE = REPO_ROOT / "requirements.txt"
LOCK_FILE = REPO_ROOT / "requirements-layer.lock"
BUILD_DIR = REPO_ROOT / "build" / "layers"
DEPS_LAYER_DIR = BUILD_DIR / "deps"
DEPS_STAMP_FILE = BUILD_DIR / "deps.stamp"
# The lock as pip constraints for the dev venv (`make venv`): see `constraints_text`.
CONSTRAINTS_FILE = BUILD_DIR / "lock-constraints.txt"
PLACEHOLDER_LAYER_DIR = BUILD_DIR / "deps-placeholder"

SKIP_ENV_VAR = "BATCHINFER_SKIP_DEPS_BUILD"

# Must match the functions' runtime and architecture in infra/functions.py.
LAMBDA_PYTHON_VERSION = "3.12"
# pip's platform tag (manylinux2014 = glibc 2.17, which Lambda's Amazon Linux 2023 exceeds) and uv's name
# for the same target when resolving the lock.
LAMBDA_PLATFORM = "manylinux2014_aarch64"
LOCK_PLATFORM = "aarch64-manylinux2014"

# Bump when the build recipe changes in a way the lock hash would not see.
_RECIPE_VERSION = "2"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#\\]+)")


@dataclass(frozen=True)
class LayerBuild:
    """A layer directory ready for `lambda.Code.from_asset`, with a hash that identifies its content."""

    path: Path
    asset_hash: str
    placeholder: bool = False


def pip_arguments(target: Path, lock: Path = LOCK_FILE) -> list[str]:
    """The pip command that installs the locked runtime dependencies for the Lambda platform into `target`."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--platform",
        LAMBDA_PLATFORM,
        "--implementation",
        "cp",
        "--python-version",
        LAMBDA_PYTHON_VERSION,
        "--only-binary=:all:",
        # Every distribution must match a hash of the lock; the lock is complete, so no resolving.
        "--require-hashes",
        "--no-deps",
        # Byte code compiled here would be for the build machine's Python, not 3.12: useless weight.
        "--no-compile",
        "--target",
        str(target),
        "-r",
        str(lock),
    ]


def lock_arguments(output: Path = LOCK_FILE, requirements: Path = REQUIREMENTS_FILE) -> list[str]:
    """The uv command that resolves requirements.txt for Lambda (CPython 3.12, manylinux aarch64, wheels
    only) into a lock with the hashes of every distribution."""
    return [
        sys.executable,
        "-m",
        "uv",
        "pip",
        "compile",
        str(requirements.relative_to(REPO_ROOT) if requirements.is_relative_to(REPO_ROOT) else requirements),
        "--python-version",
        LAMBDA_PYTHON_VERSION,
        "--python-platform",
        LOCK_PLATFORM,
        "--only-binary",
        ":all:",
        "--generate-hashes",
        "--no-cache",
        "--quiet",
        "--output-file",
        str(output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output),
    ]


def pins(path: Path) -> dict[str, str]:
    """{normalized name: version} of the `name==version` lines of a requirements or lock file."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def lock_entries(lock: Path = LOCK_FILE) -> dict[str, list[str]]:
    """{normalized name==version: its sha256 hashes} of a hashed lock (continuation lines joined)."""
    entries: dict[str, list[str]] = {}
    joined = re.sub(r"\\\n\s*", " ", lock.read_text())
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if not match:
            raise ValueError(f"{lock.name}: not a pinned requirement: {line!r}")
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        entries[f"{name}=={match.group(2)}"] = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
    return entries


def lock_problems(requirements: Path = REQUIREMENTS_FILE, lock: Path = LOCK_FILE) -> list[str]:
    """What makes the lock disagree with requirements.txt or unfit for --require-hashes (empty: fine)."""
    if not lock.is_file():
        return [f"{lock.name} is missing: run `python -m infra.layers --lock`"]
    problems = []
    locked = pins(lock)
    for name, version in pins(requirements).items():
        if locked.get(name) != version:
            problems.append(f"{name}=={version} is locked as {locked.get(name) or 'nothing'}")
    for entry, hashes in lock_entries(lock).items():
        if not hashes:
            problems.append(f"{entry} has no hash")
    return problems


def constraints_text(lock: Path = LOCK_FILE) -> str:
    """The lock as pip constraints (`-c`) for the dev venv: its `name==version` lines without their hashes, so
    the venv's indirect packages are the layer's versions. Not the lock itself: any `--hash` in a constraints
    file turns on pip's hash-checking mode for the whole install, which then refuses every unhashed
    requirement of requirements-dev.txt; and the lock has the hashes of Lambda's wheels (CPython 3.12,
    manylinux aarch64), which for the compiled packages are not the wheels this machine installs."""
    pinned = "\n".join(sorted(lock_entries(lock)))
    return f"# Generated from {lock.name} by `python -m infra.layers --constraints`: versions only.\n{pinned}\n"


def requirements_hash(lock: Path = LOCK_FILE) -> str:
    """Hash of the lock file and the build recipe: the deps layer's identity (stamp and asset hash)."""
    digest = hashlib.sha256()
    digest.update(f"{_RECIPE_VERSION}|{LAMBDA_PLATFORM}|{LAMBDA_PYTHON_VERSION}|".encode())
    digest.update(lock.read_bytes())
    return digest.hexdigest()


def deps_layer_is_current(lock: Path = LOCK_FILE) -> bool:
    """True when the built deps layer matches the lock file."""
    if not DEPS_STAMP_FILE.is_file() or not (DEPS_LAYER_DIR / "python").is_dir():
        return False
    return DEPS_STAMP_FILE.read_text().strip() == requirements_hash(lock)


def build_deps_layer(*, force: bool = False, quiet: bool = False) -> LayerBuild:
    """Install the locked runtime dependencies into `build/layers/deps/python`, unless already current."""
    problems = lock_problems()
    if problems:
        raise SystemExit(
            f"{LOCK_FILE.name} does not match {REQUIREMENTS_FILE.name}: "
            + "; ".join(problems)
            + ". Regenerate it with `python -m infra.layers --lock`."
        )
    wanted = requirements_hash()
    if not force and deps_layer_is_current():
        return LayerBuild(DEPS_LAYER_DIR, wanted)

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # Install into a fresh temporary directory and swap it in, so an interrupted build never leaves a
    # half-filled layer behind a valid-looking stamp.
    staging = Path(tempfile.mkdtemp(prefix="deps-", dir=BUILD_DIR))
    try:
        if not quiet:
            print(
                f"building deps layer for {LAMBDA_PLATFORM} / CPython {LAMBDA_PYTHON_VERSION} ...",
                file=sys.stderr,
            )
        subprocess.run(
            pip_arguments(staging / "python"),
            check=True,
            stdout=subprocess.DEVNULL if quiet else None,
        )
        _prune(staging / "python")
        DEPS_STAMP_FILE.unlink(missing_ok=True)
        if DEPS_LAYER_DIR.exists():
            shutil.rmtree(DEPS_LAYER_DIR)
        staging.rename(DEPS_LAYER_DIR)
        DEPS_STAMP_FILE.write_text(wanted + "\n")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return LayerBuild(DEPS_LAYER_DIR, wanted)


def _prune(site: Path) -> None:
    """Drop what Lambda never loads; the unzipped function + layers must stay under 250 MB."""
    for pattern in ("**/__pycache__", "bin"):
        for path in site.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


def placeholder_deps_layer() -> LayerBuild:
    """An almost empty layer directory for synthesis without the real dependencies (unit tests)."""
    python_dir = PLACEHOLDER_LAYER_DIR / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    marker = python_dir / "PLACEHOLDER.txt"
    if not marker.exists():
        marker.write_text("Placeholder deps layer (BATCHINFER_SKIP_DEPS_BUILD=1). Do not deploy.\n")
    return LayerBuild(PLACEHOLDER_LAYER_DIR, "placeholder-deps-layer", placeholder=True)


def skip_requested(context_value: object = None) -> bool:
    """Whether the env var or the context asks for the placeholder deps layer."""
    values = (os.environ.get(SKIP_ENV_VAR, ""), "" if context_value is None else str(context_value))
    return any(value.strip().lower() in {"1", "true", "yes", "on"} for value in values)


def deps_layer(*, skip: bool = False) -> LayerBuild:
    """The deps layer for synthesis: the real build (incremental) or the placeholder."""
    return placeholder_deps_layer() if skip else build_deps_layer()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the batchinfer Lambda deps layer (no Docker).")
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    parser.add_argument("--check", action="store_true", help="exit 1 if the layer is missing or stale")
    parser.add_argument(
        "--lock", action="store_true", help=f"re-resolve {REQUIREMENTS_FILE.name} into {LOCK_FILE.name} (uv)"
    )
    parser.add_argument(
        "--constraints",
        nargs="?",
        const=CONSTRAINTS_FILE,
        type=Path,
        metavar="PATH",
        help=f"write {LOCK_FILE.name}'s versions, without hashes, as pip constraints for the dev venv",
    )
    args = parser.parse_args(argv)
    if args.constraints:
        args.constraints.parent.mkdir(parents=True, exist_ok=True)
        args.constraints.write_text(constraints_text())
        print(f"{args.constraints} written")
        return 0
    if args.lock:
        subprocess.run(lock_arguments(), check=True, cwd=REPO_ROOT)
        problems = lock_problems()
        print("\n".join(problems) if problems else f"{LOCK_FILE.name} written")
        return 1 if problems else 0
    if args.check:
        current = deps_layer_is_current()
        print("deps layer is current" if current else "deps layer is missing or stale")
        return 0 if current else 1
    if not args.force and deps_layer_is_current():
        print(f"deps layer is current: {DEPS_LAYER_DIR}")
        return 0
    build = build_deps_layer(force=args.force)
    print(f"deps layer built: {build.path} ({build.asset_hash[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
