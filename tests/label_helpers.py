"""Captioner factories for label tests run as `--captioner=py:tests.label_helpers:NAME`."""

import json
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


def counting_rule(label_cfg):
    """`--captioner=py:tests.label_helpers:counting_rule`: the rule-based captioner, each construction
    appended as a line to $LABEL_TEST_BUILDS (the pipeline must build one per worker, not per batch)."""
    with open(os.environ["LABEL_TEST_BUILDS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    return captioners.RuleBasedCaptioner(float(label_cfg.match_threshold))


class _RecordingHF:
    """An HFCaptioner ($LABEL_TEST_MODEL) that appends, per caption() call, a JSON line to
    $LABEL_TEST_RECORD: the requests (clip index, strict, frames shape, images in the prompt) and the
    answers; the first call also records what the model sees of the first request."""

    def __init__(self, label_cfg):
        self.vlm = captioners.HFCaptioner(os.environ["LABEL_TEST_MODEL"], label_cfg)
        self.name = self.vlm.name
        self.record = os.environ["LABEL_TEST_RECORD"]

    def caption(self, requests):
        call = {"requests": [(r.clip[1], r.strict, list(r.frames.shape), sum(not isinstance(p, str) for p in r.prompt))
                             for r in requests]}
        if not os.path.exists(self.record):
            vlm = self.vlm
            inputs = vlm.processor.apply_chat_template([vlm.conversation(requests[0])], add_generation_prompt=True,
                                                       tokenize=True, return_dict=True, return_tensors="pt")
            tok = vlm.processor.tokenizer
            ids = inputs["input_ids"][0].tolist()
            call["seen"] = {"pixel_values": list(inputs["pixel_values"].shape),
                            "start_image": ids.count(tok.start_image_token_id),
                            "context_image": ids.count(tok.context_image_token_id), "text": tok.decode(ids)}
        call["answers"] = self.vlm.caption(requests)
        with open(self.record, "a") as f:
            f.write(json.dumps(call) + "\n")
        return call["answers"]


def recording_hf(label_cfg):
    """`--captioner=py:tests.label_helpers:recording_hf` (see _RecordingHF)."""
    return _RecordingHF(label_cfg)
