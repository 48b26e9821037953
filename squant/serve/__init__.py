"""`squant serve`: HTTP on squant's engine (squant.engine), optional extra squant[serve].

listen (where the server listens), app (the routes: TEI, OpenAI, metrics), front_door and
header_deadline (bounds on what a client may send), fast_path, error_body, server (uvicorn),
ray_app (the same app as Ray Serve replicas)."""
