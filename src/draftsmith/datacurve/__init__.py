"""`draftsmith plan data`: how much regenerated data a drafter needs, measured as a curve and joined to the plan.

It trains and evaluates (two stages) and plans (a third), so like the demo and the gates it composes
stages from above them; `draftsmith.cli` adds it to the `plan` command group.
"""

from draftsmith.datacurve.config import DataCurveConfig
from draftsmith.datacurve.summary import DataCurveSummary

__all__ = ["DataCurveConfig", "DataCurveSummary", "plan_data"]


def plan_data(config: DataCurveConfig, log=None) -> DataCurveSummary:
    """Measure, fit, predict and plan; writes curve.json (and curve.png) into `config.out`."""
    from draftsmith.datacurve.runner import plan_data as run

    return run(config, **({"log": log} if log else {}))
