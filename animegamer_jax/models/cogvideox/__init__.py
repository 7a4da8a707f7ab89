"""The CogVideoX family: the video decoder's DiT, its adapters, the 3-D causal VAE and the preview decoder."""
