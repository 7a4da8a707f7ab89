"""Captioners for automatic clip labelling (paper Sec. 3.3): a local vision-language model, or rules.

A captioner turns a batch of `CaptionRequest`s (a clip's uniformly sampled frames, the reference images
of the film's characters, the clip's optical-flow motion level and the interleaved text + image prompt
that data/caption_prompt.py built) into one raw text answer per request. Answers are JSON objects with
the fields of `ANSWER_KEYS`; data/caption_prompt.py parses and validates them (data/caption.py retries or
marks a clip unlabelled), so a captioner never has to be trusted.

Implementations:
- `HFCaptioner`: any transformers image-text-to-text model in a local folder (InternVL through
  `InternVLForConditionalGeneration`, or whatever `AutoModelForImageTextToText` loads), prompted through
  its processor's chat template; generation settings (greedy or sampling, max new tokens, dtype, device)
  come from the `label` config section.
- `RuleBasedCaptioner`: deterministic colour / optical-flow rules; the pipeline tests' captioner and a
  baseline a VLM should beat.

`make_captioner("hf:/path/to/vlm" | "rule" | "py:package.module:factory", label_cfg)` builds one (the
labelling pipeline: once per Beam worker, so a model is loaded once per worker, never per clip); a
`py:` factory is called with the `label` config section and returns any object with `name` and
`caption(requests) -> list[str]`. `check_spec` checks a spec without building anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Protocol

import cv2
import numpy as np
from etils import epath
from PIL import Image

# Fields of one answer (a flat JSON object; see data/caption_prompt.py for the prompt and the parser):
#   characters: names from the cast; adverb + verb: the motion ("slowly" + "crawl out of burrow");
#   time + place: the background ("day" + "meadow"); social / entertainment / stamina: integer changes
#   in -5..5; reason: one short sentence for the state changes.
ANSWER_KEYS = ("characters", "adverb", "verb", "time", "place", "social", "entertainment", "stamina", "reason")


@dataclasses.dataclass(frozen=True)
class CaptionRequest:
    """One clip to caption.

    Attributes:
      clip: (film_id, clip_index), for messages.
      frames: uint8 [N, H, W, 3] RGB, the clip's uniformly sampled frames (N = config.label.num_frames).
      references: character name -> reference images, each uint8 [h, w, 3] RGB (the film's cast).
      motion_level: 1..5, from the optical-flow estimator (data/motion.py) on all the clip's frames.
      prompt: the message, in order: str parts are text, np.ndarray parts are images (uint8 [h, w, 3]).
      strict: True when this is a retry with the stricter prompt.
    """

    clip: tuple[str, int]
    frames: np.ndarray
    references: Mapping[str, Sequence[np.ndarray]]
    motion_level: int
    prompt: tuple[str | np.ndarray, ...]
    strict: bool = False


class Captioner(Protocol):
    """What data/caption.py calls: one raw answer (text) per request, in order."""

    name: str

    def caption(self, requests: Sequence[CaptionRequest]) -> list[str]:
        """One raw text answer per request, in the same order (any text; data/caption.py validates it)."""
        ...


# ----------------------------------------------------------------------------- transformers VLM


def _torchvision_usable() -> bool:
    try:
        import torchvision  # noqa: F401  # optional
    except Exception:  # missing, or a build that does not load beside this torch
        return False
    return True


def _read_json(path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _image_only_internvl_processor(model_dir: str):
    """InternVL's processor without its video processor.

    transformers' `InternVLProcessor` insists on a video processor, and the InternVL video processor
    needs torchvision; labelling sends images only, so where torchvision is unusable (this repository's
    CPU environment: torchvision does not load beside torch 2.13) the processor is assembled from the
    folder's tokenizer, image processor (its PIL backend), `processor_config.json` (image_seq_length)
    and chat template, with no video processor.
    """
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, InternVLProcessor  # optional

    class ImageOnlyInternVLProcessor(InternVLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    root = epath.Path(model_dir)
    proc_cfg = _read_json(root / "processor_config.json")
    seq = int(proc_cfg.get("image_seq_length", AutoConfig.from_pretrained(model_dir).image_seq_length))
    template = None
    if (root / "chat_template.jinja").exists():
        template = (root / "chat_template.jinja").read_text()
    elif (root / "chat_template.json").exists():
        template = _read_json(root / "chat_template.json").get("chat_template")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    template = template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(f"{model_dir}: no chat template (chat_template.jinja / chat_template.json / tokenizer)")
    return ImageOnlyInternVLProcessor(image_processor=AutoImageProcessor.from_pretrained(model_dir),
                                      tokenizer=tokenizer, video_processor=None, image_seq_length=seq,
                                      chat_template=template)


def load_processor(model_dir: str):
    """The model folder's processor (AutoProcessor); InternVL without torchvision: images only."""
    from transformers import AutoConfig, AutoProcessor  # optional

    if AutoConfig.from_pretrained(model_dir).model_type == "internvl" and not _torchvision_usable():
        return _image_only_internvl_processor(model_dir)
    return AutoProcessor.from_pretrained(model_dir)


_DTYPES = ("bfloat16", "float16", "float32")


class HFCaptioner:
    """A local transformers vision-language model (InternVL, or any AutoModelForImageTextToText).

    Args:
      model_dir: local folder with the model's config, weights, processor files and chat template
        (what `save_pretrained` writes; nothing is downloaded).
      label_cfg: the `label` config section: greedy / temperature / top_p, max_new_tokens, dtype, device.

    Raises:
      ValueError: an unknown dtype; OSError (from transformers): a folder without a model.
    """

    def __init__(self, model_dir: str, label_cfg):
        import torch  # optional
        from transformers import AutoModelForImageTextToText  # optional

        if str(label_cfg.dtype) not in _DTYPES:
            raise ValueError(f"config.label.dtype must be one of {_DTYPES}, got {label_cfg.dtype!r}")
        device = str(label_cfg.device)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = f"hf:{model_dir}"
        self.device = torch.device(device)
        self.dtype = getattr(torch, str(label_cfg.dtype))
        self.processor = load_processor(model_dir)
        tok = getattr(self.processor, "tokenizer", None)
        if tok is not None:
            tok.padding_side = "left"  # batched generation of a decoder-only LM
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=self.dtype).to(self.device).eval()
        self.generate_kwargs = {"max_new_tokens": int(label_cfg.max_new_tokens),
                                "do_sample": not bool(label_cfg.greedy)}
        if not label_cfg.greedy:
            self.generate_kwargs.update(temperature=float(label_cfg.temperature), top_p=float(label_cfg.top_p))
        if tok is not None and tok.pad_token_id is not None:
            self.generate_kwargs["pad_token_id"] = tok.pad_token_id

    def conversation(self, request: CaptionRequest) -> list[dict]:
        """The chat message of one request (text and PIL image parts, in prompt order)."""
        content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image", "image": Image.fromarray(p)}
                   for p in request.prompt]
        return [{"role": "user", "content": content}]

    def caption(self, requests: Sequence[CaptionRequest]) -> list[str]:
        """Generates the answers of a batch in one `generate` call (left-padded prompts); returns the
        decoded new tokens of each, special tokens removed."""
        import torch  # optional

        if not requests:
            return []
        inputs = self.processor.apply_chat_template(
            [self.conversation(r) for r in requests], add_generation_prompt=True, tokenize=True,
            return_dict=True, return_tensors="pt", processor_kwargs={"padding": True})
        inputs = {k: (v.to(self.device, self.dtype) if torch.is_floating_point(v) else v.to(self.device))
                  for k, v in inputs.items()}
        with torch.inference_mode():
            out = self.model.generate(**inputs, **self.generate_kwargs)
        new = out[:, inputs["input_ids"].shape[1]:]
        return [str(t) for t in self.processor.batch_decode(new, skip_special_tokens=True)]


