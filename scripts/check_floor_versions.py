"""The floor environment: every direct dependency at the lowest version pyproject.toml accepts.

    python scripts/check_floor_versions.py constraints test-hydra13 > floor.txt   # name==floor, one a line
    .venv-floor/bin/python scripts/check_floor_versions.py check test-hydra13     # installed == floor, or exit 1

The requirements are the project's dependencies plus those of the extra, following extras that name lazytrain
itself (`lazytrain[test-tools,...]`). A requirement's floor is its `>=` bound; a package named twice takes the
highest, and one without any `>=` bound has no floor (`hydra-core<1.4` in an extra: the dependencies give its
floor). CI (.ci/run) installs with the constraints, then checks, so a floor that the resolver could not
honour, or one that a later change stops pinning, fails CI instead of drifting to a newer release unnoticed.
Standard library only (tomllib: Python 3.11+), since CI generates the constraints before anything is
installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*([^;]*)")


def canonical_name(name: str) -> str:
    """PEP 503's normalized name (`faster_coco_eval` and `Faster-COCO-Eval` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """`2.3` -> (2, 3): the release numbers without trailing zeros, so that `2.3` and `2.3.0` compare equal.
    A pre-, post- or dev-release, or a local version, is not a floor: ValueError."""
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise ValueError(f"check_floor_versions: version {version!r} is not a plain release (N.N.N)")
    numbers = [int(part) for part in version.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def floors(extra: str, pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{canonical name: floor version} for the project's dependencies and `extra` (recursively)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise ValueError(f"check_floor_versions: no extra {extra!r} in {pyproject}; it has {sorted(extras)}")
    found: dict[str, str] = {}
    pending, seen = [extra], set()
    requirements = list(project.get("dependencies", []))
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in extras[name]:
            match = _REQUIREMENT.match(requirement)
            if match and canonical_name(match.group(1)) == canonical_name(project["name"]):
                pending += [part.strip() for part in (match.group(2) or "").split(",") if part.strip()]
            else:
                requirements.append(requirement)
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match is None:
            raise ValueError(f"check_floor_versions: cannot read the requirement {requirement!r}")
        name = canonical_name(match.group(1))
        for specifier in match.group(3).split(","):
            specifier = specifier.strip()
            if specifier.startswith(">="):
                version = specifier[2:].strip()
                if name not in found or release(version) > release(found[name]):
                    found[name] = version
    return found


def check(expected: dict[str, str]) -> list[str]:
    """Print each package's floor and installed version; return the lines of those that differ."""
    wrong = []
    for name, floor in sorted(expected.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        try:
            same = release(installed) == release(floor)
        except ValueError:
            same = False
        line = f"{name:<26} floor {floor:<10} installed {installed}"
        print(("  " if same else "! ") + line)
        if not same:
            wrong.append(line)
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["constraints", "check"])
    parser.add_argument("extra", help="the extra whose requirements join the dependencies, e.g. test-hydra13")
    args = parser.parse_args()
    expected = floors(args.extra)
    if args.action == "constraints":
        print("\n".join(f"{name}=={version}" for name, version in sorted(expected.items())))
        return 0
    wrong = check(expected)
    if wrong:
        print(f"{len(wrong)} of {len(expected)} packages are not at pyproject.toml's floor:", file=sys.stderr)
        print("\n".join(wrong), file=sys.stderr)
        return 1
    print(f"all {len(expected)} direct dependencies at pyproject.toml's floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
