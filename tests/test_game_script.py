"""Game-script parsing of good and bad files, with the error text asserted."""

import json

import pytest

from animegamer_jax.data import label_schema
from animegamer_jax.game import script
from animegamer_jax.inference import instructions


def _write(tmp_path, name, content, mode="w"):
    p = tmp_path / name
    if mode == "wb":
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return str(p)


def test_shipped_script_parses():
    game = script.load_script("data/games/bunny.txt")
    assert game.game_id == "bunny"
    assert len(game.turns) == 4
    t = game.turns[0]
    assert t.characters == ("Bunny",) and t.motion == "slowly walk out of the burrow"
    assert t.background == "day meadow"
    assert t.text == "Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow."


def test_sample_tour_uses_the_labels_words():
    """make demo's second game asks for the three sample films' shots in one training variant's clip order
    (a subsequence of sample_slow's clips) and in the words of its labels."""
    game = script.load_script("data/games/sample_tour.txt")
    assert game.game_id == "sample_tour" and len(game.turns) == 10
    assert {t.characters for t in game.turns} >= {("Bunny",), ("Pedestrian",), ("Driver",), ("none",)}
    slow = sorted(((i, (lab.characters or ("none",), lab.action, lab.background))
                   for (film, i), lab in label_schema.read_labels("data/sample_variant_labels.jsonl").clips.items()
                   if film == "sample_slow"))
    at = -1
    for t in game.turns:
        later = [i for i, words in slow if i > at and words == (t.characters, t.motion, t.background)]
        assert later, f"{t.text!r} is no later sample_slow clip than clip {at}"
        at = later[0]


def test_paper_example_and_multi_character():
    t = instructions.parse_instruction("Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.")
    assert (t.characters, t.motion, t.background) == (("Qiqi",), "gently fly on broomstick", "night sky")
    t2 = instructions.parse_instruction("character: Qiqi and Jiji;  background: day town ; Motion:  run")
    assert t2.characters == ("Qiqi", "Jiji") and t2.motion == "run" and t2.background == "day town"


@pytest.mark.parametrize("line,needle", [
    ("Character: Qiqi; Motion: run.", "missing field(s) Background"),
    ("Character: Qiqi; Motion: run; Background: sky; Mood: happy", "unknown field 'Mood'"),
    ("Character: Qiqi; Motion: ; Background: sky", "field 'Motion' is empty"),
    ("Character: Qiqi; Motion: run; Motion: walk; Background: sky", "appears twice"),
    ("Qiqi runs in the sky", "is not a 'Key: value' field"),
])
def test_bad_lines_name_file_line_and_fix(tmp_path, line, needle):
    path = _write(tmp_path, "g.txt", "# comment\n\nCharacter: A; Motion: walk; Background: day.\n" + line + "\n")
    with pytest.raises(instructions.GameScriptError) as e:
        script.load_script(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:4: ")
    assert needle in msg
    assert "Fix:" in msg


def test_empty_and_non_utf8_files(tmp_path):
    empty = _write(tmp_path, "empty.txt", "# only a comment\n\n")
    with pytest.raises(instructions.GameScriptError, match="has no instructions"):
        script.load_script(empty)
    text = "Character: A; Motion: walk; Background: day.\nCharacter: Ren\xe9e"
    bad = _write(tmp_path, "latin1.txt", text.encode("latin-1"), "wb")
    with pytest.raises(instructions.GameScriptError,
                       match=r"latin1\.txt:2: not valid UTF-8 .*Fix: save the file as UTF-8"):
        script.load_script(bad)
    with pytest.raises(instructions.GameScriptError, match="file not found"):
        script.load_script(str(tmp_path / "missing.txt"))


def test_jsonl_good_and_bad(tmp_path):
    games = script.load_jsonl("data/games/demo.jsonl")
    assert [g.game_id for g in games] == ["bunny-morning", "bunny-chase"]
    assert games[0].seed == 1 and len(games[1].turns) == 2
    assert games[1].turns[0].motion == "quickly chase a butterfly"

    good = {"game_id": "g1", "turns": ["Character: A; Motion: walk; Background: day."]}
    cases = [
        ({**good, "extra": 1}, "unknown key(s) ['extra']"),
        ({"turns": good["turns"]}, "missing key 'game_id'"),
        ({**good, "turns": []}, "'turns' must be a non-empty list"),
        ({**good, "seed": "x"}, "'seed' must be an integer"),
        ({**good, "turns": [{"character": "A", "motion": "walk"}]}, "missing field(s) Background"),
    ]
    for obj, needle in cases:
        path = _write(tmp_path, "b.jsonl", json.dumps(good | {"game_id": "g0"}) + "\n" + json.dumps(obj) + "\n")
        with pytest.raises(instructions.GameScriptError) as e:
            script.load_jsonl(path)
        assert f"b.jsonl:2" in str(e.value) and needle in str(e.value), (needle, str(e.value))
    dup = _write(tmp_path, "d.jsonl", json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(instructions.GameScriptError, match="already used on line 1"):
        script.load_jsonl(dup)
    broken = _write(tmp_path, "x.jsonl", '{"game_id": "g1", "turns": [\n')
    with pytest.raises(instructions.GameScriptError, match=r"x\.jsonl:1: invalid JSON"):
        script.load_jsonl(broken)


def test_utf8_bom_accepted_in_text_and_jsonl(tmp_path):
    """Windows editors start UTF-8 files with a BOM; it is not part of the first field name."""
    line = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
    txt = _write(tmp_path, "bom.txt", b"\xef\xbb\xbf" + (line + "\r\n" + line + "\r\n").encode(), mode="wb")
    game = script.load_script(txt)
    assert len(game.turns) == 2 and game.turns[0].text == line and game.turns[0].where == f"{txt}:1"
    jl = _write(tmp_path, "bom.jsonl", b"\xef\xbb\xbf" + json.dumps({"game_id": "g", "turns": [line]}).encode()
                + b"\n", mode="wb")
    (g,) = script.load_jsonl(jl)
    assert g.turns[0].text == line and g.turns[0].where == f"{jl}:1 turn 0"
    assert instructions.parse_instruction("\ufeff" + line).text == line


@pytest.mark.parametrize("gid", ["..", ".", "a/b", "a\\b", "/abs", " x", ""])
def test_jsonl_game_ids_are_plain_folder_names(tmp_path, gid):
    path = _write(tmp_path, "ids.jsonl", json.dumps({"game_id": gid, "turns": ["Character: A; Motion: m; "
                                                                                "Background: b."]}) + "\n")
    with pytest.raises(instructions.GameScriptError, match=r"ids\.jsonl:1: game_id must be a plain folder name"):
        script.load_jsonl(path)
