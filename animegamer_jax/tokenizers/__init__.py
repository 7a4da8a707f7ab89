"""The two tokenizers: the MLLM's (Mistral sentencepiece + the AnimeGamer tokens) and T5's."""
