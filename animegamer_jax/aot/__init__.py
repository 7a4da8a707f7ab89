"""Ahead-of-time compiles of the train steps and turn stages for chips this host lacks ("will it fit?")."""
