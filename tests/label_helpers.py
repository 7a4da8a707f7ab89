"""Captioner factories for label tests run as `--captioner=py:tests.label_helpers:NAME`."""

import time

from animegamer_jax.data import captioners


class _Slow:
    """The rule-based captioner, 0.5 s per batch: slow enough for a test to kill the run mid-way."""

    name = "rule-slow"

    def __init__(self, label_cfg):
        self.inner = captioners.RuleBasedCaptioner(float(label_cfg.match_threshold))

    def caption(self, requests):
        time.sleep(0.5)
        return self.inner.caption(requests)


def slow_rule(label_cfg):
    return _Slow(label_cfg)
