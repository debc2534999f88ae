"""The name under which the launcher passes its command line (a JSON list of its arguments) on to the workers,
for the run's record (observe/provenance.py). The launcher sets it where the project has this module: common/
run_dir.py's launch_environment finds it by its LAUNCH_COMMAND_ENV."""

LAUNCH_COMMAND_ENV = "TRAIN_LAUNCH_COMMAND"