# ----------------------------------------------------------------------------- rule-based baseline


def _hs_histogram(image: np.ndarray) -> np.ndarray:
    """Normalised hue x saturation histogram (18 x 4 bins) of an RGB uint8 image."""
    hsv = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2HSV)
    hist = cv2.calcHist([hsv], [0, 1], None, [18, 4], [0, 180, 0, 256]).ravel()
    return hist / max(float(hist.sum()), 1.0)


_ADVERBS = {1: "barely", 2: "slowly", 3: "steadily", 4: "quickly", 5: "rapidly"}


class RuleBasedCaptioner:
    """Deterministic baseline captioner (no model): answers from colour statistics and motion.

    - characters: a character is present when the hue x saturation histogram intersection of one of its
      reference images with one of the frames is >= `match_threshold` (names in cast order);
    - adverb: from the optical-flow motion level (1 barely, 2 slowly, 3 steadily, 4 quickly, 5 rapidly);
      verb: "stay still" at level 1, else "move left/right/up/down" from the phase-correlation shift
      between the first and last frame ("move in place" when it is under 1 px);
    - time: mean brightness (HSV value) > 0.45 "day", > 0.25 "evening", else "night"; place: "street"
      when most pixels are unsaturated, else by dominant hue: green "meadow", blue "sky", others "room";
    - states: stamina 2 - level (rest recovers, fast motion tires), entertainment +1 from level 3,
      social +1 when two or more characters are present.
    """

    def __init__(self, match_threshold: float = 0.6):
        self.name = "rule"
        self.match_threshold = float(match_threshold)

    def answer(self, request: CaptionRequest) -> dict:
        """The answer object (ANSWER_KEYS) for one request."""
        frames = np.asarray(request.frames)
        frame_hists = [_hs_histogram(f) for f in frames]
        present = []
        for name, refs in request.references.items():
            best = max((float(np.minimum(_hs_histogram(r), h).sum()) for r in refs for h in frame_hists), default=0.0)
            if best >= self.match_threshold:
                present.append(name)
        level = int(request.motion_level)
        if level <= 1:
            verb = "stay still"
        else:
            a, b = (cv2.cvtColor(np.ascontiguousarray(frames[i]), cv2.COLOR_RGB2GRAY).astype(np.float64)
                    for i in (0, -1))
            (dx, dy), _ = cv2.phaseCorrelate(a, b)
            if max(abs(dx), abs(dy)) < 1.0:
                verb = "move in place"
            elif abs(dx) >= abs(dy):
                verb = "move right" if dx > 0 else "move left"
            else:
                verb = "move down" if dy > 0 else "move up"
        hsv = np.concatenate([cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2HSV).reshape(-1, 3) for f in frames])
        value = float(hsv[:, 2].mean()) / 255.0
        time = "day" if value > 0.45 else "evening" if value > 0.25 else "night"
        saturated = hsv[hsv[:, 1] >= 64]
        if len(saturated) < 0.5 * len(hsv):
            place = "street"
        else:
            hue = np.bincount((saturated[:, 0] // 10).astype(int), minlength=18).argmax() * 10 + 5
            place = "meadow" if 35 <= hue < 85 else "sky" if 85 <= hue < 130 else "room"
        stamina = int(np.clip(2 - level, -5, 5))
        entertainment = 1 if level >= 3 else 0
        social = 1 if len(present) >= 2 else 0
        return {"characters": present, "adverb": _ADVERBS.get(level, "quickly"), "verb": verb, "time": time,
                "place": place, "social": social, "entertainment": entertainment, "stamina": stamina,
                "reason": f"rule-based: motion level {level}, {len(present)} character(s) matched"}

    def caption(self, requests: Sequence[CaptionRequest]) -> list[str]:
        """The `answer` of each request as JSON text."""
        return [json.dumps(self.answer(r)) for r in requests]


# ----------------------------------------------------------------------------- factory


def check_spec(spec: str) -> None:
    """Raises ValueError (listing the three forms) unless `spec` is a form make_captioner takes; loads
    nothing, so a command can check its flag before workers build the captioner."""
    if not (spec == "rule" or (spec.startswith("hf:") and len(spec) > 3)
            or (spec.startswith("py:") and spec.count(":") == 2)):
        raise ValueError(f"unknown captioner {spec!r}: use hf:/local/vlm/folder, rule, or py:package.module:factory")


def make_captioner(spec: str, label_cfg) -> Captioner:
    """Builds a captioner from a command-line spec (data/caption.py: once per Beam worker, in a DoFn's setup).

    Args:
      spec: "hf:/local/model/folder" (HFCaptioner), "rule" (RuleBasedCaptioner), or
        "py:package.module:factory" (factory(label_cfg) returns a Captioner; the module must be importable
        where the captioner runs).
      label_cfg: the `label` config section.

    Raises:
      ValueError: an unknown spec (check_spec).
    """
    check_spec(spec)
    if spec == "rule":
        return RuleBasedCaptioner(float(label_cfg.match_threshold))
    if spec.startswith("hf:"):
        return HFCaptioner(spec[3:], label_cfg)
    module, attr = spec[3:].split(":")
    return getattr(importlib.import_module(module), attr)(label_cfg)
