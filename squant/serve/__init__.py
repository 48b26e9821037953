"""`squant serve`: an encoder server on squant's engine (optional extra: squant[serve])."""
