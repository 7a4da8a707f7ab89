"""The browser front end of the game (``python -m animegamer_jax.commands.web``, animegamer_jax/commands/web.py: flags,
building the server, serving it with uvicorn).

  server.py   GameServer: browser sessions, the turn queue and the worker around one GameEngine
  app.py      the Starlette routes (page, JSON API, NDJSON turn stream, game files, zip download)
  static/     the page: index.html, app.js, app.css (gallery.css comes from game/)
"""
