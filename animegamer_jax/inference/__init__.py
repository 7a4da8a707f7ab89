"""One turn's computations, which play, training's samples, eval, aot and ``check-release`` run."""
