"""`posttrain serve`: the in-process rollout engine behind an OpenAI-compatible HTTP API.

`app.create_app` wraps a `posttrain.rollout.TorchEngine` in a Starlette app (run with uvicorn);
`batcher.EngineWorker` is the one thread that touches the engine and batches concurrent requests;
`protocol` parses and validates requests and writes responses; `weights` reads model folders and
their checksums; `serve_cli` is the command. Nothing in the package imports this one.
"""
