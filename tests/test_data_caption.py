"""Automatic labelling (data/caption.py, data/caption_prompt.py, data/captioners.py) on the real sample footage:
the answer parser, a tiny random InternVL end to end, the Beam pipeline (in-process and two worker processes: the
sequential labeller's file byte for byte), a bad film among good ones, kill + resume from part files, and rule-based
labels -> prepare -> training steps."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from animegamer_jax.data import (caption, caption_prompt, captioners, clips, datasets, extract_features, label_schema,
                                 prepare, sample)
from animegamer_jax.data.films import films_of_dataset, list_film_dir
from configs import tiny
from tests.dataset_helpers import load_random_features, tiny_features_config
from tests.subproc import ROOT

CAST = ("Bunny", "Cyclist", "Driver")
# Hand-checked on the sample film: Big Buck Bunny clips 0-1, the cyclist of bikes.mp4 in clip 2,
# the driver of carphone in clips 5-6; clips 3-4 (cars, pedestrians) show none of the three.
EXPECTED_CHARACTERS = [["Bunny"], ["Bunny"], ["Cyclist"], [], [], ["Driver"], ["Driver"]]


def _cfg(**label_overrides):
    cfg = tiny.get_config()
    for k, v in label_overrides.items():
        cfg.label[k] = v
    return cfg


CHARS = os.path.join(ROOT, "data", "characters")  # shipped reference images of the sample film's cast


@pytest.fixture(scope="module")
def footage(tmp_path_factory):
    """The sample film (160x90) and the shipped CHARS/<name>/ref.png."""
    root = tmp_path_factory.mktemp("label")
    film = str(root / "sample_film.mp4")
    sample.make_sample_film(film, size=(160, 90))
    return {"film": film, "chars": CHARS, "root": root}


def _clip_lines(path):
    """The clip / unlabelled objects of a labels file (complete lines only)."""
    out = []
    for line in open(path, encoding="utf-8"):
        if line.startswith("{") and line.endswith("\n"):
            obj = json.loads(line)
            if obj["type"] in ("clip", "unlabelled"):
                out.append(obj)
    return out


# ----------------------------------------------------------------------------- parser

REAL_ANSWER = ('{"characters": ["Bunny"], "adverb": "slowly", "verb": "crawl out of burrow", "time": "day", '
               '"place": "meadow", "social": 0, "entertainment": 2, "stamina": -1, '
               '"reason": "waking up in the sun is pleasant but takes effort"}')


def _parse(text, cast=CAST):
    return caption_prompt.parse_answer(text, cast, "film", 3, 6.5)


def test_parser_well_formed_and_prose_around_json():
    lab, reason = _parse(REAL_ANSWER)
    assert lab.instruction == "Character: Bunny; Motion: slowly crawl out of burrow; Background: day meadow."
    assert lab.state_changes() == (0, 2, -1) and (lab.film_id, lab.clip_index, lab.start) == ("film", 3, 6.5)
    assert reason == "waking up in the sun is pleasant but takes effort"
    chatty = ("Sure! Here is the label for this clip:\n```json\n"
              '{"characters": ["bunny", "Driver"], "adverb": "Quickly", "verb": "run  across the road",\n'
              ' "time": "night", "place": "city street", "social": "+2", "entertainment": 1, "stamina": -3,\n'
              ' "reason": "a chase {with friends} is exciting"}\n```\nLet me know if you need anything else {}.')
    lab, _ = _parse(chatty)
    assert lab.characters == ("Bunny", "Driver")  # names come back spelled as in the cast
    assert lab.action == "quickly run across the road" and lab.background == "night city street"
    assert lab.state_changes() == (2, 1, -3)
    none, _ = _parse(REAL_ANSWER.replace('["Bunny"]', "[]"))
    assert none.characters == () and none.instruction.startswith("Character: none;")


@pytest.mark.parametrize("text, kind, match", [
    ("The bunny slowly crawls out of its burrow on a sunny day.", "no JSON object", "no JSON object"),
    ('{"characters": ["Bunny"], "adverb": "slowly", "verb": "crawl", ', "malformed JSON", "does not parse"),
    (REAL_ANSWER.replace('"stamina": -1, ', ""), "missing keys", r"lacks \['stamina'\]"),
    (REAL_ANSWER.replace('"time": "day", "place": "meadow", ', ""), "missing keys", r"lacks \['time', 'place'\]"),
    (REAL_ANSWER.replace('"entertainment": 2', '"entertainment": 7'), "state out of range", "'entertainment'.*got 7"),
    (REAL_ANSWER.replace('"social": 0', '"social": -6'), "state out of range", "'social'.*got -6"),
    (REAL_ANSWER.replace('"stamina": -1', '"stamina": "a lot"'), "bad state", "'stamina'"),
    (REAL_ANSWER.replace('"stamina": -1', '"stamina": 1.5'), "bad state", "'stamina'"),
    (REAL_ANSWER.replace('["Bunny"]', '["Bunny", "Qiqi"]'), "unknown character", r"\['Qiqi'\].*cast is"),
    (REAL_ANSWER.replace('["Bunny"]', '"Bunny"'), "bad characters", "list of names"),
    (REAL_ANSWER.replace('"slowly"', '"very slowly"'), "bad text field", "'adverb'"),
    (REAL_ANSWER.replace('"meadow"', '""'), "bad text field", "'place'"),
])
def test_parser_rejects_bad_answers(text, kind, match):
    with pytest.raises(caption_prompt.AnswerError, match=match) as e:
        _parse(text)
    assert e.value.kind == kind


def test_labels_file_unlabelled_lines_round_trip(tmp_path):
    p = tmp_path / "l.jsonl"
    lab, _ = _parse(REAL_ANSWER)
    p.write_text("\n".join([json.dumps({"type": "film", "film_id": "film", "characters": list(CAST)}),
                            json.dumps(lab.to_json()),
                            json.dumps({"type": "unlabelled", "film_id": "film", "clip_index": 4, "start": 8.0,
                                        "reason": "no JSON object in the answer"})]) + "\n")
    got = label_schema.read_labels(str(p))
    assert got.clips[("film", 3)] == lab and got.unlabelled == {("film", 4): (8.0, "no JSON object in the answer")}
    with open(p, "a") as f:
        f.write(json.dumps({"type": "unlabelled", "film_id": "film", "clip_index": 3, "start": 6.5}) + "\n")
    with pytest.raises(label_schema.LabelError, match="duplicate"):
        label_schema.read_labels(str(p))


# ----------------------------------------------------------------------------- tiny InternVL end to end


def _tiny_internvl(model_dir):
    """A random InternVL (Qwen2 text model) with the Mistral v0.1 sentencepiece, saved as an HF folder."""
    import shutil

    import mistral_common
    import torch
    from transformers import (InternVLConfig, InternVLForConditionalGeneration, InternVLVisionConfig, LlamaTokenizer,
                              Qwen2Config)
    from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

    spm = model_dir / "spm"
    spm.mkdir(parents=True)
    shutil.copy(os.path.join(os.path.dirname(mistral_common.__file__), "data", "tokenizer.model.v1"),
                spm / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(str(spm), extra_special_tokens={
        "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>"})
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.pad_token = tok.unk_token
    size = 28  # 2x2 patches of 14 px -> one token per image after InternVL's 0.5 pixel shuffle
    vision = InternVLVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  image_size=size, patch_size=14)
    text = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=tok.context_image_token_id,
                            image_seq_length=1)
    torch.manual_seed(0)
    InternVLForConditionalGeneration(config).save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    GotOcr2ImageProcessorPil(size={"height": size, "width": size}, crop_to_patches=False, max_patches=1).save_pretrained(str(model_dir))
    (model_dir / "processor_config.json").write_text(json.dumps({"processor_class": "InternVLProcessor",
                                                                "image_seq_length": 1}))
    (model_dir / "chat_template.jinja").write_text(  # InternVL3's ChatML layout, one <IMG_CONTEXT> per image
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% for c in message['content'] %}{% if c['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
        "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.mark.slow
def test_tiny_internvl_end_to_end(footage, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = tmp_path / "internvl"
    _tiny_internvl(model_dir)
    cfg = _cfg(max_new_tokens=12, batch_size=4)
    vlm = captioners.make_captioner(f"hf:{model_dir}", cfg.label)
    assert type(vlm.model).__name__ == "InternVLForConditionalGeneration"
    assert vlm.generate_kwargs == {"max_new_tokens": 12, "do_sample": False,
                                   "pad_token_id": vlm.processor.tokenizer.pad_token_id}
    assert str(vlm.device) == "cpu" and next(vlm.model.parameters()).dtype == vlm.dtype
    with pytest.raises(ValueError, match="unknown captioner 'internvl'"):
        captioners.make_captioner("internvl", cfg.label)
    record = tmp_path / "calls.jsonl"
    monkeypatch.setenv("LABEL_TEST_MODEL", str(model_dir))
    monkeypatch.setenv("LABEL_TEST_RECORD", str(record))

    out = tmp_path / "labels.jsonl"
    report = caption.label_films([("sample_film", footage["film"])], "py:tests.label_helpers:recording_hf", str(out), cfg,
                                 characters_dir=footage["chars"], progress=False)
    print(report.summary())
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    # What the model sees: 3 reference images + 4 frames, each <img> ... </img>.
    seen = calls[0]["seen"]
    assert seen["pixel_values"] == [7, 3, 28, 28] and seen["start_image"] == 7 and seen["context_image"] == 7
    assert "Bunny:" in seen["text"] and "Driver:" in seen["text"]
    # Batches of 4 then 3 clips, each asked once and then again with the stricter prompt.
    assert [[tuple(r[:2]) for r in c["requests"]] for c in calls] == [
        [(i, False) for i in range(4)], [(i, True) for i in range(4)],
        [(i, False) for i in range(4, 7)], [(i, True) for i in range(4, 7)]]
    assert all(r[2] == [4, 64, 96, 3] and r[3] == 7 for c in calls for r in c["requests"])
    # Random weights answer garbage: every clip ends unlabelled, with the reason, none dropped.
    assert (report.labelled, report.retried, report.unlabelled) == (0, 7, 7)
    assert set(report.reasons) <= {"no JSON object", "malformed JSON", "missing keys"}
    assert "labelled 0 / retried 7 / unlabelled 7" in report.summary()
    got = label_schema.read_labels(str(out))
    assert got.clips == {} and sorted(got.unlabelled) == [("sample_film", i) for i in range(7)]
    assert all("after 2 attempt(s)" in r for _, r in got.unlabelled.values())
    with pytest.raises(ValueError, match="no clips to write: every film failed or every clip is marked unlabelled"):
        prepare.prepare_dataset([("sample_film", footage["film"])], str(out), str(tmp_path / "ds"), cfg.data)
    sys.stdout.write(capsys.readouterr().out)


# ----------------------------------------------------------------------------- rule-based: resume, pipeline


def _label_cmd(footage, out, extra=()):
    return [sys.executable, "-m", "animegamer_jax.commands.data", "caption", "--config=configs/tiny.py",
            f"--film=sample_film={footage['film']}", f"--characters={footage['chars']}", f"--out={out}",
            "--noprogress", *extra]


def _parts(out):
    """The parts folder of labels file `out` (caption.py: one part file per captioned batch)."""
    return out.parent / f".{out.name}.parts"


@pytest.fixture(scope="module")
def reference_labels(footage):
    """Rule-based labels of the whole film in one uninterrupted run (Beam's DirectRunner in-process)."""
    out = footage["root"] / "reference.jsonl"
    report = caption.label_films([("sample_film", footage["film"])], "rule", str(out), _cfg(batch_size=2),
                                 characters_dir=footage["chars"], progress=False)
    assert (report.labelled, report.retried, report.unlabelled, report.total) == (7, 0, 0, 7)
    assert report.failed == [] and not _parts(out).exists()
    return out


@pytest.mark.slow
def test_rule_based_labels_match_the_footage(reference_labels):
    got = label_schema.read_labels(str(reference_labels))
    assert got.casts == {"sample_film": CAST}
    assert [list(got.clips[("sample_film", i)].characters) for i in range(7)] == EXPECTED_CHARACTERS
    first = got.clips[("sample_film", 0)]
    assert first.background.endswith("meadow") and first.action.split()[0] in ("slowly", "steadily")
    assert got.clips[("sample_film", 5)].background.endswith("street")


def test_pipeline_writes_the_sequential_labellers_file(footage, reference_labels):
    """The Beam pipeline's file is, byte for byte, what the sequential labeller wrote: the header, the
    film line, then one line per clip in clip order, each captioned alone."""
    cfg = _cfg()
    refs = caption.load_references(CHARS, cfg.label.max_references)
    header = {"format": 1, "captioner": "rule", "films": ["sample_film"], "cast": list(CAST),
              "plan": {k: cfg.data[k] for k in ("num_frames", "fps", "clip_seconds", "scene_threshold")},
              "size": [cfg.data.height, cfg.data.width], "num_frames": cfg.label.num_frames}
    lines = ["# animegamer-label " + json.dumps(header),
             json.dumps({"type": "film", "film_id": "sample_film", "characters": list(CAST)})]
    rule = captioners.RuleBasedCaptioner(cfg.label.match_threshold)
    specs, _, _ = clips.plan_film(footage["film"], "sample_film", cfg.data)
    for clip in clips.extract_clips(footage["film"], specs, cfg.data.height, cfg.data.width):
        x = caption.clip_input(0, clip, cfg.label.num_frames, cfg.data)
        request = captioners.CaptionRequest(("sample_film", x.spec.clip_index), x.frames, refs, x.motion_level,
                                            caption_prompt.build_prompt(refs, x.frames, x.motion_level))
        label, reason = caption_prompt.parse_answer(rule.caption([request])[0], CAST, "sample_film", x.spec.clip_index,
                                             x.spec.start_time)
        lines.append(json.dumps({**label.to_json(), "reason": reason}))
    assert len(lines) == 9
    assert reference_labels.read_text() == "".join(line + "\n" for line in lines)


@pytest.mark.slow
def test_two_worker_processes_write_the_same_file(footage, reference_labels, tmp_path):
    out = tmp_path / "labels.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    res = subprocess.run(_label_cmd(footage, out, [
        "--captioner=rule", "--config.label.batch_size=3",
        "--beam_pipeline_options=--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing"]),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "labelled 7 / retried 0 / unlabelled 0 of 7 clip(s)" in res.stdout and "holds 7 of 7 clips" in res.stdout
    assert out.read_bytes() == reference_labels.read_bytes() and not _parts(out).exists()


