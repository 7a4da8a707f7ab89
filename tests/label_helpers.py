"""Captioner factories for label tests run as `--captioner=py:tests.label_helpers:NAME`."""

import os
import time

from animegamer_jax.data import captioners


class _Stalling:
    """The rule-based captioner that, when STALL_AFTER_BATCHES=N is set, hangs after N batches (so a
    test can kill the run mid-way at a known point); without it, the plain rule-based answers."""

    name = "rule-stalling"

    def __init__(self, label_cfg):
        self.inner = captioners.RuleBasedCaptioner(float(label_cfg.match_threshold))
        self.stall_after = int(os.environ.get("STALL_AFTER_BATCHES", "0"))
        self.calls = 0

    def caption(self, requests):
        if self.stall_after and self.calls >= self.stall_after:
            time.sleep(600)
        self.calls += 1
        return self.inner.caption(requests)


def stalling_rule(label_cfg):
    return _Stalling(label_cfg)
