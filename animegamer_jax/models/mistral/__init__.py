"""The MLLM family: Mistral-7B and the AnimeGamer MLLM that wraps it (docs/mllm.md)."""