@pytest.mark.slow
def test_a_bad_film_fails_alone(footage, reference_labels, tmp_path, monkeypatch):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video")
    builds = tmp_path / "builds.txt"
    monkeypatch.setenv("LABEL_TEST_BUILDS", str(builds))
    out = tmp_path / "labels.jsonl"
    films = [("broken", str(bad)), ("sample_film", footage["film"])]
    report = caption.label_films(films, "py:tests.label_helpers:counting_rule", str(out), _cfg(batch_size=2),
                                 characters_dir=footage["chars"], progress=False)
    assert [f for f, _ in report.failed] == ["broken"] and "cannot open as a video" in report.failed[0][1]
    assert report.counters["films_failed"] == 1
    assert (report.labelled, report.unlabelled, report.total) == (7, 0, 7)
    assert f"; 1 film(s) failed: broken ({bad}: cannot open as a video" in report.summary()
    assert _clip_lines(out) == _clip_lines(reference_labels)  # the good film labelled as if alone
    got = label_schema.read_labels(str(out))
    assert got.casts == {"broken": CAST, "sample_film": CAST}
    assert len(builds.read_text().splitlines()) == 1  # one captioner for the run's 4 batches


def test_resume_from_parts_and_a_torn_file(footage, reference_labels, tmp_path):
    """A kill leaves part files (and, from the version that appended per batch, a labels file with a
    torn last line): the rerun captions only the other clips and writes the uninterrupted run's file."""
    ref = reference_labels.read_text().splitlines(keepends=True)  # header, film line, clips 0..6
    out = tmp_path / "labels.jsonl"
    out.write_text("".join(ref[:4]) + ref[4][:25])  # clips 0, 1 and a torn clip 2
    parts = _parts(out)
    parts.mkdir()
    (parts / "header.json").write_text(ref[0][len(caption.HEADER_PREFIX):])
    (parts / "film00000-clip000003.jsonl").write_text("".join(ref[5:7]))  # clips 3, 4
    (parts / ".film00000-clip000005.jsonl.tmp-0123abcd").write_text(ref[7][:10])  # a write the kill cut short
    report = caption.label_films([("sample_film", footage["film"])], "rule", str(out), _cfg(batch_size=2),
                                 characters_dir=footage["chars"], progress=False)
    assert (report.already, report.labelled, report.total) == (4, 3, 7)  # clips 2, 5, 6 captioned
    assert "(4 already in the file)" in report.summary() and "holds 7 of 7 clips" in report.summary()
    assert out.read_bytes() == reference_labels.read_bytes() and not parts.exists()


