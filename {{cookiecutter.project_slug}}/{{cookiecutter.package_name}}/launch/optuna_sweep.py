"""-m with hydra/sweeper=optuna: Optuna's sampler proposes each trial, each trial its own torchrun job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .checks import describe_composition_error
from .keys import LaunchError
from .plan import Launch
from .supervise import Forwarder
from .sweep_point import run_point

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from optuna.distributions import BaseDistribution

OPTUNA_SETTINGS: dict[str, Any] = {"n_trials": 10, "direction": "minimize", "metric": "val_loss", "seed": 0}


def optuna_sweep(launch: Launch, overrides: list[str], sweep_dir: Path, forwarder: Forwarder) -> list[dict]:
    """`hydra/sweeper=optuna`: Optuna's TPE sampler proposes each trial from the search space
    (`interval(a,b)`, `tag(log,interval(a,b))`, `choice(...)`, `range(...)`, comma lists), and each
    trial is its own torchrun job, as with the basic sweep. `hydra.sweeper.n_trials`, `.direction`,
    `.metric` (a final validation figure, default val_loss) and `.seed` set the study. Launched again
    with SWEEP_DIR, finished trials are told to the study again and an interrupted one resumes."""
    try:
        import optuna
    except ImportError:
        raise LaunchError("hydra/sweeper=optuna needs Optuna: pip install optuna") from None
    settings = dict(OPTUNA_SETTINGS)
    plain = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith("hydra.sweeper.") and key.split(".", 2)[2].replace("sampler.", "") in settings:
            name = key.split(".", 2)[2].replace("sampler.", "")
            settings[name] = type(OPTUNA_SETTINGS[name])(value)
        elif not key.startswith(("hydra/sweeper", "hydra.sweeper.")):
            plain.append(item)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception as error:
        raise LaunchError(describe_composition_error(error)) from None
    fixed = [cast(str, override.input_line) for override in parsed if not override.is_sweep_override()]
    space = {override.get_key_element(): distribution(override) for override in parsed if override.is_sweep_override()}
    if not space:
        raise LaunchError("hydra/sweeper=optuna found no search space: give e.g. 'optim.lr=interval(0.01,0.2)'")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction=settings["direction"], sampler=optuna.samplers.TPESampler(seed=int(settings["seed"]))
    )
    print(f"sweep dir: {sweep_dir} (optuna, {settings['n_trials']} trials)", flush=True)
    rows = []
    for index in range(int(settings["n_trials"])):
        run_dir = sweep_dir / f"{index:03d}_trial"
        status_file = run_dir / "sweep_point.json"
        if status_file.is_file():  # this trial's parameters were drawn before: the same again
            study.enqueue_trial(json.loads(status_file.read_text())["params"])
        trial = study.ask(space)
        point = [*fixed, *(f"{key}={value}" for key, value in trial.params.items())]
        row = run_point(launch, index, point, run_dir, forwarder, params=trial.params)
        rows.append(row)
        value = row["final"].get(str(settings["metric"]))
        if row["status"] == "stopped":
            return rows
        if row["status"] == "done" and isinstance(value, int | float):
            study.tell(trial, float(value))
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    done = [row for row in rows if row["status"] == "done"  # a figure not finite is a string ("NaN"): no pick
            and isinstance(row["final"].get(str(settings["metric"])), int | float)]  # fmt: skip
    if done:
        pick = min if settings["direction"] == "minimize" else max
        best = pick(done, key=lambda row: row["final"][str(settings["metric"])])
        print(f"best trial: {best['point']} ({' '.join(best['overrides'])})", flush=True)
    return rows


def distribution(override: Override) -> BaseDistribution:
    """Optuna's distribution for a Hydra sweep override."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    sweep = override.value()
    if isinstance(sweep, IntervalSweep):
        log = "log" in sweep.tags
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):
            return IntDistribution(sweep.start, sweep.end, log=log)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log)  # type: ignore[arg-type]
    if isinstance(sweep, RangeSweep):
        values = list(sweep.range())
        if all(isinstance(value, int) for value in values) and len(values) > 1:
            return IntDistribution(values[0], values[-1], step=values[1] - values[0])
        return CategoricalDistribution(values)
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution(cast(list[Any], sweep.list))  # Optuna warns of a choice it cannot store
    raise LaunchError(f"{override}: not a search space Optuna can sample")
