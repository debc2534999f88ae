"""launch/modes/: each module of the folder is a launch mode, found there, with its word, script and keys."""

from __future__ import annotations

from pathlib import Path

from {{cookiecutter.package_name}}.launch import modes as modes_package
from {{cookiecutter.package_name}}.launch.keys import KEYS, SCRIPTS, keys_of
from {{cookiecutter.package_name}}.launch.modes import extra_modes

from ...helpers import PROJECT_DIR


def test_every_module_of_the_folder_is_a_mode_with_its_script_and_its_keys() -> None:
    """A bake without a mode lacks its module and its script alike: the registry is then empty."""
    modes = extra_modes()
    files = {path.stem for path in Path(modes_package.__file__).parent.glob("*.py")} - {"__init__"}
    assert len(modes) == len(files), (sorted(modes), sorted(files))
    for word, module in modes.items():
        assert word not in SCRIPTS
        script = (PROJECT_DIR / "scripts" / module.SCRIPT).read_text()
        assert f'.launch {word} "$@"' in script, module.SCRIPT
        own = {key.name for key in module.KEYS}
        assert set(module.SHARED_KEYS) <= {key.name for key in KEYS} and not own & {key.name for key in KEYS}
        shared = [key.name for key in KEYS if key.name in module.SHARED_KEYS]
        assert [key.name for key in keys_of(word)] == [*shared, *(key.name for key in module.KEYS)]
