"""Game generation: the turn engine playing an ``inference`` TurnModel, scripts, runs, and the game folder (game/folder/)."""
