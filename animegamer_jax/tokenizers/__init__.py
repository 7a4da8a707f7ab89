"""The two tokenizers: ``mllm_tokenizer`` (Mistral's sentencepiece + the AnimeGamer tokens, the state
grammar) and ``t5_tokenizer`` (the T5 encoder's action text)."""