@pytest.mark.slow
def test_killed_and_resumed_labels_every_clip_once(footage, reference_labels, tmp_path):
    out = tmp_path / "labels.jsonl"
    parts = _parts(out)
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    flags = ["--captioner=py:tests.label_helpers:stalling_rule", "--config.label.batch_size=2"]
    proc = subprocess.Popen(_label_cmd(footage, out, flags), cwd=ROOT, env=dict(env, STALL_AFTER_BATCHES="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(list(parts.glob("film*.jsonl"))) < 2:
        time.sleep(0.05)
    assert proc.poll() is None, f"exited before it could be killed: {proc.communicate()}"
    time.sleep(0.2)  # it now hangs in the captioner of batch 3
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # written once, at the end
    before = [obj for p in sorted(parts.glob("film*.jsonl")) for obj in _clip_lines(p)]
    assert [c["clip_index"] for c in before] == [0, 1, 2, 3]  # two batches of two
    res = subprocess.run(_label_cmd(footage, out, flags), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"({len(before)} already in the file)" in res.stdout and "holds 7 of 7 clips" in res.stdout
    after = _clip_lines(out)
    assert [c["clip_index"] for c in after] == list(range(7))  # none twice, none missed
    assert after[:len(before)] == before and not parts.exists()
    assert after == _clip_lines(reference_labels)  # identical to the uninterrupted run


def test_resume_refuses_other_runs_and_user_files(footage, reference_labels, tmp_path):
    cfg = _cfg()
    films = [("sample_film", footage["film"])]
    user = tmp_path / "mine.jsonl"
    user.write_text(open(os.path.join(ROOT, "data", "sample_labels.jsonl"), encoding="utf-8").read())
    before = user.read_text()
    with pytest.raises(FileExistsError, match="not written by this command"):
        caption.label_films(films, "rule", str(user), cfg, characters_dir=footage["chars"], overwrite=True,
                            progress=False)
    assert user.read_text() == before
    stray = tmp_path / "new.jsonl"
    _parts(stray).mkdir()
    (_parts(stray) / "notes.txt").write_text("not ours")
    with pytest.raises(FileExistsError, match="not written by this command"):
        caption.label_films(films, "rule", str(stray), cfg, characters_dir=footage["chars"], overwrite=True,
                            progress=False)
    assert (_parts(stray) / "notes.txt").read_text() == "not ours" and not stray.exists()
    copy = tmp_path / "copy.jsonl"
    copy.write_text(reference_labels.read_text())
    with pytest.raises(ValueError, match="unknown captioner 'internvl'"):
        caption.label_films(films, "internvl", str(copy), cfg, characters_dir=footage["chars"], progress=False)
    moved = copy.read_text().replace('"clip_index": 2, "start": 8.32,', '"clip_index": 2, "start": 9.32,')
    assert moved != copy.read_text()
    copy.write_text(moved)
    with pytest.raises(ValueError, match="film 'sample_film' clip 2 does not match the clip plan"):
        caption.label_films(films, "rule", str(copy), cfg, characters_dir=footage["chars"], progress=False)
    assert copy.read_text() == moved
    cfg.data.clip_seconds = 1.0
    with pytest.raises(ValueError, match="another labelling run.*clip_seconds"):
        caption.label_films(films, "rule", str(copy), cfg, characters_dir=footage["chars"], progress=False)
    assert copy.read_text() == moved


@pytest.mark.slow
def test_rule_labels_prepare_and_train(footage, reference_labels, tmp_path):
    """One pipeline: rule-based labels -> prepare -> a few phase-b (MLLM) steps on the labelled clips."""
    import jax

    from animegamer_jax.train import pipeline

    cfg = _cfg()
    ds = str(tmp_path / "ds")

    report = prepare.prepare_dataset([("sample_film", footage["film"])], str(reference_labels), ds, cfg.data)
    assert report.num_clips == 7 and report.unlabelled == []
    # stand-ins for the (random at tiny size) T5 / CLIP features: no T5 / CLIP compile
    cfg.data.features_dir = str(tmp_path / "features")
    extract_features.extract_features(ds, cfg.data.features_dir, load_random_features, tiny_features_config(),
                                      batch_size=4)
    index = datasets.read_index(ds)
    lab = label_schema.read_labels(str(reference_labels))
    assert [r["instruction"] for r in index["clips"]] == [lab.clips[("sample_film", i)].instruction for i in range(7)]
    assert [r["states"][1:] for r in index["clips"]] == [list(lab.clips[("sample_film", i)].state_changes())
                                                          for i in range(7)]
    cfg.data.dataset_dir = ds
    t = cfg.train
    t.phase, t.num_steps, t.global_batch_size, t.warmup_steps = "b", 2, 2, 1
    t.checkpoint_every, t.log_every, t.progress, t.async_checkpoint = 100, 1, False, False
    t.precomputed_features = True
    cfg.data.max_turns = 2  # shorter sequences: a cheaper compile
    out = pipeline.run_phase(cfg, str(tmp_path / "run"), compiler_options={"xla_backend_optimization_level": 0})
    from animegamer_jax.train import metrics

    scalars = metrics.read_scalars(str(tmp_path / "run" / "tensorboard"))
    losses = [v for k, series in scalars.items() if k.endswith("loss") for _, v in series]
    assert len(losses) >= 2 and all(np.isfinite(losses)), scalars.keys()
    assert os.path.isdir(out) and jax.device_count() >= 1


@pytest.mark.slow
def test_prepare_leaves_out_unlabelled_clips(footage, reference_labels, tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    lines = reference_labels.read_text().splitlines()
    k = next(n for n, x in enumerate(lines) if '"clip_index": 3,' in x)
    lines[k] = json.dumps({"type": "unlabelled", "film_id": "sample_film", "clip_index": 3,
                           "start": json.loads(lines[k])["start"], "reason": "no JSON object in the answer"})
    mixed.write_text("\n".join(lines) + "\n")
    report = prepare.prepare_dataset([("sample_film", footage["film"])], str(mixed), str(tmp_path / "ds"),
                                     _cfg().data)
    assert report.num_clips == 6 and report.unlabelled == [("sample_film", 3, "no JSON object in the answer")]
    assert "left out 1 clip(s) marked unlabelled" in report.summary()
    index = datasets.read_index(str(tmp_path / "ds"))
    assert [r["clip_index"] for r in index["clips"]] == [0, 1, 2, 4, 5, 6]
    assert index["unlabelled"] == [{"film_id": "sample_film", "clip_index": 3, "reason": "no JSON object in the answer"}]
    assert films_of_dataset(str(tmp_path / "ds")) == [("sample_film", os.path.abspath(footage["film"]))]
    films = tmp_path / "films"
    films.mkdir()
    os.symlink(footage["film"], films / "my_film.mp4")
    (films / "notes.txt").write_text("not a film")
    assert list_film_dir(str(films)) == [("my_film", str(films / "my_film.mp4"))]
