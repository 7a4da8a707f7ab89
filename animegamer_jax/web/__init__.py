"""The browser front end of the game: the game server and its Starlette app, the page (``static/``)."""
