"""Game generation: the turn engine playing an ``inference`` TurnModel, scripts, runs, saves and writers."""
