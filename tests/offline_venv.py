"""A venv that holds what some requirements resolve to and nothing else, made from the distributions this
test process has installed: an offline, second-long stand-in for `pip install` downloading them.

`python offline_venv.py VENV REQUIREMENT...` makes VENV (no system site-packages, so nothing of this
process is visible there) and links into its site-packages every file of each distribution the
requirements name, with their dependencies (markers and extras evaluated as pip does), then writes
their console scripts for VENV's interpreter. A package the requirements do not bring in is not there:
importing it fails in VENV as it would after a real install. pip run in VENV with PIP_NO_INDEX=1 then
finds the requirements satisfied and downloads nothing (and fails on one the closure lacks)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """{name: distribution} of the requirements and all they depend on, as installed here."""
    found: dict[str, metadata.Distribution] = {}
    extras_done: set[tuple[str, str]] = set()
    todo = [(Requirement(line), "") for line in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        distribution = found.get(name) or metadata.distribution(requirement.name)
        if distribution.version not in requirement.specifier:
            raise RuntimeError(f"{requirement}: {distribution.version} installed here")
        for wanted in ["", *requirement.extras]:
            if (name, wanted) in extras_done:
                continue
            extras_done.add((name, wanted))
            todo += [(Requirement(line), wanted) for line in distribution.requires or []]
        found[name] = distribution
    return found


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def owners() -> dict[str, set[str]]:
    """{a top-level name in site-packages: the installed distributions with files under it}."""
    found: dict[str, set[str]] = {}
    for distribution in metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        for top in {file.parts[0] for file in distribution.files or []}:
            found.setdefault(top, set()).add(name)
    return found


def link(venv: Path, requirements: list[str]) -> int:
    """Link the closure of `requirements` into `venv` (made already); the number of distributions. A
    folder that one distribution alone has files in is one link; a shared one (a namespace) file by file."""
    site = site_packages(venv)
    present = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions(path=[str(site)])}
    distributions = {name: d for name, d in closure(requirements).items() if name not in present}
    owned = owners()
    for name, distribution in distributions.items():
        for file in distribution.files or []:
            if file.parts[0] == "..":  # scripts: written below, for this venv's interpreter
                continue
            whole = len(file.parts) > 1 and owned[file.parts[0]] == {name}
            source = Path(distribution.locate_file(file.parts[0] if whole else file)).resolve()
            target = site / (file.parts[0] if whole else file)
            if not target.exists() and not target.is_symlink():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source)
        for entry in distribution.entry_points.select(group="console_scripts"):
            module, _, attribute = entry.value.partition(":")
            script = venv / "bin" / entry.name
            script.write_text(
                f"#!{venv / 'bin' / 'python'}\nimport sys\nimport {module}\n"
                f"sys.exit({module}.{attribute.strip()}())\n"
            )
            script.chmod(0o755)
    return len(distributions)


def main(venv: Path, requirements: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    link(venv, ["pip", *requirements])


if __name__ == "__main__":
    main(Path(sys.argv[1]).absolute(), sys.argv[2:])
