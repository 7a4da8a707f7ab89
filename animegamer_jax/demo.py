"""The README's main command (``make demo``) until game generation lands.

Runs the most complete path that exists today: loads ``configs/tiny.py``, builds the device mesh,
parses the game script and builds each turn's MLLM token layout (architecture.md §1.3) with the
real tokenizer, printing what the game engine will consume.

Usage: ``python -m animegamer_jax.demo data/games/bunny.txt [--config configs/tiny.py]``
"""

from __future__ import annotations

import argparse
import sys

import jax

from animegamer_jax import parallel
from animegamer_jax.config import load_config
from animegamer_jax.game.script import GameScriptError, load_games
from animegamer_jax.tokenizer import BOS_ID, ML_ID, TURN_ID, get_tokenizer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script", help="game script (.txt, one instruction a line) or games (.jsonl)")
    ap.add_argument("--config", default="configs/tiny.py")
    args = ap.parse_args(argv)
    config = load_config(args.config)
    try:
        games = load_games(args.script)
    except GameScriptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mesh = parallel.mesh_from_config(config)
    tok = get_tokenizer()
    nq = config.rep.num_text_tokens + config.rep.num_image_tokens
    print(f"config {config.name}: mesh {dict(mesh.shape)} on {jax.device_count()} {jax.default_backend()} device(s)")
    for game in games:
        print(f"game {game.game_id!r}: {len(game.turns)} turns")
        for k, turn in enumerate(game.turns):
            ids = [BOS_ID, TURN_ID, *tok.encode_plain(turn.text), *tok.video_block_ids(nq), ML_ID]
            print(f"  turn {k}: {turn.text}\n          MLLM current-turn layout: {len(ids)} ids "
                  f"({nq} query tokens), ends with <ML>={ids[-1]}")
    print("game generation (MLLM -> DiT -> VAE -> writer) is not in this build yet: see the README status.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
