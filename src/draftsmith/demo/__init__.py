"""The main job on the built-in default: every stage, end to end, on a tiny target built locally."""

from draftsmith.demo.config import DemoConfig, DemoResult
from draftsmith.demo.pipeline import run_demo

__all__ = ["DemoConfig", "DemoResult", "run_demo"]
