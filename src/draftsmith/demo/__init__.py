"""The main job on the built-in default: every stage, end to end, on a tiny target built locally."""

from draftsmith.demo.pipeline import DemoConfig, DemoResult, run_demo

__all__ = ["DemoConfig", "DemoResult", "run_demo"]
