"""After baking: make the launch scripts executable and say where to start."""

import pathlib

for script in pathlib.Path("scripts").glob("*.sh"):
    script.chmod(0o755)

print("Project ready. Next: cd {{ cookiecutter.project_slug }} && pip install -e '.[dev]' && bash scripts/run_single.sh")
